"""GGUF checkpoints: files the tests write with the `gguf` package, and the default model's SmolLM2 file.

Our decoder on a GGUF must give the logits transformers gives on the same file (its own GGUF loader), and
for an unquantized file the logits of the model that was written; bad files fail with one clear error."""

from __future__ import annotations

import pytest
import torch
from gguf_files import write_gguf

from tokenswift.bench.shapes import random_heads
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model import gguf_checkpoint
from tokenswift.model.errors import ModelLoadError
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import load_model
from tokenswift.model.masks import causal_mask
from tokenswift.model.quant import QuantLinear
from tokenswift.settings import Settings, Speculation


def our_logits(lm, ids: torch.Tensor) -> torch.Tensor:
    cfg, t = lm.config, ids.numel()
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, t, cfg.head_dim, lm.device, lm.dtype)
    pos = torch.arange(t)
    return lm.model(ids, pos, cache, 0, causal_mask(0, t, pos, cfg.sliding_window, lm.device)).logits


def reference_logits(path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids[None]).logits[0]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """The engine's cache directory ($TOKENSWIFT_CACHE) for this test: conversions and kernels land there."""
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("case,qtype", [("llama-gqa-tied", "F32"), ("llama-mha", "Q8_0"), ("llama-gqa-tied", "Q4_1"),
                                        ("qwen2-bias-gqa", "F16")])
def test_gguf_logits_match_transformers(tmp_path, home, stories_path, case, qtype):
    path = tmp_path / f"{case}-{qtype}.gguf"
    source = write_gguf(path, stories_path, case, qtype)
    lm = load_model(str(path))
    ids = torch.randint(3, lm.config.vocab_size, (48,), generator=torch.Generator().manual_seed(0))
    ours = our_logits(lm, ids)
    theirs = reference_logits(path, ids)
    assert (ours - theirs).abs().max().item() < 1e-4
    if qtype == "F32":  # nothing was quantized: the file holds exactly the model that was written
        with torch.no_grad():
            written = source(ids[None]).logits[0]
        assert (ours - written).abs().max().item() < 1e-4
    if case.startswith("qwen2"):
        return  # transformers reads a qwen2 file's tokenizer as byte-level BPE; ours is SentencePiece
    from transformers import AutoTokenizer  # the tokenizer came from the file's metadata: stories260k's

    text = "Once upon a time, a little cat sat by the fire."
    assert lm.encode(text) == AutoTokenizer.from_pretrained(stories_path)(text).input_ids


