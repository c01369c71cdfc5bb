"""`bench-gpu` (bench/gpu.py) and the model presets (bench/shapes.py): real dimensions, the projection's
arithmetic, and a whole run at --tiny scale on the CPU through the CLI."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from tokenswift.bench.gpu import GpuBench, integrate, interpolate, memory_report, projection, random_cache
from tokenswift.bench.runs import kv_bytes_per_token
from tokenswift.bench.shapes import PRESETS, parameter_count, preset, random_model
from tokenswift.cli import main as cli
from tokenswift.model.rope import rope_table

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.mark.parametrize(("name", "billions", "kv_kib"), [("llama3.1-8b", 8.03, 128), ("qwen2.5-7b", 7.62, 56),
                                                          ("qwen2.5-1.5b", 1.54, 28)])
def test_presets_have_the_real_dimensions(name, billions, kv_kib):
    cfg, hf = preset(name)
    assert parameter_count(cfg) / 1e9 == pytest.approx(billions, abs=0.01)
    assert 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2 == kv_kib * 1024  # bf16 KV per token (§8)
    cos, _ = rope_table(hf, 8, "cpu", torch.float64)
    assert cos.shape == (8, 128)


def test_tiny_presets_keep_the_family_traits():
    for name in PRESETS:
        big, _ = preset(name)
        small, _ = preset(name, tiny=True)
        assert small.group == big.group and small.qkv_bias == big.qkv_bias
        assert small.tie_embeddings == big.tie_embeddings and parameter_count(small) < 2_000_000
    lm = random_model("qwen2.5-1.5b", *preset("qwen2.5-1.5b", tiny=True), "cpu", torch.float32)
    assert lm.heads.gamma == 3 and lm.random_heads


def test_interpolation_and_integral():
    xs, ys = [10, 20, 40], [1.0, 2.0, 2.0]
    assert interpolate(xs, ys, 15) == pytest.approx(1.5)
    assert interpolate(xs, ys, 5) == pytest.approx(0.5)  # extended from the first segment
    assert interpolate(xs, ys, 50) == pytest.approx(2.0)
    assert integrate([0, 100], [1.0, 3.0], 0, 100) == pytest.approx(200.0)


def test_projection_minutes():
    b = GpuBench(contexts=(0, 100), prompt=0, new_tokens=100, tokens_per_iter=4.0, tree=(1, 2), ngram_topk=0)
    label = b.shapes[0].label()
    best = [{"context": c, "ar_ms": 600.0 + 6 * c, "draft_ms": 100.0, "verify_ms": {label: 1000.0}}
            for c in (0, 100)]
    result = {"best": best, "overhead_ms": {label: 100.0}, "weight_bytes": 1e9, "kv_bytes_per_token": 1e6}
    p = projection(result, b, copy_bw=1e9, name="llama3.1-8b")
    assert p["ar_minutes"] == pytest.approx(100 * 900.0 / 6e4)  # mean step 0.9 s over 100 tokens
    assert p["tokenswift_minutes"] == pytest.approx(100 * 1200.0 / 4 / 6e4)
    assert p["floor_minutes"] == pytest.approx((1e9 * 100 + 1e6 * 100**2 / 2) / 1e9 / 60)
    assert p["paper_a100_minutes"]["tokenswift"] == 90.0 and p["h100_floor_minutes"] == 12.7


def test_bench_gpu_tiny_on_cpu(capsys, tmp_path):
    out = tmp_path / "gpu.json"
    code = cli.main(["bench-gpu", "--tiny", "--device", "cpu", "--preset", "llama3.1-8b", "--contexts", "64,130",
                     "--steps", "1", "--reps", "1", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "llama3.1-8b-tiny" in printed and "projection" in printed
    data = json.loads(out.read_text())
    (model,) = data["models"]
    assert set(model["kernels"]) == {"eager", "sdpa"}
    assert [r["context"] for r in model["best"]] == [64, 130]
    row = model["kernels"]["sdpa"]["rows"][1]
    assert isinstance(row["ar_ms"], float) and set(row["verify_ms"]) == {"1-3-3-3/k20", "1-2-2-2/k10",
                                                                        "1-2-1-1/k5", "1-1-1-1/k2", "1-1-1-1/k0",
                                                                        "1-1/k0", "1/k0"}
    assert all(isinstance(v, float) for v in row["verify_ms"].values())
    assert model["projection"]["ar_minutes"] > 0 and model["projection"]["tokenswift_minutes"] > 0


def test_the_memory_verdict_is_whether_weights_caches_and_scratch_fit_the_device(monkeypatch):
    """fits_100k, decided here on the CPU with a CUDA device's memory figures stubbed: a 100K-token run fits a
    device with room for the weights, the full and partial caches and this run's scratch, and not one byte less."""
    lm = random_model("qwen2.5-1.5b", *preset("qwen2.5-1.5b", tiny=True), "cpu", torch.float32)
    bench = GpuBench(budget=64)  # a 4096-token prompt, then 100K tokens
    cache, partial = random_cache(lm, 256), random_cache(lm, bench.budget + 1, seed=1)
    kv = kv_bytes_per_token(lm)
    on_cpu = memory_report(lm, {"kv_bytes_per_token": kv}, bench, cache, partial)
    assert "fits_100k" not in on_cpu  # no device memory to fit
    assert on_cpu["full_cache_gb_100k"] * 1e9 >= kv * (bench.prompt + bench.new_tokens)
    need = round(on_cpu["static_need_gb"] * 1e9)
    weights = sum(p.numel() * p.element_size() for p in (*lm.model.parameters(), *lm.heads.parameters()))
    scratch = 123_456_789
    monkeypatch.setattr(torch.cuda, "max_memory_allocated",  # this run's peak: weights, its caches, scratch
                        lambda device: weights + cache.nbytes() + partial.nbytes() + scratch)
    on_cuda = dataclasses.replace(lm, device=torch.device("cuda"))
    verdicts = []
    for total in (need + scratch, need + scratch - 1):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, total=total: SimpleNamespace(
            total_memory=total))
        verdicts.append(memory_report(on_cuda, {"kv_bytes_per_token": kv}, bench, cache, partial)["fits_100k"])
    assert verdicts == [True, False]


