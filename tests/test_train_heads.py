"""Draft-head training (design §2): it learns, saved heads reload exactly, an interrupted run resumes to the
same heads, bad data fails clearly, and official TokenSwift heads import tensor for tensor.

All on stories260k (CPU, float32), trained on text the model wrote itself (TinyStories-like, which is
what its heads should draft), and evaluated on held-out text sampled with other seeds.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokenswift.model.heads import HeadsError, load_heads
from tokenswift.model.loading import read_state_dict
from tokenswift.train import eval_heads as ev
from tokenswift.train import head_config as hc
from tokenswift.train import head_model as hm
from tokenswift.train import import_heads as ih
from tokenswift.train import self_distill as sd
from tokenswift.train import train_heads as th
from tokenswift.train.data import DataError, load_sequences, opening_tokens, pack

QUICK = dict(seq_len=64, batch=8, warmup=5, lr=2e-2, min_lr=2e-3, progress=False)


@pytest.fixture(scope="module")
def trained(stories_path, stories32, tmp_path_factory):
    """One short self-distillation run: 4,000 generated tokens, 60 steps of 8 x 64 tokens."""
    out = tmp_path_factory.mktemp("heads")
    cfg = hc.TrainConfig(model=str(stories_path), out=str(out), steps=60, checkpoint_every=30,
                         distill=hc.DistillConfig(tokens=4000, sample_tokens=256), **QUICK)
    return cfg, th.train_heads(cfg, lm=stories32)


@pytest.fixture(scope="module")
def heldout(stories32, tmp_path_factory):
    docs = sd.self_distill(stories32, hc.DistillConfig(tokens=1200), [[1]], 300, seed=10_000, progress=False)
    path = tmp_path_factory.mktemp("heldout") / "heldout.jsonl"
    sd.write_distilled(path, docs, stories32)
    return path


def evaluate(stories_path, stories32, heads: str, data) -> dict:
    cfg = ev.EvalConfig(model=str(stories_path), heads=heads, data=(str(data),), seq_len=64, progress=False)
    return ev.eval_heads(cfg, lm=stories32)["rows"]


# -- learning, reload, record -------------------------------------------------------------------------


def test_training_beats_untrained_heads_on_heldout_text(trained, heldout, stories_path, stories32):
    cfg, _ = trained
    before = evaluate(stories_path, stories32, ev.UNTRAINED, heldout)
    after = evaluate(stories_path, stories32, cfg.out, heldout)
    assert before["base"] == after["base"]  # the frozen model is untouched
    for i in (1, 2, 3):
        b, a = before[f"head{i}"], after[f"head{i}"]
        assert a["loss"] < b["loss"] - 2.0, (i, b, a)
        assert a["top1"] > b["top1"] + 0.03 and a["top1"] > 2 * b["top1"], (i, b, a)
        assert a["top3"] > b["top3"], (i, b, a)


def test_untrained_heads_repeat_the_base_head(stories32):
    tokens = torch.tensor([stories32.encode("Once upon a time, there was a little dog named Max.")])
    hidden = hm.base_hidden(stories32, tokens)
    base = stories32.model.head(stories32.model.model.norm(hidden)).float()
    for next_token in (False, True):
        heads = hm.initial_heads(stories32, next_token=next_token)
        for i, logits in enumerate(hm.draft_logits(stories32, heads, hidden, tokens), start=1):
            torch.testing.assert_close(logits, base[:, : -(i + 1)], rtol=0, atol=1e-5)


def test_base_hidden_is_the_engines_prenorm_state(stories32):
    """The training h0 gives the engine's logits once the final norm is applied."""
    from tokenswift.model.kv_cache import KVCache
    from tokenswift.model.masks import causal_mask

    ids = torch.tensor(stories32.encode("Tom saw a big red ball in the park."))
    cfg, t = stories32.config, len(ids)
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, t, cfg.head_dim, "cpu", torch.float32)
    out = stories32.model(ids, torch.arange(t), cache, 0, causal_mask(0, t, torch.arange(t), None, "cpu"))
    hidden = hm.base_hidden(stories32, ids[None])[0]
    assert torch.equal(hidden, out.hidden)
    assert torch.equal(stories32.model.head(stories32.model.model.norm(hidden)), out.logits)


