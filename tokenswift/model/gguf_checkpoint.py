"""GGUF checkpoints (what llama.cpp, KoboldCpp, LM Studio and Ollama users hold), made loadable once.

A GGUF file's header is checked (gguf_header): architecture, tensor types and that every tensor's bytes are
inside the file. It is then turned into an ordinary Hugging Face directory: config.json, the tokenizer files and
chat template through transformers' GGUF support (from the file's metadata), and float32 model.safetensors here,
each tensor dequantized by the gguf package from the bytes the header locates, renamed, and llama.cpp's Q/K row
order undone (transformers' own tensor pass read the whole file again and took 18 of a 35 s conversion of the
default model; tests/test_gguf.py checks the two give the same tensors). That directory is cached, keyed by the
file's content hash, in the cache directory the caller passes (the app passes its data folder's; default:
$TOKENSWIFT_CACHE, else $XDG_CACHE_HOME/tokenswift), so a restart loads safetensors instead of dequantizing again,
and the rest of the engine sees one format.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tokenswift.model.errors import ModelLoadError
from tokenswift.model.gguf_header import read_header

if TYPE_CHECKING:
    import torch

ARCHITECTURES = ("llama", "mistral", "qwen2")
# The common types of published files; the gguf package dequantizes each of them.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SOURCE_NAME = "gguf_source.json"  # written last: a cache entry without it is incomplete
CACHE_ENV = "TOKENSWIFT_CACHE"  # overrides the default cache directory (named in the CLI's --model help)
# _metadata_read_once swaps an attribute of transformers' module, which every thread of the process shares: two
# conversions swapping at once (the app converts on request threads) could leave the wrapper installed for good.
_METADATA_LOCK = threading.Lock()


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    tensor_types: tuple[str, ...]
    context_length: int | None


def is_gguf(model: str | Path) -> bool:
    return str(model).lower().endswith(".gguf")


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read and check the file's header; every problem is one ModelLoadError naming the file."""
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} not found")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        header = read_header(path)
    except Exception as error:  # noqa: BLE001 - a damaged header raises several types
        raise ModelLoadError(f"GGUF file {path} is truncated or corrupt: {error}") from error
    arch = header.fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"GGUF file {path}: unsupported architecture {arch!r}; "
                             f"supported: {', '.join(ARCHITECTURES)}")
    size = path.stat().st_size
    types = set()
    for tensor in header.tensors.values():
        if tensor.kind not in TENSOR_TYPES:
            raise ModelLoadError(f"GGUF file {path}: tensor {tensor.name} has type {tensor.kind}, which is not "
                                 f"supported; supported: {', '.join(TENSOR_TYPES)}")
        if tensor.offset + tensor.n_bytes > size:
            raise ModelLoadError(f"GGUF file {path} is truncated: tensor {tensor.name} ends past the end of the file")
        types.add(tensor.kind)
    context = header.fields.get(f"{arch}.context_length")
    return GGUFInfo(path, arch, str(header.fields.get("general.name") or path.stem), tuple(sorted(types)),
                    int(context) if context is not None else None)


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """$TOKENSWIFT_CACHE, else $XDG_CACHE_HOME/tokenswift (~/.cache/tokenswift): a conversion can always be
    made again from its file, so it is a cache, not data."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokenswift"


def hf_directory(path: str | Path, cache_dir: Path | None = None, weights: bool = True) -> Path:
    """The Hugging Face directory made from a GGUF file: from cache_dir (None: default_cache_dir()), or converted
    now and cached there. weights=False: config and tokenizer only (a K-quant file on the q4 path reads its weights
    from the file itself, mapped.py; the app's prompt tokenizer), or a whole conversion already made."""
    path = Path(path).expanduser().resolve()
    info = inspect_gguf(path)
    sha = file_hash(path)
    whole = (cache_dir or default_cache_dir()) / f"{path.stem}-{sha[:16]}"
    dest = whole if weights else whole.with_name(whole.name + "-header")
    if source_record(dest):
        return dest
    if not weights and source_record(whole):  # a whole conversion holds the config and tokenizer too
        return whole
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _convert(info, sha, tmp, weights)
        shutil.rmtree(dest, ignore_errors=True)  # an incomplete entry from an interrupted conversion
        os.replace(tmp, dest)
    except OSError as error:
        raise ModelLoadError(f"cannot write the converted GGUF model to {dest.parent}: {error}") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def source_record(directory: Path) -> dict | None:
    """What a converted directory was made from (file, sha256, architecture, ...); None for other checkpoints."""
    try:
        return json.loads((directory / SOURCE_NAME).read_text())
    except (OSError, ValueError):
        return None


# llama.cpp's tensor names -> transformers' (per layer: blk.N.<name> -> model.layers.N.<name>).
MODEL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_TENSORS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
                 "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def hf_name(gguf_name: str) -> str | None:
    """transformers' name of a GGUF tensor, or None for one the model does not hold (rope_freqs: llama3's RoPE
    factors, which config.json carries)."""
    stem, _, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{kind}"
    return f"{MODEL_TENSORS[stem]}.{kind}" if stem in MODEL_TENSORS else None


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order for a llama file (its converter interleaves each head's two RoPE halves)."""
    return rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def gguf_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors in float32 under transformers' names, as transformers' GGUF loader gives them."""
    import torch  # here: the app's Model tab reads GGUF headers without torch

    header = read_header(path)
    arch = header.fields["general.architecture"]
    heads = {"attn_q": header.fields.get(f"{arch}.attention.head_count"),
             "attn_k": header.fields.get(f"{arch}.attention.head_count_kv")}
    tensors = {}
    for name, info in header.tensors.items():
        target = hf_name(name)
        if target is None:
            continue
        shape = tuple(reversed(info.shape))  # GGUF lists dimensions innermost first
        data = header.tensor_bytes(name).reshape(int(np.prod(shape[:-1])), -1)
        weights = dequantize(data, GGMLQuantizationType[info.kind]).reshape(shape)
        role = name.split(".")[2] if name.startswith("blk.") else ""
        if arch == "llama" and role in heads and heads[role]:
            weights = unpermute(weights, heads[role])
        tensors[target] = torch.from_numpy(np.array(weights, dtype=np.float32))
    return tensors


def _convert(info: GGUFInfo, sha256: str, out: Path, weights: bool = True) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    folder, name = info.path.parent, info.path.name
    try:
        with _metadata_read_once():
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        tensors = gguf_tensors(info.path) if weights else {}
    except Exception as error:  # noqa: BLE001 - a file the reader accepted can still fail to convert
        raise ModelLoadError(f"cannot convert GGUF file {info.path}: {type(error).__name__}: {error}") from error
    out.mkdir(parents=True)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if weights:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    source = {"file": str(info.path), "sha256": sha256, "architecture": info.architecture, "name": info.name,
              "tensor_types": list(info.tensor_types), "context_length": info.context_length}
    (out / SOURCE_NAME).write_text(json.dumps(source, indent=2))


@contextlib.contextmanager
def _metadata_read_once():
    """transformers' AutoConfig and AutoTokenizer each read a llama, mistral or qwen2 file's metadata with its
    legacy reader (load_gguf_checkpoint, which builds every field of the vocabulary and the merges: 8-9 s each for
    the default model, most of a first load); within this block the second call gets a copy of the first's
    result. Both call sites import the function when they run, so swapping the module's attribute reaches them;
    a transformers that reads otherwise just parses twice again."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with _METADATA_LOCK:
        read, results = gguf_utils.load_gguf_checkpoint, {}

        def read_once(path, *args, return_tensors=False, **kwargs):
            if args or return_tensors or kwargs:  # tensors, or a call this wrapper does not know: the real reader
                return read(path, *args, return_tensors=return_tensors, **kwargs)
            if str(path) not in results:
                results[str(path)] = read(path, return_tensors=False)
            return copy.deepcopy(results[str(path)])  # a caller may change what it is given

        gguf_utils.load_gguf_checkpoint = read_once
        try:
            yield
        finally:
            gguf_utils.load_gguf_checkpoint = read
