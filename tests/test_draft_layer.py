"""The draft layer (draft_layer.py, layer_drafter.py): trained here on stories260k's own text by the real
commands (draft-data, train-draft), then TokenSwift with it emits exactly the tokens of plain decoding in
float64 with every sampler, n-grams, the adaptive batch, context shifts with Memory and Author's Note, and a
resume, and so does a layer widened to EAGLE-3's fused features and trained on; training killed mid-run resumes
to the very weights of an uninterrupted run; bad files are refused with the file named."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from speed import AR, speed
from test_context_shift import MEMORY, NARROW, NOTE, first_difference
from test_exactness import PROMPT, SAMPLERS

from tokenswift.cli.main import main
from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.draft.choice import drafter_for
from tokenswift.draft.fused_drafter import FusedDrafter
from tokenswift.draft.layer_drafter import DRAFT_WINDOW, LayerDrafter, draft_window
from tokenswift.model.draft_layer import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    DraftLayerError,
    load_layer,
    save_layer,
    with_features,
)
from tokenswift.model.fastpath import FastOptions
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import causal_mask
from tokenswift.sampling.sampler import Sampler, penalty_mask
from tokenswift.sampling.windows import last_ids
from tokenswift.settings import Settings, SettingsError, Speculation
from tokenswift.text.context_window import pinned_ids
from tokenswift.train.draft_data import TeacherStore, feature_layers
from tokenswift.train.draft_loss import Penalty, penalised_loss, penalised_targets, unrolled_states, window_mask
from tokenswift.train.train_draft import all_rows

REPO = Path(__file__).resolve().parents[1]
N = 400
TRAIN = ["--seq-len", "128", "--batch", "4", "--draft-vocab", "256", "--warmup", "5", "--lr", "1e-2",
         "--eval-every", "8192", "--unroll", "2", "--threads", "1", "--no-progress"]


def teacher(stories_path: Path, text: Path, out: Path, seed: int, features: str = "") -> None:
    assert main(["draft-data", "--model", str(stories_path), "--data", str(text), "--out", str(out),
                 "--tokens", "100000", "--seq-len", "128", "--shard-seqs", "4", "--dtype", "float32",
                 "--seed", str(seed), "--threads", "1", "--no-progress", "--features", features]) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory, stories_path, stories32):
    """A draft layer trained on 3,000 tokens that stories260k wrote itself (what it will be asked to draft)."""
    root = tmp_path_factory.mktemp("draft")
    prompt = stories32.encode("Once upon a time")
    text = []
    for seed in range(3):
        ids = Generator(stories32, Settings(max_new_tokens=1000, seed=seed, temperature=1.0, min_p=0.05,
                                            ignore_eos=True), prompt, options=AR).run()
        text.append(stories32.decode(ids))
    (root / "text.txt").write_text("\n\n".join(text))
    teacher(stories_path, root / "text.txt", root / "teacher", 0)
    teacher(stories_path, root / "text.txt", root / "held", 1)
    args = ["train-draft", "--model", str(stories_path), "--teacher", str(root / "teacher"), "--eval-teacher",
            str(root / "held"), "--out", str(root / "layer"), "--state", str(root / "state.pt"), "--tokens", "32768"]
    assert main(args + TRAIN) == 0
    return root


@pytest.fixture(scope="module")
def lm64(stories64, trained):
    layer = load_layer(trained / "layer", stories64.config, stories64.model.head_weight, "cpu", torch.float64)
    return dataclasses.replace(stories64, draft_layer=layer)


@pytest.fixture(scope="module")
def fused(trained, stories_path):
    """The trained layer widened to read stories260k's layers 2 and 4 beside its last (EAGLE-3's fused features):
    train-draft goes on from its weights over teacher data that stores those layers."""
    teacher(stories_path, trained / "text.txt", trained / "teacher-2-4", 0, "2,4")
    teacher(stories_path, trained / "text.txt", trained / "held-2-4", 1, "2,4")
    return go_on_training(stories_path, trained, "-2-4", trained / "fused", trained / "fused.pt")


def go_on_training(stories_path: Path, trained: Path, data: str, out: Path, state: Path) -> Path:
    """train-draft to 40,960 tokens from a copy of the trained layer's files in `out` (no state file), on the
    teacher data `trained / ("teacher" + data)` (held-out: "held" + data)."""
    out.mkdir()
    for name in (CONFIG_NAME, WEIGHTS_NAME, "curve.json"):
        (out / name).write_bytes((trained / "layer" / name).read_bytes())
    args = ["train-draft", "--model", str(stories_path), "--teacher", str(trained / f"teacher{data}"),
            "--eval-teacher", str(trained / f"held{data}"), "--out", str(out), "--state", str(state),
            "--tokens", "40960"]
    assert main(args + TRAIN) == 0
    return out


@pytest.fixture(scope="module")
def lm64_fused(stories64, fused):
    layer = load_layer(fused, stories64.config, stories64.model.head_weight, "cpu", torch.float64)
    return dataclasses.replace(stories64, draft_layer=layer)


def test_training_learns_and_writes_its_curve(trained):
    curve = json.loads((trained / "layer" / "curve.json").read_text())
    assert [p["tokens"] for p in curve] == [0, 8192, 16384, 24576, 32768]
    assert curve[-1]["greedy"][0] > curve[0]["greedy"][0] + 0.2  # it learned what the model writes
    assert curve[-1]["tokens_per_step_greedy"] > 1.5
    # and the model's choices under the app's repetition penalty, which it was also trained on
    assert curve[-1]["greedy_penalised"][0] > curve[0]["greedy_penalised"][0] + 0.2
    record = json.loads((trained / "layer" / CONFIG_NAME).read_text())["record"]
    assert record["tokens_seen"] == 32768
    assert (record["train"]["penalty"], record["train"]["penalty_window"]) == (1.1, 256)


def test_window_masks_cover_the_last_w_tokens_of_the_draft_vocabulary():
    torch.manual_seed(0)
    tokens = torch.randint(0, 30, (2, 40))
    to_draft = torch.full((30,), -1)
    to_draft[::2] = torch.arange(15)  # the even ids are the draft vocabulary
    mask = window_mask(tokens, to_draft, 7)
    for b in range(2):
        for i in range(40):
            seen = {int(to_draft[t]) for t in tokens[b, max(0, i - 6):i + 1] if to_draft[t] >= 0}
            assert set(mask[b, i].nonzero().flatten().tolist()) == seen


def test_a_rows_penalty_window_is_the_one_the_engine_samples_its_token_with():
    """Row j of the unrolled states drafts the token at j+2: the sampler penalises it over the W tokens before it."""
    torch.manual_seed(1)
    vocab, t, w = 16, 30, 6
    batch = {"tokens": torch.randint(0, vocab, (1, t)), "hidden": torch.randn(1, t, 4)}
    _, mask = penalised_targets(batch, torch.nn.Identity(), torch.randn(vocab, 4), torch.arange(vocab), Penalty(1.2, w))
    for j in range(t - 1):
        window = last_ids(batch["tokens"][0], j + 2, torch.arange(w))[None]
        assert torch.equal(mask[0, j], penalty_mask(window, vocab)[0])


def test_the_penalised_score_is_least_where_the_draft_is_the_model():
    """penalised_loss penalises the draft as penalised_targets penalise the model: at the model's own logits its
    gradient vanishes, and a draft off the model's logits scores worse."""
    torch.manual_seed(0)
    dim, vocab, t = 8, 12, 20
    head_rows, norm = torch.randn(vocab, dim), torch.nn.Identity()
    batch = {"tokens": torch.randint(0, vocab, (1, t)), "hidden": torch.randn(1, t, dim) * 3}
    to_draft = torch.arange(vocab)
    probs, mask = penalised_targets(batch, norm, head_rows, to_draft, Penalty(1.5, 5))
    assert mask.any() and not mask.all()
    model = (batch["hidden"][:, 1:] @ head_rows.T).requires_grad_(True)
    best = penalised_loss(model, probs, mask, 1.5, 0)
    best.backward()
    assert model.grad.abs().max() < 1e-6
    assert penalised_loss(model.detach() + torch.randn(model.shape), probs, mask, 1.5, 0) > best + 0.01