def test_saved_heads_reload_to_identical_logits(trained, stories32):
    cfg, result = trained
    loaded = load_heads(Path(cfg.out), stories32.config, "cpu", torch.float32)
    tokens = torch.tensor([stories32.encode("Lily and Ben went to the beach to build a sandcastle.")])
    hidden = hm.base_hidden(stories32, tokens)
    assert loaded.next_token and result.heads.next_token  # the default: heads that read the next token
    for ours, theirs in zip(hm.draft_logits(stories32, result.heads, hidden, tokens),
                            hm.draft_logits(stories32, loaded, hidden, tokens), strict=True):
        assert torch.equal(ours, theirs)
    # the draft vocabulary: every id of this 512-token model, the training text's most frequent first
    assert torch.equal(loaded.vocab, result.heads.vocab) and sorted(loaded.vocab.tolist()) == list(range(512))
    distilled = [i for line in (Path(cfg.out) / th.DISTILL_NAME).read_text().splitlines()
                 for i in json.loads(line)["ids"]]
    assert int(loaded.vocab[0]) == max(set(distilled), key=distilled.count)


def test_draft_vocabulary_is_the_most_frequent_ids():
    tokens = torch.tensor([[5, 5, 5, 2, 2, 9, 1, 1]])
    assert th.draft_vocabulary(tokens, 12, 3).tolist() == [5, 1, 2]  # 1 and 2 tie: the lower id first
    assert len(th.draft_vocabulary(tokens, 12, 100)) == 12


def test_record_describes_data_and_settings(trained):
    cfg, result = trained
    record = json.loads((Path(cfg.out) / "heads_config.json").read_text())["record"]
    assert record == json.loads(json.dumps(result.record))
    assert record["data"]["self_distill"]["tokens"] == 4000 and record["data"]["sequences"] >= 60
    assert record["settings"]["lr"] == 2e-2 and record["steps"] == 60
    assert record["tokens_seen"] == 60 * 8 * 64
    assert len(record["final"]["top1_per_head"]) == 3 and record["final"]["loss"] > 0
    distilled = (Path(cfg.out) / th.DISTILL_NAME).read_text().splitlines()
    assert sum(len(json.loads(line)["ids"]) - 1 for line in distilled) == 4000  # BOS prompt + samples


# -- cached features and the sampled loss -------------------------------------------------------------


def test_sampled_loss_on_cached_features_learns(trained, heldout, stories_path, stories32, tmp_path):
    """The CPU recipe: the frozen model runs once per sequence into --features, the heads train on the target,
    the model's own top-k and random negatives; they must beat untrained heads on held-out text."""
    data = (str(Path(trained[0].out) / th.DISTILL_NAME),)
    cfg = hc.TrainConfig(model=str(stories_path), out=str(tmp_path / "heads"), data=data, steps=60,
                         checkpoint_every=60, features=str(tmp_path / "features"), loss="sampled", topk=8,
                         negatives=128, **QUICK)
    result = th.train_heads(cfg, lm=stories32)
    before = evaluate(stories_path, stories32, ev.UNTRAINED, heldout)
    after = evaluate(stories_path, stories32, cfg.out, heldout)
    for i in (1, 2, 3):
        b, a = before[f"head{i}"], after[f"head{i}"]
        assert a["loss"] < b["loss"] - 1.0 and a["top1"] > b["top1"] + 0.02 and a["top1"] > 2 * b["top1"], (i, b, a)
    assert result.record["data"]["features"] == cfg.features and result.record["settings"]["loss"] == "sampled"


