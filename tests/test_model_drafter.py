"""A draft model as the drafter (tokenswift/draft/model_drafter.py): TokenSwift with a smaller random model of
stories260k's vocabulary drafting writes plain decoding's tokens (float64, several samplers, a chain and a tree,
n-grams, the adaptive batch, context shifts with Memory and Author's Note, a resume); the target drafting for
itself has nearly every guess accepted, also across shifts (the draft cache holds what the target's holds); a
draft model whose vocabulary is not the target's is refused by name, on the command line, by the worker and in the
Model tab."""

from __future__ import annotations

import json

import pytest
from speed import AR, speed
from test_context_shift import MEMORY, NARROW, NOTE, first_difference
from test_exactness import PROMPT, SAMPLERS
from tiny_models import hf_model, save_checkpoint

from storage import open_store
from storage.records import ModelSpec, Owner
from tokenswift.cli.main import main
from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.draft.model_drafter import ModelDrafter, attach_draft_model
from tokenswift.settings import Settings, SettingsError, Speculation
from tokenswift.text.context_window import pinned_ids
from ui.model.model import check_spec
from worker.holder import ModelHolder, ModelUnavailable

N = 300


@pytest.fixture(scope="module")
def tiny_dir(stories_path, tmp_path_factory):
    """A random 2-layer Llama (64 wide, 2 KV heads) with stories260k's tokenizer: smaller than the 5-layer target."""
    return save_checkpoint(hf_model("llama-gqa-tied", seed=1), tmp_path_factory.mktemp("draft") / "tiny", stories_path)


@pytest.fixture(scope="module")
def paired(stories64, tiny_dir):
    return attach_draft_model(stories64, str(tiny_dir))


@pytest.fixture(scope="module")
def itself(stories64, stories_path):
    """stories260k drafting for itself: a second copy of it as the draft model."""
    return attach_draft_model(stories64, str(stories_path))


# (sampler, n-gram k, tree, adaptive): a chain four deep, and a tree (two guesses at each of two depths).
CASES = [("greedy", 20, (1, 1, 1, 1, 1), False), ("minp-penalty", 0, (1, 1, 1, 1, 1), False),
         ("top-p", 20, (1, 2, 2), False), ("eta", 5, (1, 1, 1, 1, 1), True), ("minp-penalty", 20, (1, 2, 2), True)]


@pytest.mark.parametrize(("sampler", "k", "tree", "adaptive"), CASES)
def test_model_drafter_equals_ar(paired, ar_runs, stories64, sampler, k, tree, adaptive):
    prompt = paired.encode(PROMPT)
    s = Settings(max_new_tokens=N, seed=3, ignore_eos=True, **SAMPLERS[sampler])
    expected = ar_runs(stories64, s, prompt)
    ts = Speculation(ngram_topk=k, drafter="model", tree=tree, gamma=4)
    gen = Generator(paired, s, prompt, options=EngineOptions(adaptive=adaptive, speculation=ts))
    assert first_difference(gen.run(), expected) is None
    assert gen.metrics().steps < N  # candidates were accepted: this was speculative decoding


def test_the_target_drafting_for_itself_has_nearly_every_guess_accepted(itself):
    """Its guesses are the target's own tokens where its cache holds the committed text at the right slots and the
    guesses are ranked with the noise their positions are sampled with; one slot off and few would be accepted."""
    prompt = itself.encode(PROMPT)
    for sampler in ("greedy", "minp-penalty"):
        s = Settings(max_new_tokens=N, seed=4, ignore_eos=True, **SAMPLERS[sampler])
        # drafter auto: the draft model, where one is loaded
        gen = Generator(itself, s, prompt, options=speed(ngram_topk=0, tree=(1, 1, 1, 1, 1), gamma=4))
        assert first_difference(gen.run(), Generator(itself, s, prompt, options=AR).run()) is None
        per_step = gen.metrics().to_dict()["tokens_per_step"]
        assert per_step > 0.97 * 5, (sampler, per_step)  # the root and 4 guesses in every iteration


def test_auto_drafts_with_the_draft_model_where_one_is_loaded(paired, stories64):
    ids = paired.encode(PROMPT)
    engine = Engine(paired, Settings(max_new_tokens=8, ignore_eos=True), ids, len(ids))
    engine.start()
    assert type(engine.drafter) is ModelDrafter
    with pytest.raises(SettingsError, match="drafter: no draft model is loaded"):
        Generator(stories64, Settings(), ids, options=speed(drafter="model"))


@pytest.mark.parametrize("draft", ["paired", "itself"])
def test_across_shifts_with_memory_and_a_resume(request, ar_runs, stories64, draft):
    """Every shift rebuilds the target's cache from a new window, and start() the draft cache with it: drafting for
    itself, the target still has nearly every guess accepted across more than five shifts."""
    lm = request.getfixturevalue(draft)
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    s = Settings(max_new_tokens=360, seed=5, ignore_eos=True, context_window=NARROW, note_depth=100,
                 **SAMPLERS["minp-penalty"])
    ts = speed(drafter="model", ngram_topk=0 if draft == "itself" else 20)
    expected = ar_runs(stories64, s, prompt, pinned)
    gen = Generator(lm, s, prompt, options=ts, pinned=pinned)
    assert first_difference(gen.run(), expected) is None
    assert gen.metrics().shifts >= 5
    if draft == "itself":  # (the iteration before each shift drafts no further than its boundary)
        assert gen.metrics().to_dict()["tokens_per_step"] > 0.9 * len(ts.speculation.tree)
    resumed = Generator(lm, s, prompt, generated_ids=expected[:210], options=ts, pinned=pinned)
    assert first_difference(resumed.run(), expected) is None


