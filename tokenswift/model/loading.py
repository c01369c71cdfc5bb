"""Loading Hugging Face–format checkpoints: a local directory, or a hub id found in the local cache.

Weights load onto the `meta` device and are then assigned, so a model is never materialised twice.
Checkpoints are safetensors (single or sharded) or PyTorch .bin files; any failure names what was looked
for and why it failed. Official TokenSwift checkpoints carry their draft heads in the same files
(`model.medusa_layers.{j}.*`): those are picked up as the model's heads.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from tokenswift.model import gguf_checkpoint, mapped
from tokenswift.model.attention import FlexKernel
from tokenswift.model.config import ModelConfig, UnsupportedModelError
from tokenswift.model.default_model import DRAFT_SUBDIR, HEADS_SUBDIR, shipped_draft, shipped_heads
from tokenswift.model.draft_layer import DraftLayer, DraftLayerError, load_layer
from tokenswift.model.errors import ModelLoadError
from tokenswift.model.forward import Transformer, fused_state
from tokenswift.model.heads import DraftHeads, heads_from_state_dict, load_heads
from tokenswift.model.hf_files import context_limit, is_hub_id, load_tokenizer, read_config
from tokenswift.model.int4 import use_q4_weights
from tokenswift.model.kv_q8 import Q8
from tokenswift.model.native_rows import NativeRows
from tokenswift.model.rope import rope_table
from tokenswift.settings import KV_CACHES, ROPE_SLACK, threads_problem

# "q4": the GGUF file's quantized projections with float32 activations (int4.py; K-quant files: mapped.py), CPU
# only.
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "q4": torch.float32}


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: Transformer
    tokenizer: object
    hf_config: object
    heads: DraftHeads | None
    device: torch.device
    dtype: torch.dtype
    random_heads: bool = False  # the draft heads are random (benchmarks of pass costs), not trained
    weights: str = "float"  # "q4": every layer's projections are the GGUF file's 4-bit blocks
    draft_layer: DraftLayer | None = None  # the autoregressive drafter's layer (draft_layer.py)
    draft_error: str | None = None  # why a draft layer found beside the model could not be used
    draft_model: LoadedModel | None = None  # a smaller model with its tokenizer that drafts (model_drafter.py)
    threads: int | None = None  # torch's intra-op threads while it runs (load_model: cpu_threads); None: torch's
    kv_cache: str = "float32"  # "bf16", "q8": engines keep keys and values compact (compact_cache); else full precision
    flex: FlexKernel = field(default_factory=FlexKernel)  # the fast path's FlexAttention, compiled for this model

    @contextmanager
    def running(self) -> Iterator[None]:
        """Torch's intra-op threads set to the model's for the block, and set back after: the pool is the process's,
        so a model swapped in later runs on its own count, never on its predecessor's."""
        before = torch.get_num_threads()
        if self.threads is not None and self.threads != before:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)

    @property
    def precision(self) -> str:
        """What --dtype loaded it: q4, or the dtype of its weights and activations."""
        return "q4" if self.weights == "q4" else str(self.dtype).removeprefix("torch.")

    @property
    def cache_dtype(self) -> torch.dtype:
        """The element of its engines' KV caches: every pass of a run (plain steps, drafts, verify rows, prefill and
        replay) reads the values stored there, so the text depends on it as on the weights' precision."""
        return {"bf16": torch.bfloat16, "q8": Q8}.get(self.kv_cache, self.dtype)

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @property
    def max_context(self) -> int:
        return context_limit(self.hf_config)

    def check_positions(self, length: int) -> None:
        """Positions [0, length) must lie in the RoPE table, allocated once at load (rope_positions): captured
        graphs read it, so it is never swapped for a longer one."""
        table = self.model.rope_cos.shape[0]
        if length > table:
            raise ValueError(f"positions up to {length - 1} lie beyond the RoPE table ({table} positions: the "
                             f"model's context of {self.max_context} + {ROPE_SLACK} for candidate rows)")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Tokens that end a text: the config's and the tokenizer's end-of-sequence, and `<|endoftext|>` where it
        is a special token (chat models such as SmolLM2-Instruct end turns with <|im_end|> but documents with it).
        A model without a tokenizer (bench.shapes' random weights) ends on its config's alone."""
        ids = set(self.config.eos_token_ids)
        if self.tokenizer is None:
            return tuple(sorted(ids))
        ids |= {self.tokenizer.eos_token_id} - {None}
        special = dict(zip(self.tokenizer.all_special_tokens, self.tokenizer.all_special_ids, strict=False))
        if "<|endoftext|>" in special:
            ids.add(special["<|endoftext|>"])
        return tuple(sorted(ids))

    @functools.cached_property
    def token_texts(self) -> tuple[str, ...]:
        """Each token id's text, decoded once per loaded model (DRY's sequence breakers are found in them)."""
        return tuple(self.tokenizer.batch_decode([[i] for i in range(self.config.vocab_size)]))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def memory_bytes(self) -> int:
        tensors = list(self.model.parameters()) + (list(self.heads.parameters()) if self.heads else [])
        own = sum(t.numel() * t.element_size() for t in tensors)
        return own + (self.draft_model.memory_bytes() if self.draft_model is not None else 0)


SMALL_MODEL_PARAMS = 100_000_000


def cpu_threads(lm: LoadedModel, spare_cores: int = 0) -> int | None:
    """The intra-op thread count to use when none was asked for (None off a CPU): 1 for small models, else the
    cores this process may run on less `spare_cores`, the ones other work on this machine needs (the app's page
    server and the writer's browser).

    A small model's step is thousands of tiny ops; with two threads each op waits for the second one, and on
    a busy machine that thread is often descheduled: measured here, 400 tokens took 3m44s with 2 threads and
    13 s with 1. Larger products gain from more cores, but only from cores nothing else wants: a thread that
    shares its core with a browser redrawing the page stalls every op of the step on the other threads."""
    if lm.device.type != "cpu":
        return None
    if sum(p.numel() for p in lm.model.parameters()) < SMALL_MODEL_PARAMS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS
    return max(1, cores - spare_cores)


def resolve_device(device: str) -> torch.device:
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"unknown device {device!r}: use cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device cuda requested but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_path(model: str) -> Path:
    """A local directory, or a hub id resolved through the local Hugging Face cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"model path {model!r} is a file; expected a checkpoint directory")
    if not is_hub_id(model):
        raise ModelLoadError(f"model {model!r} not found: no such directory, and it is not a hub id (org/name)")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt"]
    try:
        return Path(snapshot_download(model, local_files_only=True, allow_patterns=patterns))
    except Exception as cached_error:  # noqa: BLE001 - any cache miss falls through to the clear message
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
            raise ModelLoadError(
                f"model {model!r} not found: no local directory of that name and no copy in the Hugging Face "
                f"cache (HF_HOME={os.environ.get('HF_HOME', '~/.cache/huggingface')}), and HF_HUB_OFFLINE=1 "
                "forbids downloading. Download it where there is network access, or pass a local directory."
            ) from cached_error
    try:
        return Path(snapshot_download(model, allow_patterns=patterns))
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(
            f"model {model!r} not found locally and could not be downloaded ({type(error).__name__}); "
            "pass a local checkpoint directory"
        ) from error