def test_features_hold_the_models_own_states_and_resume(trained, stories32, tmp_path):
    from tokenswift.train import head_features as hf

    packed = load_sequences([str(Path(trained[0].out) / th.DISTILL_NAME)], stories32.encode, 64, None, None)
    tokens = packed.tokens[:6]
    store = hf.open_or_create(tmp_path / "f", tokens, stories32.config.dim, 4, "stories", "id")
    hf.extract(stories32, store, progress=False, save_every=2)
    whole = (store.hidden.copy(), store.topk.copy())
    hidden = hm.base_hidden(stories32, tokens[2:3])[0]
    assert torch.equal(torch.from_numpy(whole[0][2].astype("float32")), hidden.half().float())
    logits = stories32.model.head(stories32.model.model.norm(hidden))
    assert torch.equal(torch.from_numpy(whole[1][2]).long(), logits.topk(4, dim=-1).indices)
    store.hidden[3:] = 0  # an interruption after 3 sequences: extraction goes on from there
    store.meta["filled"] = 3
    store.save_meta()
    hf.extract(stories32, hf.FeatureStore(tmp_path / "f", "r+"), progress=False)
    again = hf.FeatureStore(tmp_path / "f")
    assert again.filled == 6 and (again.hidden[:] == whole[0]).all() and (again.topk[:] == whole[1]).all()
    with pytest.raises(ValueError, match="other data or settings"):
        hf.open_or_create(tmp_path / "f", tokens, stories32.config.dim, 8, "stories", "id")


def test_vocab_loss_learns_and_reading_the_next_token_drafts_better(trained, heldout, stories_path, stories32,
                                                                   tmp_path):
    """The loss over the draft vocabulary trains heads that beat untrained ones; with the same data and steps,
    heads that read the next token beat heads that do not, most of all the first."""
    data = (str(Path(trained[0].out) / th.DISTILL_NAME),)
    rows = {}
    for next_token in (False, True):
        out = tmp_path / f"heads-{next_token}"
        cfg = hc.TrainConfig(model=str(stories_path), out=str(out), data=data, steps=60, checkpoint_every=60,
                             loss="vocab", draft_vocab=256, next_token=next_token, **QUICK)
        result = th.train_heads(cfg, lm=stories32)
        assert result.heads.next_token == next_token and result.record["settings"]["loss"] == "vocab"
        assert len(result.heads.vocab) == 256
        rows[next_token] = evaluate(stories_path, stories32, cfg.out, heldout)
    before = evaluate(stories_path, stories32, ev.UNTRAINED, heldout)
    for i in (1, 2, 3):
        b, a = before[f"head{i}"], rows[False][f"head{i}"]
        assert a["top1"] > b["top1"] + 0.02 and a["top1"] > 2 * b["top1"], (i, b, a)
    assert rows[True]["head1"]["top1"] > rows[False]["head1"]["top1"] + 0.05, rows


def test_distill_loss_learns_what_the_model_itself_writes(trained, heldout, stories_path, stories32, tmp_path):
    """Soft targets from the model's own distribution: with the same data and steps as the vocabulary loss, the
    first heads' best guess is the model's own best guess (what greedy decoding accepts) more often (60 steps
    here: 0.246 against 0.231 for head 1)."""
    data = (str(Path(trained[0].out) / th.DISTILL_NAME),)
    rows = {}
    for loss in ("vocab", "distill"):
        cfg = hc.TrainConfig(model=str(stories_path), out=str(tmp_path / loss), data=data, steps=60,
                             checkpoint_every=60, loss=loss, draft_vocab=256, **QUICK)
        result = th.train_heads(cfg, lm=stories32)
        assert result.record["settings"]["loss"] == loss and len(result.heads.vocab) == 256
        rows[loss] = evaluate(stories_path, stories32, cfg.out, heldout)
    before = evaluate(stories_path, stories32, ev.UNTRAINED, heldout)
    assert before["base"]["model_top1"] == 1.0 and before["base"]["model_top3"] == 1.0
    agree = {name: [r[f"head{i}"]["model_top1"] for i in (1, 2, 3)]
             for name, r in (("untrained", before), ("vocab", rows["vocab"]), ("distill", rows["distill"]))}
    assert all(d > b + 0.05 for b, d in zip(agree["untrained"], agree["distill"], strict=True)), agree
    assert agree["distill"][0] > agree["vocab"][0] and agree["distill"][1] > agree["vocab"][1], agree


