"""What a run takes when it names no device or dtype: one rule for the CLI, the app and its worker."""

from __future__ import annotations

from pathlib import Path

import torch

from tokenswift.model import gguf_checkpoint
from tokenswift.model.config import ModelConfig
from tokenswift.model.gguf_summary import summarize
from tokenswift.model.hf_files import is_hub_id, read_config
from tokenswift.model.int4 import runs_quantized

# Up to here a model's float32 weights (2 GB) take under a millisecond to read on an H100/H200-class card (~2 TB/s
# and up): less than the launches of its step. Measured on an H200 only; a card with less bandwidth may read a
# 300-500M model faster in bfloat16 (--dtype bfloat16).
CUDA_FLOAT32_PARAMS = 500_000_000


def default_device() -> str:
    """The GPU where there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str, model: str | Path | None = None) -> str:
    """On a GPU, float32 for a model of up to CUDA_FLOAT32_PARAMS parameters, else bfloat16 (its fused kernels, and
    half of float32's bytes to read per step). A small model's GPU step is bound by its kernel launches, not its
    bytes: the default model ran 341-377 plain tokens/s in float32 at 2K against 359 in bfloat16 on an H200's fast
    path, and a verify batch rounds its products unlike a one-row step far less often in float32: TokenSwift wrote
    plain decoding's 1,024 tokens in each of seven float32 runs there, where bfloat16 parted from them at tokens 22
    to 193.
    On a CPU, "q4" for a GGUF file whose layers are blocks the kernels read (quant.KINDS: Q4_0/Q4_1/Q8_0, K-quant
    mixes): the file's own weights by the integer kernels (quant.py), the fastest precision here, with its text
    measured against float32's (scripts/precision_quality.py); else float32 (bfloat16 products are no faster on a
    CPU)."""
    if device.startswith("cuda"):
        count = checkpoint_parameters(model) if model is not None else None
        return "float32" if count is not None and count <= CUDA_FLOAT32_PARAMS else "bfloat16"
    if model is not None and gguf_checkpoint.is_gguf(model) and Path(model).is_file() and runs_quantized(Path(model)):
        return "q4"
    return "float32"


def checkpoint_parameters(model: str | Path) -> int | None:
    """The parameters of a GGUF file, a checkpoint directory or a hub id's copy in the local Hugging Face cache, from
    its header or config.json (no weights read); None where it is none of these, or unreadable (the load that
    follows names the problem)."""
    try:
        path = Path(model).expanduser()
        if path.is_file() and gguf_checkpoint.is_gguf(path):
            return summarize(path).parameters
        if not path.exists() and is_hub_id(str(model)):
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(model), "config.json")
            path = Path(cached).parent if isinstance(cached, str) else path
        if (path / "config.json").is_file():
            return ModelConfig.from_hf(read_config(path)).parameters
    except Exception:  # noqa: BLE001 - a damaged header or config raises several types; a default must not
        return None
    return None