CASES = [("greedy", 0, False), ("greedy", 20, True), ("minp-penalty", 20, False), ("minp-penalty", 0, True),
         ("top-p", 20, True), ("eta", 5, False)]


@pytest.fixture(params=["last layer", "fused features"])
def drafting(request):
    """stories64 with the trained layer, and with it widened to fused features (the `fused` fixture)."""
    return request.getfixturevalue("lm64" if request.param == "last layer" else "lm64_fused")


@pytest.mark.parametrize(("sampler", "k", "adaptive"), CASES)
def test_layer_drafter_equals_ar(drafting, stories64, ar_runs, sampler, k, adaptive):
    prompt = drafting.encode(PROMPT)
    plain = Settings(max_new_tokens=N, seed=3, ignore_eos=True, **SAMPLERS[sampler])
    # Plain decoding of the model the layer drafts for: one run per sampler serves both layers and every k.
    expected = ar_runs(stories64, plain, prompt)
    gen = Generator(drafting, plain, prompt,
                    options=EngineOptions(adaptive=adaptive, speculation=Speculation(ngram_topk=k, drafter="layer")))
    assert first_difference(gen.run(), expected) is None
    if not adaptive:  # (the adaptive policy may prefer plain steps on this tiny model)
        assert gen.metrics().accepted > N // 4  # the chain drafts what the model writes