def test_training_can_start_from_trained_heads(trained, stories_path, stories32, tmp_path):
    """--init: fine-tuning starts from the given heads (one tiny step leaves them nearly as they were), and
    heads of another shape are refused."""
    start, _ = trained
    data = (str(Path(start.out) / th.DISTILL_NAME),)
    cfg = hc.TrainConfig(model=str(stories_path), out=str(tmp_path / "tuned"), data=data, steps=1,
                         checkpoint_every=1, loss="distill", draft_vocab=64, init=start.out,
                         **(QUICK | dict(lr=1e-6, min_lr=1e-7, warmup=0)))
    tuned = th.train_heads(cfg, lm=stories32).heads
    before = load_heads(Path(start.out), stories32.config, "cpu", torch.float32)
    for name, value in before.state_dict().items():
        if name != "vocab":
            assert torch.allclose(tuned.state_dict()[name].float(), value, atol=1e-4), name
    assert len(tuned.vocab) == 64  # this run's draft vocabulary, not the one the heads came with
    with pytest.raises(HeadsError, match="gamma 3"):
        th.train_heads(hc.TrainConfig(**(vars(cfg) | dict(gamma=2, out=str(tmp_path / "other")))), lm=stories32)


@pytest.mark.parametrize("loss", ["vocab", "distill"])
def test_vocab_and_distill_losses_need_a_draft_vocabulary(loss):
    with pytest.raises(ValueError, match="needs a draft vocabulary"):
        hc.TrainConfig(model="m", out="o", data=("x.txt",), loss=loss, draft_vocab=0)


def test_sampled_loss_needs_features():
    with pytest.raises(ValueError, match="needs --features"):
        hc.TrainConfig(model="m", out="o", data=("x.txt",), loss="sampled")


# -- resume -------------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def test_resume_after_interruption_gives_the_uninterrupted_heads(trained, stories_path, stories32, tmp_path):
    """9 steps, checkpoints every 3, killed after step 5: resuming from step 3 ends bit-identical."""
    data = (str(Path(trained[0].out) / th.DISTILL_NAME),)  # the distilled text, read back as --data
    settings = dict(QUICK, model=str(stories_path), data=data, steps=9, batch=3, grad_accum=2,
                    checkpoint_every=3, warmup=2)
    whole = th.train_heads(hc.TrainConfig(out=str(tmp_path / "whole"), **settings), lm=stories32)

    def crash(step, _metrics):
        if step == 5:
            raise Interrupted

    with pytest.raises(Interrupted):
        th.train_heads(hc.TrainConfig(out=str(tmp_path / "split"), **settings), lm=stories32, on_step=crash)
    assert torch.load(tmp_path / "split" / th.CHECKPOINT_NAME, weights_only=True)["step"] == 3
    steps = []
    resumed = th.train_heads(hc.TrainConfig(out=str(tmp_path / "split"), resume=True, **settings), lm=stories32,
                             on_step=lambda step, _: steps.append(step))
    assert steps == [4, 5, 6, 7, 8, 9]
    for name, tensor in whole.heads.state_dict().items():
        assert torch.equal(tensor, resumed.heads.state_dict()[name]), name
    assert whole.record["final"] == resumed.record["final"]

    changed = hc.TrainConfig(out=str(tmp_path / "split"), resume=True, **(settings | {"lr": 1e-2}))
    with pytest.raises(ValueError, match="lr: 0.02 -> 0.01"):
        th.train_heads(changed, lm=stories32)


def test_data_order_is_a_function_of_seed_and_position():
    stream = th.sample_indices(5, seed=3, start=0, count=15)
    assert sorted(stream[:5]) == sorted(stream[5:10]) == list(range(5))  # each epoch a permutation
    assert th.sample_indices(5, seed=3, start=7, count=4) == stream[7:11]
    assert th.sample_indices(5, seed=4, start=0, count=15) != stream