def test_bench_gpu_refuses_full_size_on_cpu(capsys):
    assert cli.main(["bench-gpu", "--device", "cpu"]) == 2
    assert "--tiny" in capsys.readouterr().err
    assert cli.main(["bench-gpu", "--tiny", "--device", "cpu", "--kernels", "triton"]) == 2
    assert "kernels" in capsys.readouterr().err


@pytest.mark.cuda
@CUDA
def test_bench_gpu_tiny_on_cuda(tmp_path):
    out = tmp_path / "gpu.json"
    code = cli.main(["bench-gpu", "--tiny", "--preset", "qwen2.5-7b", "--contexts", "256,4096",
                     "--kernels", "flex,flex-fold,sdpa", "--steps", "4", "--reps", "2", "--json", str(out)])
    assert code == 0
    (model,) = json.loads(out.read_text())["models"]
    for kind, kernel in model["kernels"].items():
        assert kernel["error"] is None, kind
        for row in kernel["rows"]:
            assert isinstance(row["ar_ms"], float), (kind, row)
            assert row["bandwidth_fraction"] is not None
    mem = model["memory"]
    assert mem["fits_100k"] is True  # a tiny model's caches fit any GPU (the verdict's boundary: the test above)
    assert mem["static_need_gb"] >= mem["weights_gb"] + mem["full_cache_gb_100k"] > 0
    assert 0 < mem["peak_gb"] < mem["device_gb"]


def test_generate_with_fast_and_adaptive_flags(capsys, stories_path, tmp_path):
    """The CLI's --fast/--adaptive reach the engine (static-shape passes run eagerly on a CPU), same text."""
    common = ["generate", "--model", str(stories_path), "--prompt", "Once upon a time", "--dtype", "float64",
              "--device", "cpu", "--seed", "3", "--temperature", "1.0", "--min-p", "0.1", "--ignore-eos",
              "--max-new-tokens", "60"]
    assert cli.main([*common, "--mode", "ar", "--json", str(tmp_path / "ar.json")]) == 0
    assert cli.main([*common, "--fast", "--attention", "sdpa", "--adaptive", "--json", str(tmp_path / "ts.json")]) == 0
    ar, ts = (json.loads((tmp_path / f"{m}.json").read_text()) for m in ("ar", "ts"))
    assert ts["tokens"] == ar["tokens"] and ts["metrics"]["verify_batch"] > 0
    assert cli.main([*common, "--fast", "--attention", "triton"]) == 2
    assert "attention" in capsys.readouterr().err