def test_layer_drafter_across_shifts_with_memory_and_resume(drafting):
    prompt, pinned = drafting.encode(PROMPT), pinned_ids(drafting, MEMORY, NOTE)
    s = Settings(max_new_tokens=360, seed=5, ignore_eos=True, context_window=NARROW, note_depth=100,
                 **SAMPLERS["minp-penalty"])
    expected = Generator(drafting, s, prompt, options=AR, pinned=pinned).run()
    gen = Generator(drafting, s, prompt, options=speed(drafter="layer"), pinned=pinned)
    assert first_difference(gen.run(), expected) is None
    assert gen.metrics().shifts >= 5 and gen.metrics().accepted > 60
    resumed = Generator(drafting, s, prompt, generated_ids=expected[:210], options=speed(drafter="layer"),
                        pinned=pinned)
    assert first_difference(resumed.run(), expected) is None


def test_a_window_of_states_then_plain_steps_drafts_from_the_last_window(lm64):
    """After a prefill (a context shift), the adaptive policy's plain steps add rows to the window of states the
    drafter was given; its next draft runs the last `window` of them only (it used to attend over more rows
    than the window and fail). However long the window the layer was trained with, a draft reads DRAFT_WINDOW
    states: the catch-up after plain steps is that many rows at most."""
    s = Settings(max_new_tokens=8, ignore_eos=True)
    layer = copy.copy(lm64.draft_layer)
    layer.window = 3 * DRAFT_WINDOW  # trained on longer sequences than a draft reads
    lm = dataclasses.replace(lm64, draft_layer=layer)
    w, dim = draft_window(layer), lm.config.dim
    assert w == DRAFT_WINDOW
    drafter = LayerDrafter(lm, Speculation(drafter="layer"), Sampler(s, lm.config.vocab_size, "cpu"), 4 * w)
    drafter.start(None, 0, [])
    drafter.observe(torch.randn(w, dim, dtype=torch.float64), [1 + i % 100 for i in range(w)], 0)
    for i in range(5):
        drafter.observe(torch.randn(1, dim, dtype=torch.float64), [7], w + i)
    assert drafter.pending_count == w and drafter.valid_from == 5
    assert len(drafter.propose(7, w + 5, None, 2, 0)) == 2


def test_catching_up_on_plain_steps_is_timed_as_the_switch(lm64):
    """The rows of plain steps are run at the next draft: that is the switch from plain steps (switch_s, kept apart
    from the shape's time by the engine), where a drafting iteration's own one to depth + 1 rows are not."""
    s = Settings(max_new_tokens=8, ignore_eos=True)
    dim = lm64.config.dim
    chain = Speculation(drafter="layer", tree=(1, 1, 1))
    drafter = LayerDrafter(lm64, chain, Sampler(s, lm64.config.vocab_size, "cpu"), 256)
    drafter.start(None, 0, [])
    drafter.observe(torch.randn(3, dim, dtype=torch.float64), [4, 5, 6], 0)  # an iteration's accepted path
    drafter.propose(6, 3, None, 2, 0)
    assert drafter.switch_s == 0.0
    for i in range(12):  # plain steps
        drafter.observe(torch.randn(1, dim, dtype=torch.float64), [7 + i], 3 + i)
    drafter.propose(18, 15, None, 2, 0)
    assert drafter.switch_s > 0.0
    drafter.observe(torch.randn(2, dim, dtype=torch.float64), [20, 21], 15)
    drafter.propose(21, 17, None, 2, 0)
    assert drafter.switch_s == 0.0