def test_schedule_warms_up_then_decays_to_min_lr():
    cfg = hc.TrainConfig(model="m", out="o", data=("x",), steps=100, warmup=10, lr=1e-2, min_lr=1e-3)
    factors = [th.lr_factor(s, cfg) for s in range(101)]
    assert factors[:11] == sorted(factors[:11]) and factors[10] == pytest.approx(1.0)
    assert factors[10:] == sorted(factors[10:], reverse=True) and factors[100] == pytest.approx(0.1)


# -- data -----------------------------------------------------------------------------------------------


def test_reads_txt_jsonl_and_jsonl_xz_and_keeps_each_documents_opening(stories32, tmp_path):
    a, b = "Tim had a red kite. " * 20, "Sue liked to sing songs with her mom. " * 20
    (tmp_path / "a.txt").write_text(a)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": b}) + "\n\n")
    with lzma.open(tmp_path / "c.jsonl.xz", "wt") as f:
        f.write(json.dumps({"id": 1, "text": a}) + "\n" + json.dumps({"text": b}) + "\n")
    files = [tmp_path / "a.txt", tmp_path / "b.jsonl", tmp_path / "c.jsonl.xz"]
    packed = load_sequences(files, stories32.encode, seq_len=16, doc_tokens=30)
    first30 = [stories32.encode(t)[:30] for t in (a, b, a, b)]
    stream = [t for doc in first30 for t in doc]
    assert packed.documents == 4 and packed.total_tokens == 120
    assert packed.tokens.tolist() == [stream[i:i + 16] for i in range(0, 112, 16)]  # the 8-token tail dropped
    assert load_sequences(files, stories32.encode, 16, None, max_docs=1).total_tokens == len(stories32.encode(a))


def test_opening_tokens_match_tokenising_the_whole_text(stories32):
    text = "Once upon a time, a big bear found a little honey pot in the woods. " * 80
    for n in (1, 50, 300):
        assert opening_tokens(text, stories32.encode, n) == stories32.encode(text)[:n]