@pytest.mark.parametrize("case,qtype", [("llama-mha", "Q8_0"), ("llama-gqa-tied", "Q4_1"), ("qwen2-bias-gqa", "F16")])
def test_our_tensor_pass_gives_transformers_tensors(tmp_path, stories_path, case, qtype):
    """gguf_checkpoint reads a file's tensors itself (a sixth of transformers' time): the same names and values, llama's
    Q/K rows put back in transformers' order, a qwen2 file's left as they are."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = tmp_path / f"{case}-{qtype}.gguf"
    write_gguf(path, stories_path, case, qtype)
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path, gguf_file=path.name))
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=reference)["tensors"]
    ours = gguf_checkpoint.gguf_tensors(path)
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_gguf_is_converted_once_and_cached(tmp_path, home, stories_path, monkeypatch):
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    read, parses = gguf_utils.load_gguf_checkpoint, []

    def counted(*args, **kwargs):
        parses.append(args[0])
        return read(*args, **kwargs)

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", counted)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, stories_path)
    first = gguf_checkpoint.hf_directory(path)
    assert parses == [str(path)]  # transformers' slow metadata reader, once for its config and tokenizer
    assert gguf_checkpoint.hf_directory(path, weights=False) == first  # the whole conversion serves a header's needs
    assert gguf_utils.load_gguf_checkpoint is counted and len(parses) == 1  # put back as found; nothing parsed
    made = (first / "model.safetensors").stat().st_mtime_ns
    again = gguf_checkpoint.hf_directory(path)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == made
    assert first.parent == home  # $TOKENSWIFT_CACHE
    elsewhere = gguf_checkpoint.hf_directory(path, tmp_path / "app-cache")  # a caller's own folder (the app's)
    assert elsewhere.parent == tmp_path / "app-cache" and (elsewhere / "model.safetensors").is_file()
    record = gguf_checkpoint.source_record(first)
    assert record["sha256"] == gguf_checkpoint.file_hash(path) and record["architecture"] == "llama"
    (first / gguf_checkpoint.SOURCE_NAME).unlink()  # an interrupted conversion: converted again, complete
    assert (gguf_checkpoint.hf_directory(path) / gguf_checkpoint.SOURCE_NAME).is_file()

    def refuse(*args, **kwargs):
        raise ValueError("no tokenizer here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    with pytest.raises(ModelLoadError, match="cannot convert GGUF file .*no tokenizer here"):
        gguf_checkpoint.hf_directory(path, tmp_path / "failing")
    assert gguf_utils.load_gguf_checkpoint is counted  # put back after a failure too


def test_bad_gguf_files_fail_with_one_clear_error(tmp_path, home, stories_path):
    good = tmp_path / "good.gguf"
    write_gguf(good, stories_path)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(truncated))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(junk))
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"))
    other = tmp_path / "gpt2.gguf"
    write_gguf(other, stories_path, arch="gpt2")
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        load_model(str(other))
    odd = tmp_path / "iq.gguf"
    write_gguf(odd, stories_path, raw_type="IQ4_NL")
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight has type IQ4_NL"):
        load_model(str(odd))


@pytest.mark.parametrize("case,qtype", [("llama-mha", "Q8_0"), ("llama-gqa-tied", "Q4_1"), ("qwen2-bias-gqa", "F16")])
def test_the_header_reader_reads_what_gguf_reads(tmp_path, stories_path, case, qtype):
    """gguf_header against the gguf package's reader: the same metadata values, tensor types, shapes and bytes."""
    import numpy as np
    from gguf import GGUFReader

    from tokenswift.model.gguf_header import read_header

    path = tmp_path / "model.gguf"
    write_gguf(path, stories_path, case, qtype)
    header, reader = read_header(path), GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert header.fields == {k: len(v) if isinstance(v, list) else v for k, v in fields.items()}
    assert list(header.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = header.tensors[t.name]
        assert (info.kind, info.shape, info.offset, info.n_bytes) == (t.tensor_type.name, tuple(map(int, t.shape)),
                                                                      t.data_offset, t.n_bytes)
        assert np.array_equal(header.tensor_bytes(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:200])  # inside the metadata
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        load_model(str(cut))


def test_cli_reports_a_bad_gguf_in_one_line(tmp_path, home, capsys):
    from tokenswift.cli.main import main

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 40)
    assert main(["generate", "--model", str(junk), "--prompt", "Hello", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: GGUF file") and "junk.gguf" in err[0]


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0", "Q8_0"])
def test_q4_runs_the_files_own_4bit_blocks(tmp_path, home, stories_path, qtype):
    path = tmp_path / f"q4-{qtype}.gguf"
    write_gguf(path, stories_path, "llama-gqa-tied", qtype)  # Llama: Q and K rows are stored interleaved
    dense, lm = load_model(str(path)), load_model(str(path), dtype="q4")
    assert lm.precision == "q4" and lm.dtype == torch.float32
    products = [(f"{i}.{name}", getattr(getattr(layer, owner), attr), getattr(getattr(ref, owner), attr).weight)
                for i, (layer, ref) in enumerate(zip(lm.model.model.layers, dense.model.model.layers, strict=True))
                for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
                for owner, attr in [name.split(".")]]
    products.append(("head", lm.model.quantized_head, dense.model.head_weight))
    for name, packed, weight in products:
        assert isinstance(packed, QuantLinear) and packed.kind == qtype, name
        rows = torch.randn(3, packed.in_features, generator=torch.Generator().manual_seed(2))
        # the file's own values times activations rounded to 8 bits per block, as llama.cpp multiplies them
        ours, exact = packed(rows), rows @ weight.t()
        assert (ours - exact).norm() / exact.norm() < 0.02, name
        assert torch.equal(packed(rows[1:2]), ours[1:2]), name  # a row's product does not depend on the others
    x = torch.randn(2, lm.config.dim)
    assert torch.equal(lm.model.head(x), lm.model.quantized_head(x))
    ids = torch.randint(3, lm.config.vocab_size, (48,), generator=torch.Generator().manual_seed(0))
    ours, reference = our_logits(lm, ids).float(), our_logits(dense, ids)
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
    assert torch.nn.functional.cosine_similarity(ours, reference, dim=-1).min() > 0.99
    lm.heads = random_heads(lm.config, lm.device, lm.dtype)  # both drafters run on the 4-bit model
    prompt = lm.encode("Once upon a time, a little cat sat by the fire.")
    for drafter in ("fused", "paper"):
        settings = Settings(max_new_tokens=24, seed=3, ignore_eos=True)
        out = Generator(lm, settings, prompt, options=EngineOptions(speculation=Speculation(drafter=drafter))).run()
        assert len(out) == 24 and all(0 <= t < lm.config.vocab_size for t in out)


def test_q4_refuses_what_it_cannot_run(tmp_path, home, stories_path):
    half = tmp_path / "f16.gguf"
    write_gguf(half, stories_path, "llama-gqa-tied", "F16")
    with pytest.raises(ModelLoadError, match="Q4_0, Q4_1 or Q8_0 projections.*F16"):
        load_model(str(half), dtype="q4")
    biased = tmp_path / "qwen2.gguf"
    write_gguf(biased, stories_path, "qwen2-bias-gqa", "Q4_1")
    with pytest.raises(ModelLoadError, match="without attention biases"):
        load_model(str(biased), dtype="q4")
    with pytest.raises(ModelLoadError, match="GGUF file's 4-bit weights on the CPU"):
        load_model(str(stories_path), dtype="q4")


@pytest.mark.parametrize("case", ["llama-gqa-tied", "llama-mha"])  # a tied LM head, and its own
def test_a_q4_model_counts_the_parameters_of_its_packed_weights(tmp_path, home, stories_path, case):
    """The model notice's size (worker.holder.param_count): q4 keeps the projections packed, not as parameters; the
    135M default model read "28.3M" (its embedding alone). Its packed LM head copies a weight counted once."""
    from worker.holder import param_count

    path = tmp_path / "q4.gguf"
    write_gguf(path, stories_path, case, "Q4_1")
    dense, lm = load_model(str(path)), load_model(str(path), dtype="q4")
    assert lm.model.quantized_head is not None
    assert param_count(lm) == param_count(dense) == sum(t.numel() for t in dense.model.parameters())