def test_in_float32_the_layer_drafts_by_the_c_kernels_what_torch_drafts(stories32, trained):
    """A float32 CPU model's drafter runs its layer through the model's C kernels (native_rows): the same text as
    plain decoding, and the drafts torch's operators make (the same tokens accepted, to a rounding tie or two)."""
    layer = load_layer(trained / "layer", stories32.config, stories32.model.head_weight, "cpu", torch.float32)
    lm = dataclasses.replace(stories32, draft_layer=layer)
    s = Settings(max_new_tokens=300, seed=3, ignore_eos=True, **SAMPLERS["greedy"])
    layer = speed(drafter="layer")
    prompt = lm.encode(PROMPT)
    assert LayerDrafter(lm, layer.speculation, None, 64).block is not None
    expected = Generator(lm, s, prompt, options=AR).run()
    with_kernels = Generator(lm, s, prompt, options=layer)
    assert first_difference(with_kernels.run(), expected) is None
    kernels, lm.model.native = lm.model.native, None
    try:
        assert LayerDrafter(lm, layer.speculation, None, 64).block is None
        without = Generator(lm, s, prompt, options=layer)
        assert first_difference(without.run(), expected) is None
    finally:
        lm.model.native = kernels
    assert abs(with_kernels.metrics().accepted - without.metrics().accepted) <= 3
    assert with_kernels.metrics().accepted > 300 // 4


def test_auto_drafts_with_the_layer_on_a_cpu_where_the_model_has_one(lm64, stories64):
    """The default drafter: the draft layer where the model has one (on a CPU), else the heads (fused)."""
    assert Speculation().drafter == "auto"
    for lm, drafter in ((lm64, LayerDrafter), (stories64, FusedDrafter)):
        ids = lm.encode(PROMPT)
        engine = Engine(lm, Settings(max_new_tokens=8, ignore_eos=True), ids, len(ids))
        engine.start()
        assert type(engine.drafter) is drafter
    on_gpu = SimpleNamespace(draft_layer=lm64.draft_layer, draft_model=None, device=torch.device("cuda"))
    assert drafter_for(on_gpu, Speculation()) == "fused"  # a GPU verifies a wide tree nearly free
    assert drafter_for(lm64, Speculation(drafter="paper")) == "paper"


def test_a_model_without_a_draft_layer_is_refused_by_name(stories64):
    with pytest.raises(SettingsError, match="drafter: this model has no draft layer"):
        Generator(stories64, Settings(), stories64.encode(PROMPT), options=speed(drafter="layer"))


def state_tokens(path: Path) -> int:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)["tokens"]
    except Exception:  # noqa: BLE001 - mid-write by the other process: not there yet
        return 0


def test_training_killed_midway_resumes_to_the_same_weights(trained, stories_path, tmp_path):
    args = ["train-draft", "--model", str(stories_path), "--teacher", str(trained / "teacher"),
            "--eval-teacher", str(trained / "held"), "--tokens", "8192", "--save-every-s", "0", *TRAIN]
    whole = [*args, "--out", str(tmp_path / "a"), "--state", str(tmp_path / "a.pt")]
    assert main(whole) == 0
    piece = [*args, "--out", str(tmp_path / "b"), "--state", str(tmp_path / "b.pt")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tokenswift", *piece], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while state_tokens(tmp_path / "b.pt") < 2048 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 0 < state_tokens(tmp_path / "b.pt") < 8192  # it really stopped midway
    assert main(piece) == 0
    a = torch.load(tmp_path / "a.pt", weights_only=False)
    b = torch.load(tmp_path / "b.pt", weights_only=False)
    assert a["tokens"] == b["tokens"] == 8192 and a["position"] == b["position"]
    for name, tensor in a["layer"].items():
        assert torch.equal(tensor, b["layer"][name]), name
    assert json.loads((tmp_path / "a" / "curve.json").read_text()) == json.loads(
        (tmp_path / "b" / "curve.json").read_text())


def test_training_without_its_state_goes_on_from_the_committed_weights(trained, stories_path, tmp_path):
    out = go_on_training(stories_path, trained, "", tmp_path / "layer", tmp_path / "fresh.pt")
    curve = json.loads((out / "curve.json").read_text())
    assert [p["tokens"] for p in curve][-2:] == [32768, 40960]


def test_bad_draft_files_are_refused_with_the_file_named(trained, stories64, tmp_path):
    cfg, head = stories64.config, stories64.model.head_weight
    with pytest.raises(DraftLayerError, match="no draft layer in"):
        load_layer(tmp_path / "missing", cfg, head, "cpu", torch.float64)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / CONFIG_NAME).write_text((trained / "layer" / CONFIG_NAME).read_text())
    (broken / WEIGHTS_NAME).write_bytes((trained / "layer" / WEIGHTS_NAME).read_bytes()[:1000])
    with pytest.raises(DraftLayerError, match=f"corrupt draft layer file in {broken}"):
        load_layer(broken, cfg, head, "cpu", torch.float64)
    other = dataclasses.replace(cfg, vocab_size=cfg.vocab_size + 1)
    with pytest.raises(DraftLayerError, match="draft layer for another model .vocab_size"):
        load_layer(trained / "layer", other, head, "cpu", torch.float64)
    with pytest.raises(DraftLayerError, match="trained for another model"):
        load_layer(trained / "layer", cfg, torch.randn_like(head), "cpu", torch.float64)
    layer = load_layer(trained / "layer", cfg, head, "cpu", torch.float32)
    layer.vocab[0] = cfg.vocab_size + 5
    save_layer(layer, tmp_path / "vocab")
    with pytest.raises(DraftLayerError, match="draft vocabulary must be token ids below"):
        load_layer(tmp_path / "vocab", cfg, head, "cpu", torch.float64)