@pytest.mark.parametrize("name, content, message", [
    ("notes.md", "some text", "unknown file type"),
    ("empty.txt", "", "no text"),
    ("blank.jsonl", "\n\n", "no text"),
    ("short.txt", "A cat.", "fewer than one sequence"),
    ("bad.jsonl", '{"text": "fine"}\n{"title": "no text field"}\n', r"bad.jsonl:2: .*`text`"),
    ("broken.jsonl", '{"text": "fine"\n', r"broken.jsonl:1: not valid JSON"),
    ("list.jsonl", '["text"]\n', r"list.jsonl:1: .*JSON object"),
])
def test_bad_data_fails_with_a_clear_message(stories32, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        load_sequences([path], stories32.encode, seq_len=64)
    assert issubclass(DataError, ValueError)


def test_missing_file_and_missing_data_are_errors(stories32, tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_sequences([tmp_path / "gone.txt"], stories32.encode, seq_len=8)
    with pytest.raises(DataError, match="fewer than one sequence"):
        pack([[1, 2, 3]], seq_len=8)
    with pytest.raises(ValueError, match="--data FILE... or --self-distill"):
        hc.TrainConfig(model="m", out="o")


# -- import of official heads ------------------------------------------------------------------------


def official_checkpoint(stories_path, path, sharded: bool) -> dict[str, torch.Tensor]:
    """A TokenSwift-style full model copy: the base tensors plus model.medusa_layers.{j}.* in bf16."""
    path.mkdir()
    shutil.copy(stories_path / "config.json", path / "config.json")
    gen = torch.Generator().manual_seed(0)
    medusa = {}
    for j in range(3):
        p = f"model.medusa_layers.{j}."
        medusa[p + "linear.weight"] = torch.randn(64, 64, generator=gen).to(torch.bfloat16)
        medusa[p + "input_layernorm.weight"] = torch.rand(64, generator=gen).to(torch.bfloat16)
        medusa[p + "post_layernorm.weight"] = torch.rand(64, generator=gen).to(torch.bfloat16)
    base = read_state_dict(stories_path)
    if not sharded:
        save_file(base | medusa, str(path / "model.safetensors"))
        return medusa
    save_file(base, str(path / "model-00001-of-00002.safetensors"))
    save_file(medusa, str(path / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in base}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in medusa}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return medusa


@pytest.mark.parametrize("sharded", [False, True])
def test_import_official_heads_reproduces_the_tensors(stories_path, stories32, tmp_path, sharded):
    source = official_checkpoint(stories_path, tmp_path / "official", sharded)
    parser = argparse.ArgumentParser()
    ih.add_import_arguments(parser)
    ih.run_import(parser.parse_args(["--from", str(tmp_path / "official"), "--out", str(tmp_path / "ours")]))
    ours = load_file(str(tmp_path / "ours" / "heads.safetensors"))
    assert len(ours) == len(source) == 9
    for name, tensor in source.items():
        assert torch.equal(ours["layers." + name.removeprefix("model.medusa_layers.")], tensor.float()), name
    heads = load_heads(tmp_path / "ours", stories32.config, "cpu", torch.float32)
    assert heads.gamma == 3 and heads.eps == stories32.config.norm_eps


def test_import_without_heads_is_an_error(stories_path, tmp_path):
    with pytest.raises(HeadsError, match="no model.medusa_layers"):
        ih.import_heads(ih.ImportConfig(str(stories_path), str(tmp_path / "ours")))


# -- command-line surface ------------------------------------------------------------------------------


def test_train_arguments_map_onto_the_config():
    parser = argparse.ArgumentParser()
    hc.add_arguments(parser)
    args = parser.parse_args(["--model", "m", "--self-distill", "5000", "--data", "a.txt", "b.jsonl", "--out", "o",
                              "--seq-len", "512", "--doc-tokens", "0", "--grad-accum", "4", "--lr", "1e-3",
                              "--temperature", "0.8", "--min-p", "0.05", "--resume"])
    cfg = hc.config_from_args(args)
    assert cfg.data == ("a.txt", "b.jsonl") and cfg.seq_len == 512 and cfg.doc_tokens is None
    assert cfg.grad_accum == 4 and cfg.lr == 1e-3 and cfg.resume and cfg.steps == 200
    assert cfg.distill == hc.DistillConfig(tokens=5000, temperature=0.8, min_p=0.05)
    assert cfg.features is None and cfg.loss == "full" and cfg.draft_vocab == 8192
    args = parser.parse_args(["--model", "m", "--data", "a.txt", "--out", "o", "--features", "f", "--loss",
                              "sampled", "--topk", "8", "--negatives", "512", "--draft-vocab", "0"])
    cfg = hc.config_from_args(args)
    assert (cfg.features, cfg.loss, cfg.topk, cfg.negatives, cfg.draft_vocab) == ("f", "sampled", 8, 512, 0)
    assert cfg.next_token
    cfg = hc.config_from_args(parser.parse_args(["--model", "m", "--data", "a.txt", "--out", "o", "--loss", "vocab",
                                                 "--no-next-token"]))
    assert cfg.loss == "vocab" and not cfg.next_token


def test_eval_command_prints_a_table_and_writes_json(trained, heldout, stories_path, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    out = tmp_path / "eval.json"
    ev.run(parser.parse_args(["--model", str(stories_path), "--heads", trained[0].out, "--data", str(heldout),
                              "--seq-len", "64", "--max-sequences", "4", "--json", str(out), "--no-progress"]))
    printed = capsys.readouterr().out
    assert "head3" in printed and "top-3" in printed
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"base", "head1", "head2", "head3"}
    assert result["data"]["evaluated_sequences"] == 4 and result["rows"]["head1"]["positions"] == 4 * 62