def test_a_draft_model_of_another_vocabulary_is_refused_by_name(stories64, stories_path, tmp_path):
    smaller = save_checkpoint(hf_model("llama-gqa-tied", vocab_size=256), tmp_path / "smaller", stories_path)
    with pytest.raises(SettingsError, match="draft_model: smaller cannot draft for .*: its vocabulary has 256 "
                                            "tokens, the target's 512"):
        attach_draft_model(stories64, str(smaller))
    swapped = save_checkpoint(hf_model("llama-gqa-tied"), tmp_path / "swapped", stories_path)
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]  # two ordinary pieces trade ids
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    (swapped / "tokenizer.model").unlink()
    with pytest.raises(SettingsError, match="draft_model: swapped cannot draft .*: its tokenizer's tokens differ"):
        attach_draft_model(stories64, str(swapped))
    with pytest.raises(SettingsError, match="draft_model: cannot load"):
        attach_draft_model(stories64, str(tmp_path / "missing"))


def test_a_draft_model_with_a_shorter_context_than_the_window_is_refused(paired, stories64):
    ids = paired.encode(PROMPT)
    Generator(paired, Settings(max_new_tokens=400), ids)  # the tiny model's 512 positions hold this window
    with pytest.raises(SettingsError, match="draft_model: the draft model's context of 512 tokens is shorter"):
        Generator(paired, Settings(max_new_tokens=600), ids)
    Generator(paired, Settings(max_new_tokens=600), ids, options=speed(drafter="fused"))  # another needs no such thing


def test_cli_generates_with_a_draft_model_and_refuses_another_vocabulary(stories_path, tiny_dir, tmp_path, capsys):
    out = tmp_path / "out.json"
    code = main(["generate", "--model", str(stories_path), "--draft-model", str(tiny_dir), "--drafter", "model",
                 "--dtype", "float64", "--prompt", PROMPT, "--max-new-tokens", "40", "--ignore-eos", "--no-ban-eos",
                 "--seed", "2", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert len(result["tokens"]) == 40 and result["settings"]["drafter"] == "model"
    reference = tmp_path / "ar.json"
    assert main(["generate", "--model", str(stories_path), "--mode", "ar", "--dtype", "float64", "--prompt", PROMPT,
                 "--max-new-tokens", "40", "--ignore-eos", "--no-ban-eos", "--seed", "2", "--json",
                 str(reference)]) == 0
    assert json.loads(reference.read_text())["tokens"] == result["tokens"]
    smaller = save_checkpoint(hf_model("llama-gqa-tied", vocab_size=256), tmp_path / "smaller", stories_path)
    capsys.readouterr()
    code = main(["generate", "--model", str(stories_path), "--draft-model", str(smaller), "--prompt", PROMPT,
                 "--max-new-tokens", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: draft_model: smaller cannot draft for "
                                 f"{stories_path}: its vocabulary has 256 tokens, the target's 512"]
    code = main(["generate", "--model", str(stories_path), "--drafter", "model", "--prompt", PROMPT,
                 "--max-new-tokens", "5"])
    assert code == 2 and "drafter: no draft model is loaded" in capsys.readouterr().err


def test_bench_drafts_with_a_draft_model(stories_path, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "--model", str(stories_path), "--draft-model", str(stories_path), "--dtype", "float64",
                 "--prompt", PROMPT, "--max-new-tokens", "64", "--warmup-tokens", "4", "--slice-tokens", "32",
                 "--window-tokens", "64", "--no-adaptive", "--temperature", "0", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["identical"] and data["settings"]["drafter"] == "auto"
    assert "no draft heads" not in capsys.readouterr().err  # the draft model drafts: no such note


def test_the_worker_loads_the_chosen_draft_model_and_refuses_another_vocabulary(stories_path, tiny_dir, tmp_path):
    """The Model tab's choice (the store's desired model) names the draft model; the worker loads it beside the
    model and says so in the model notice. Another vocabulary is refused in the tab before it is saved, and by the
    worker (a GGUF file's tokenizer is read only there)."""
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    spec, _ = check_spec(str(stories_path), "", "cpu", "float64", str(tiny_dir))
    store.set_desired_model(spec)
    assert store.desired_model() == spec and spec.draft_model == str(tiny_dir)
    store.register_worker(Owner.here("w"))
    holder = ModelHolder(store, "w", threads=1)
    assert holder.ensure(store.desired_model()).draft_model is not None
    assert "a draft model (tiny, " in store.get_worker("w").heads_info
    holder.ensure(ModelSpec(str(stories_path), None, "cpu", "float64"))
    assert store.get_worker("w").heads_info == "n-grams only (train a draft layer for it: `tokenswift draft-data`, " \
                                               "then `train-draft`)"
    smaller = save_checkpoint(hf_model("llama-gqa-tied", vocab_size=256), tmp_path / "smaller", stories_path)
    with pytest.raises(ValueError, match="Draft model: .*smaller' cannot draft for .*: its vocabulary has 256"):
        check_spec(str(stories_path), "", "cpu", "float64", str(smaller))
    with pytest.raises(ModelUnavailable, match="draft_model: smaller cannot draft for .*: its vocabulary has 256"):
        holder.ensure(ModelSpec(str(stories_path), None, "cpu", "float64", str(smaller)))
    store.close()
