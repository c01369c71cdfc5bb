"""Our decoder against transformers' own implementations: max |Δlogit| <= 1e-4 in float32 over 256 tokens."""

from __future__ import annotations

import pytest
import torch
from speed import AR
from tiny_models import CASES, VOCAB, hf_model, save_checkpoint

from tokenswift.model.config import ModelConfig
from tokenswift.model.forward import project
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import ModelLoadError, build_model, load_model
from tokenswift.model.masks import causal_mask
from tokenswift.model.rope import rope_table

N = 256
TOL = 1e-4


def ours_from_hf(hf):
    cfg = ModelConfig.from_hf(hf.config)
    net = build_model(cfg, hf.state_dict(), "cpu", torch.float32)
    net.set_rope(*rope_table(hf.config, N + 8, "cpu", torch.float32))
    return net


def new_cache(net, capacity=N + 8):
    c = net.cfg
    return KVCache(c.n_layers, c.n_kv_heads, capacity, c.head_dim, "cpu", torch.float32)


def our_prefill(net, ids, chunk=100):
    cache, out = new_cache(net), []
    for start in range(0, len(ids), chunk):
        block = ids[start:start + chunk]
        pos = torch.arange(start, start + len(block))
        mask = causal_mask(start, len(block), pos, net.cfg.sliding_window, "cpu")
        out.append(net(block, pos, cache, start, mask).logits)
    return torch.cat(out)


def our_stepwise(net, ids):
    cache = new_cache(net)
    rows = []
    for i in range(len(ids)):
        mask = None
        if net.cfg.sliding_window is not None:
            mask = causal_mask(i, 1, torch.tensor([i]), net.cfg.sliding_window, "cpu")
        rows.append(net(ids[i:i + 1], torch.tensor([i]), cache, i, mask).logits)
    return torch.cat(rows)


def hf_stepwise(hf, ids):
    from transformers import DynamicCache

    cache, rows = DynamicCache(config=hf.config), []
    for i in range(len(ids)):
        out = hf(ids[None, i:i + 1], past_key_values=cache, use_cache=True, position_ids=torch.tensor([[i]]))
        rows.append(out.logits[0])
    return torch.cat(rows)


# -m "not slow" keeps one architecture; the full run compares them all.
@pytest.mark.parametrize("case", [c if c == "llama-gqa-tied" else pytest.param(c, marks=pytest.mark.slow)
                                  for c in sorted(CASES)])
@torch.no_grad()
def test_logits_match_transformers(case):
    hf = hf_model(case)
    net = ours_from_hf(hf)
    ids = torch.randint(0, VOCAB, (N,), generator=torch.Generator().manual_seed(1))
    ref_step = hf_stepwise(hf, ids)
    assert (our_stepwise(net, ids) - ref_step).abs().max() <= TOL
    # Dynamic NTK in transformers rotates a whole prefill with the longest length's frequencies, but each
    # decoded token with its own; we use the per-position rule, so both our paths match its decoding.
    ref_full = ref_step if case == "llama-dynamic" else hf(ids[None]).logits[0]
    assert (our_prefill(net, ids) - ref_full).abs().max() <= TOL


@pytest.mark.slow
@torch.no_grad()
def test_stories260k_matches_transformers(stories_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32, attn_implementation="eager").eval()
    lm = load_model(str(stories_path))
    ids = torch.tensor(lm.encode("Once upon a time there was a little girl named Lily. " * 20)[:N])
    assert len(ids) == N
    assert (our_prefill(lm.model, ids) - hf(ids[None]).logits[0]).abs().max() <= TOL
    assert (our_stepwise(lm.model, ids) - hf_stepwise(hf, ids)).abs().max() <= TOL


@pytest.mark.parametrize("fmt", ["safetensors", "sharded", "bin"])
@torch.no_grad()
def test_checkpoint_formats_load(tmp_path, stories_path, fmt):
    hf = hf_model("qwen2-bias-gqa")
    save_checkpoint(hf, tmp_path, stories_path, **({"max_shard_size": "100KB"} if fmt == "sharded" else {}))
    if fmt == "sharded":
        assert (tmp_path / "model.safetensors.index.json").exists()
    if fmt == "bin":  # transformers now writes only safetensors; older checkpoints are PyTorch pickles
        (tmp_path / "model.safetensors").unlink()
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    lm = load_model(str(tmp_path))
    ids = torch.randint(0, VOCAB, (32,), generator=torch.Generator().manual_seed(2))
    assert (our_prefill(lm.model, ids) - hf(ids[None]).logits[0]).abs().max() <= TOL


def test_unsupported_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ModelLoadError, match="supported: llama"):
        load_model(str(tmp_path))


def test_unknown_path_and_offline_hub_id_are_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE=1"):
        load_model("some-org/some-model")


def test_corrupt_checkpoint_names_the_file(tmp_path, stories_path):
    save_checkpoint(hf_model("llama-mha"), tmp_path, stories_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="corrupt checkpoint file .*model.safetensors"):
        load_model(str(tmp_path))


@pytest.mark.slow
@torch.no_grad()
def test_greedy_ar_equals_transformers_generate(stories_path, stories32):
    from transformers import AutoModelForCausalLM

    from tokenswift.decode.generate import Generator
    from tokenswift.settings import Settings

    hf = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # a fixed 200 tokens on both sides, as with --ignore-eos
    hf.generation_config.pad_token_id = 0
    prompt = stories32.encode("Once upon a time, there was a little dog named Max.")
    reference = hf.generate(torch.tensor([prompt]), max_new_tokens=200, do_sample=False)[0, len(prompt):]
    ours = Generator(stories32, Settings(temperature=0, max_new_tokens=200, ignore_eos=True), prompt, options=AR)
    assert ours.run() == reference.tolist()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_every_projection_matches_a_float64_product(rows, monkeypatch):
    # Up to model.COLUMN_ROWS float32 rows on a CPU take weight @ x.T (an odd count padded), if the weight is
    # big enough to come from memory; anything else F.linear.
    columns = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: columns.append(b.shape[1]) or mm(a, b))
    g = torch.Generator().manual_seed(rows)
    for out in (1100, 300):  # 1100 x 64 is past COLUMN_MIN_WEIGHT, 300 x 64 is not
        weight, bias = torch.randn(out, 64, generator=g), torch.randn(out, generator=g)
        x = torch.randn(64, rows, generator=g).t()  # a non-contiguous input, as a transposed product hands on
        want = x.double() @ weight.double().t() + bias.double()
        got = project(x, weight, bias)
        assert got.shape == (rows, out) and got.dtype == torch.float32
        assert (got.double() - want).abs().max() < 1e-4
        assert torch.equal(project(x.double(), weight.double()), torch.nn.functional.linear(x.double(),
                                                                                            weight.double()))
    assert columns == ([rows + rows % 2] if rows <= 4 else [])