def model_copy(stories_path: Path, root: Path) -> Path:
    """stories260k in a folder of its own, to put a draft layer beside it."""
    folder = root / "model"
    folder.mkdir()
    for item in stories_path.iterdir():
        if item.is_file():
            (folder / item.name).symlink_to(item)
    return folder


def test_a_draft_layer_beside_the_model_is_found_and_a_broken_one_falls_back(trained, stories_path, tmp_path):
    from tokenswift.model.loading import load_model
    from worker.holder import heads_info

    folder = model_copy(stories_path, tmp_path)
    (folder / "draft").mkdir()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        (folder / "draft" / name).write_bytes((trained / "layer" / name).read_bytes())
    lm = load_model(str(folder), dtype="float64")
    assert lm.draft_layer is not None and lm.draft_error is None
    assert "a draft layer (256-token draft vocabulary)" in heads_info(lm, type("Spec", (), {"heads": None})())
    (folder / "draft" / WEIGHTS_NAME).write_bytes(b"not a safetensors file")
    lm = load_model(str(folder), dtype="float64")  # the model still loads: drafts fall back to the heads
    assert lm.draft_layer is None and str(folder / "draft") in lm.draft_error
    assert "the draft layer is unusable" in heads_info(lm, type("Spec", (), {"heads": None})())


