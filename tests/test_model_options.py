"""What a loaded model owns besides its weights: its thread count and its compiled flex kernel, and the device and
dtype a run takes when it names none (one rule for the CLI, the app and its worker)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import torch
from speed import AR

from tokenswift.decode.generate import Generator
from tokenswift.model.config import ModelConfig
from tokenswift.model.default_model import default_model_path
from tokenswift.model.run_defaults import checkpoint_parameters, default_dtype
from tokenswift.settings import Settings


def test_a_model_runs_on_its_own_threads_and_gives_them_back(stories32):
    """torch's intra-op pool is the process's: a run sets its model's count and restores the caller's after, so a
    model swapped in after another runs on its own count, not on its predecessor's."""
    assert stories32.threads == 1  # loading.cpu_threads: a small model runs on one thread
    before = torch.get_num_threads()
    settings = Settings(max_new_tokens=6, seed=1, ignore_eos=True)
    seen = {}
    for threads in (2, 1, 3):
        lm = dataclasses.replace(stories32, threads=threads)
        for _ in Generator(lm, settings, lm.encode("Once upon a time"), options=AR).steps():
            seen.setdefault(threads, set()).add(torch.get_num_threads())
        assert torch.get_num_threads() == before
    assert seen == {2: {2}, 1: {1}, 3: {3}}


def test_the_app_and_the_cli_take_one_default_dtype(tmp_path, stories_path, monkeypatch):
    from gguf_files import write_gguf

    from worker.__main__ import parse_args

    assert default_dtype("cuda:1") == default_dtype("cuda") == "bfloat16" and default_dtype("cpu") == "float32"
    assert parse_args([]).dtype is None  # the worker chooses, in its own process (WorkerConfig.resolved)
    assert parse_args(["--device", "cuda"]).resolved().dtype == "bfloat16"
    assert parse_args([]).resolved().dtype == "float32"
    # On a CPU a GGUF file whose layers are quantized runs on its own blocks (the default model is Q4_1) ...
    assert default_dtype("cpu", default_model_path()) == "q4"
    assert parse_args(["--model", str(default_model_path())]).resolved().dtype == "q4"
    # On a GPU a small model runs in float32 (launch-bound: no slower, and far closer to plain decoding's text), a
    # large one in bfloat16
    assert default_dtype("cuda", default_model_path()) == default_dtype("cuda", stories_path) == "float32"
    assert parse_args(["--device", "cuda", "--model", str(default_model_path())]).resolved().dtype == "float32"
    large = tmp_path / "8b"
    large.mkdir()
    (large / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072, "bos_token_id": 128000, "eos_token_id": 128001}))
    assert checkpoint_parameters(large) == 8_030_261_248 and default_dtype("cuda", large) == "bfloat16"  # Llama-3-8B
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "config.json").write_text("[]")
    # unknown or unreadable sizes take bfloat16; the load that follows names the problem
    assert [checkpoint_parameters(m) for m in (tmp_path / "nothing", damaged, "~nobody-here/x")] == [None] * 3
    assert default_dtype("cuda", damaged) == default_dtype("cuda", "org/name") == "bfloat16"
    # a hub id is sized from its config.json in the local Hugging Face cache, as loading finds it
    snapshot = tmp_path / "hub" / "models--org--small" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(stories_path / "config.json", snapshot / "config.json")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert checkpoint_parameters("org/small") == checkpoint_parameters(stories_path)
    assert default_dtype("cuda", "org/small") == "float32" and default_dtype("cuda", "org/name") == "bfloat16"
    quantized, dense = tmp_path / "q8.gguf", tmp_path / "f32.gguf"
    tied = write_gguf(quantized, stories_path, "llama-gqa-tied", "Q8_0")
    write_gguf(dense, stories_path, "llama-gqa-tied", "F32")
    assert default_dtype("cpu", quantized) == "q4"
    # ... and one of float weights, a checkpoint directory, or a file with attention biases, in float32
    biased = tmp_path / "qwen2.gguf"
    qwen = write_gguf(biased, stories_path, "qwen2-bias-gqa", "Q4_1")
    for path, hf in ((quantized, tied), (biased, qwen)):  # tied embeddings; q/k/v biases
        assert checkpoint_parameters(path) == ModelConfig.from_hf(hf.config).parameters == hf.num_parameters()
    assert [default_dtype("cpu", m) for m in (dense, stories_path, biased)] == ["float32"] * 3
    assert parse_args(["--device", "cuda", "--dtype", "float16"]).dtype == "float16"