def _weight_files(path: Path) -> list[Path]:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            missing = [s for s in shards if not (path / s).exists()]
            if missing:
                raise ModelLoadError(f"{index} lists shards that are missing: {', '.join(missing)}")
            return [path / s for s in shards]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (path / single).exists():
            return [path / single]
    raise ModelLoadError(f"no weights in {path}: looked for model.safetensors(.index.json) and pytorch_model.bin")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        try:
            if file.suffix == ".safetensors":
                state.update(load_file(str(file)))
            else:
                state.update(torch.load(file, map_location="cpu", weights_only=True, mmap=True))
        except Exception as error:  # noqa: BLE001 - a corrupt file must name itself
            raise ModelLoadError(f"corrupt checkpoint file {file}: {error}") from error
    return state


def build_model(cfg: ModelConfig, state: dict[str, torch.Tensor], device, dtype) -> Transformer:
    """Our Transformer holding `state`'s weights (transformers' names or ours, forward.fused_state)."""
    state = fused_state(state)
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise ModelLoadError(f"tensor {name} has shape {tuple(state[name].shape)}, expected {tuple(ref.shape)}")
    weights = {name: state[name].to(device=device, dtype=dtype) for name in expected}
    model.load_state_dict(weights, assign=True, strict=True)
    return model.eval().requires_grad_(False)