def test_cli_names_a_broken_draft_file_and_exits_2(trained, stories_path, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / CONFIG_NAME).write_text((trained / "layer" / CONFIG_NAME).read_text())
    (broken / WEIGHTS_NAME).write_bytes(b"\x00" * 10)
    code = main(["generate", "--model", str(stories_path), "--draft", str(broken), "--drafter", "layer",
                 "--prompt", PROMPT, "--max-new-tokens", "5"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: corrupt draft layer file in") and str(broken) in err[0]
    code = main(["generate", "--model", str(stories_path), "--draft", "none", "--drafter", "layer",
                 "--prompt", PROMPT, "--max-new-tokens", "5"])
    assert code == 2 and "drafter: this model has no draft layer" in capsys.readouterr().err


def test_a_layer_widened_to_fused_features_starts_as_it_was_and_trains_on(trained, fused, stories64):
    layer = load_layer(trained / "layer", stories64.config, stories64.model.head_weight, "cpu", torch.float64)
    wide = with_features(layer, (2, 4))
    batch = all_rows(TeacherStore(trained / "held-2-4"), 128)
    batch = {name: rows[:2].double() if rows.is_floating_point() else rows[:2] for name, rows in batch.items()}
    rope = (stories64.model.rope_cos, stories64.model.rope_sin)
    embed = stories64.model.model.embed_tokens
    for before, after in zip(unrolled_states(layer, embed, batch, rope, 2),
                             unrolled_states(wide, embed, batch, rope, 2), strict=True):
        assert torch.equal(before, after)  # it drafts as before: the other layers' part of feature_proj is zero
    assert json.loads((fused / CONFIG_NAME).read_text())["feature_layers"] == [2, 4]
    curve = json.loads((fused / "curve.json").read_text())
    assert [p["tokens"] for p in curve][-2:] == [32768, 40960]
    trained_on = load_layer(fused, stories64.config, stories64.model.head_weight, "cpu", torch.float64)
    assert trained_on.feature_proj.weight[:, :2 * stories64.config.dim].abs().max() > 0  # it learned from them


def test_the_layers_a_pass_keeps_are_those_layers_outputs_with_the_c_kernels_too(stories32):
    """The C kernels update a row's state in place, layer after layer: a kept layer output is a copy, the same as
    torch's operators compute (it was the last layer's state, on every CPU verify pass and plain step)."""
    model, cfg = stories32.model, stories32.config
    ids = torch.tensor(stories32.encode(PROMPT))
    outs = []
    for native in (model.native, None):
        kernels, model.native = model.native, native
        try:
            cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 64, cfg.head_dim, "cpu", torch.float32)
            pos = torch.arange(len(ids))
            outs.append(model(ids, pos, cache, 0, causal_mask(0, len(ids), pos, None, "cpu"), exact_rows=True,
                              keep_layers=(2, 4)))
        finally:
            model.native = kernels
    assert model.native is not None
    with_kernels, with_torch = outs
    for kept, reference in zip(with_kernels.layers, with_torch.layers, strict=True):
        assert torch.allclose(kept, reference, atol=1e-4)
        assert (kept - with_kernels.hidden).abs().max() > 0.1


def test_a_fused_run_resumes_from_its_state_and_refuses_other_layers(trained, fused, stories_path, tmp_path, capsys):
    out = tmp_path / "fused"
    out.mkdir()
    for name in (CONFIG_NAME, WEIGHTS_NAME, "curve.json"):
        (out / name).write_bytes((fused / name).read_bytes())
    (tmp_path / "fused.pt").write_bytes((trained / "fused.pt").read_bytes())
    args = ["train-draft", "--model", str(stories_path), "--teacher", str(trained / "teacher-2-4"),
            "--eval-teacher", str(trained / "held-2-4"), "--out", str(out), "--state", str(tmp_path / "fused.pt")]
    assert main([*args, "--last-layer-only", "--tokens", "45056", *TRAIN]) == 2
    assert "last-layer-only: the layer to go on with" in capsys.readouterr().err
    unlike = [*args[:5], "--eval-teacher", str(trained / "held"), *args[7:]]  # held-out rows without the layers
    assert main([*unlike, "--tokens", "45056", *TRAIN]) == 2
    assert "stores layers [], the teacher [2, 4]: extract both with the same --features" in capsys.readouterr().err
    assert main([*args, "--tokens", "45056", *TRAIN]) == 0
    saved = torch.load(tmp_path / "fused.pt", weights_only=False)
    assert saved["tokens"] == 45056 and saved["feature_layers"] == [2, 4]


@pytest.mark.parametrize("layers", [[4, 2], [2, 2], [0, 2], [2, 5]])
def test_a_draft_file_with_feature_layers_out_of_order_or_range_is_refused(fused, stories64, tmp_path, layers):
    (tmp_path / WEIGHTS_NAME).write_bytes((fused / WEIGHTS_NAME).read_bytes())
    config = json.loads((fused / CONFIG_NAME).read_text()) | {"feature_layers": layers}
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(DraftLayerError, match="feature_layers must be distinct ascending layer numbers in 1..4"):
        load_layer(tmp_path, stories64.config, stories64.model.head_weight, "cpu", torch.float64)


def test_draft_data_features_are_layer_numbers_below_the_last():
    assert feature_layers("15, 2,2", 30) == (2, 15) and feature_layers("", 30) == ()
    for text in ("0", "30", "-1"):
        with pytest.raises(ValueError, match=r"features: layer numbers must be in 1\.\.29"):
            feature_layers(text, 30)
    with pytest.raises(ValueError, match="features: '2,x' is not a comma-separated list"):
        feature_layers("2,x", 30)



def test_a_fused_feature_layer_is_refused_on_the_fast_path_by_name(lm64_fused):
    ids = lm64_fused.encode(PROMPT)
    with pytest.raises(ValueError, match=r"drafter: this draft layer reads layers \[2, 4\] besides the last"):
        Engine(lm64_fused, Settings(), ids, len(ids),
               EngineOptions(FastOptions(attention="sdpa"), speculation=Speculation(drafter="layer")))