def rope_positions(hf) -> int:
    """The RoPE table's length: the model's context plus room for one iteration's candidate rows past it."""
    return context_limit(hf) + ROPE_SLACK


def load_model(model: str, *, device: str = "cpu", dtype: str = "float32", heads: str | None = None,
               draft: str | None = None, cache_dir: Path | None = None, threads: int | None = None,
               spare_cores: int = 0, kv_cache: str = "auto") -> LoadedModel:
    """model: a checkpoint directory, a hub id in the local cache, or a .gguf file (converted once, cached in
    cache_dir; None: gguf_checkpoint.default_cache_dir()).
    heads: a heads directory; None looks for `<model>/heads`, heads inside an official checkpoint, or shipped
    heads trained for this GGUF file; "none" disables them. draft: a draft layer directory, the same way
    (`<model>/draft`, or the one shipped for this GGUF file). threads: the model's intra-op threads
    (LoadedModel.running); None: cpu_threads(spare_cores). kv_cache: compact_cache's choice (auto: bf16 for q4)."""
    if problem := threads_problem(threads):
        raise ValueError(problem)

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    # A K-quant file on the q4 path is read where it lies (mapped.py): its cache entry needs no weights (config and
    # tokenizer only, or a whole conversion already made).
    in_place = dtype == "q4" and gguf_checkpoint.is_gguf(model) and mapped.reads_in_place(Path(model))
    if gguf_checkpoint.is_gguf(model):
        path = gguf_checkpoint.hf_directory(model, cache_dir, weights=not in_place)
    else:
        path = resolve_path(model)
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face checkpoint directory")
    try:
        hf = read_config(path)
        cfg = ModelConfig.from_hf(hf)
    except UnsupportedModelError as error:
        raise ModelLoadError(str(error)) from error
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {error}") from error
    if dtype == "q4" and (not gguf_checkpoint.is_gguf(model) or dev.type != "cpu"):
        raise ModelLoadError("--dtype q4 runs a GGUF file's 4-bit weights on the CPU; "
                             f"{model} on {dev.type} is not that: use float32 or bfloat16")
    if in_place:
        state, net = {}, mapped.mapped_model(Path(model), cfg)
    else:
        state = fused_state(read_state_dict(path))
        net = build_model(cfg, state, dev, dt)
        if dtype == "q4":
            use_q4_weights(net, Path(model), state)
    net.set_rope(*rope_table(hf, rope_positions(hf), dev, dt))
    net.native = NativeRows.for_model(net)
    try:
        tokenizer = load_tokenizer(path)
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(f"cannot load the tokenizer from {path}: {error}") from error
    draft_heads = _pick_heads(path, heads, state, cfg, dev, dt)
    layer, draft_error = _pick_draft(path, draft, net, dev, dt)
    weights = "q4" if dtype == "q4" else "float"
    lm = LoadedModel(model, path, net, tokenizer, hf, draft_heads, dev, dt, weights=weights, draft_layer=layer,
                     draft_error=draft_error)
    lm.threads = threads or cpu_threads(lm, spare_cores)
    return compact_cache(lm, kv_cache)


def _pick_heads(path: Path, heads: str | None, state, cfg: ModelConfig, device, dtype) -> DraftHeads | None:
    if heads == "none":
        return None
    if heads is not None:
        return load_heads(Path(heads), cfg, device, dtype)
    if (path / HEADS_SUBDIR / "heads_config.json").exists():
        return load_heads(path / HEADS_SUBDIR, cfg, device, dtype)
    source = gguf_checkpoint.source_record(path)
    if source and (shipped := shipped_heads(source["sha256"])):
        return load_heads(shipped, cfg, device, dtype)
    embedded = heads_from_state_dict(state, cfg)
    return embedded.to(device=device, dtype=dtype) if embedded is not None else None


def _pick_draft(path: Path, draft: str | None, net: Transformer, device, dtype) -> tuple[DraftLayer | None, str | None]:
    """The draft layer and, when one found beside the model is unusable, why (the model still loads: the app
    drafts with the heads instead and says so). One asked for by path must load, or the error is raised.

    A float32 model on a CPU drafts through the model's C kernels (native_rows: the draft layer's block is two
    calls, ~2 ms a row here); without them it drafts in bfloat16, where torch's operators read half the bytes
    (drafts only propose: verification decides the text)."""
    if draft == "none":
        return None, None
    if device.type == "cpu" and dtype == torch.float32 and net.native is None:
        dtype = torch.bfloat16
    if draft is not None:
        return load_layer(Path(draft), net.cfg, net.head_weight, device, dtype), None
    found = path / DRAFT_SUBDIR if (path / DRAFT_SUBDIR / "draft_config.json").exists() else None
    source = gguf_checkpoint.source_record(path)
    if found is None and source:
        found = shipped_draft(source["sha256"])
    if found is None:
        return None, None
    try:
        return load_layer(found, net.cfg, net.head_weight, device, dtype), None
    except DraftLayerError as error:
        return None, str(error)


def compact_cache(lm: LoadedModel, kind: str) -> LoadedModel:
    """lm with its engines' KV cache in `kind`: "float32" (full precision, the model's own dtype), "bf16", half the
    bytes for every step to read, or "q8" (kv_q8.py: 8-bit integers and a scale per head and slot, 68 bytes where
    bf16 takes 128), for a float32 or q4 model on the CPU (the C kernels read them; float64, where exactness is
    proven, keeps a full-precision cache); "auto": for q4, the app's CPU configuration, q8 where the kernels take
    its products by VNNI or AVX2 for the model's heads (attention_q8_fast: 64 or 128 wide) and bf16 elsewhere, else
    full precision.
    Chosen by measurement (scripts/bench_kv_cache.py: the default model in q4, 1,000 held-out tokens after a
    6,000-token opening of two eval books, each row computed as a plain step computes it): the likeliest next token
    is the float32 cache's at 95.3% / 97.5% of positions for q8 (mean KL 0.0038 / 0.0032) and 96.8% / 97.9% for
    bf16 (0.0023 / 0.0020), and the book's own next token at 37.5% / 41.5% for q8, 37.5% / 41.2% for bf16 and
    37.6% / 41.2% for float32: no loss a reader would see, while a plain step at a 7.7K context takes 12.7 ms over
    q8 against 17.7 over bf16 (AVX-512); on an AVX2-only EPYC 35-39 ms against 44-51 (2K: 21-24 against 23-27).
    Raises ValueError where it does not apply."""
    if kind == "auto":
        kind = "float32"
        if lm.weights == "q4":
            native = lm.model.native
            kind = "q8" if native is not None and native.lib.attention_q8_fast(lm.config.head_dim) else "bf16"
    if kind not in KV_CACHES:
        raise ValueError(f"kv-cache: expected one of {', '.join(KV_CACHES)}, got {kind!r}")
    if kind in ("bf16", "q8") and (lm.device.type != "cpu" or lm.dtype != torch.float32):
        raise ValueError(f"kv-cache {kind}: for float32 or q4 models on the CPU, not {lm.precision} on "
                         f"{lm.device.type}")
    return replace(lm, kv_cache=kind)
