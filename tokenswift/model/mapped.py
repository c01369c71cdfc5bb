"""K-quant GGUF files on the q4 path, read where they lie (`--dtype q4`).

A file whose layers hold Q4_K, Q5_K, Q6_K, Q5_0 or Q5_1 blocks (what writers download: Q4_K_M, Q5_K_M, Q6_K) is
mapped into memory once, and every product reads its blocks from that map (quant.py, kquant_kernels.c), or, where
this CPU has AVX-512 VNNI, from a copy repacked sixteen rows a group (every kind here; on AVX2, the Q4_0, Q4_1 and
Q8_0 tensors of a mix, eight rows a group), whose file pages are then handed back: no float copy, no dequantized
cache directory, so the resident memory is about the file plus the KV cache. A layer's
q/k/v and gate/up stay separate weights behind one product (quant.StackedQuant): a mix stores attn_v or ffn_down
in another kind than its neighbours. The token embedding stays in blocks too and is dequantized row by row on
lookup (quant.QuantEmbedding); the norms, a few KiB, are copied out in float32. Only Llama's Q and K rows are
copied, reordered: llama.cpp stores them interleaved per rotary pair.

Files whose projections are all Q4_0, Q4_1 or Q8_0 keep their own path (int4.py: checked against a float
conversion of the same file, which the default model's shipped drafters read).
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tokenswift.model.config import ModelConfig
from tokenswift.model.errors import ModelLoadError
from tokenswift.model.forward import Transformer
from tokenswift.model.gguf_checkpoint import hf_name
from tokenswift.model.gguf_header import GGUFHeader, read_header
from tokenswift.model.int4 import PROJECTIONS, llama_rows
from tokenswift.model.quant import KINDS, LEGACY, BlockProduct, QuantEmbedding, QuantLinear, StackedQuant

LIBC = ctypes.CDLL(None, use_errno=True)


def reads_in_place(gguf_path: Path) -> bool:
    """Whether q4 runs this file from its mapped blocks: every layer's projections in a kind the kernels read, and
    some in a kind beyond Q4_0/Q4_1/Q8_0."""
    try:
        tensors = read_header(gguf_path).tensors
    except Exception:  # noqa: BLE001 - a damaged file: loading it says what is wrong (gguf_checkpoint)
        return False
    kinds = {t.kind for name, t in tensors.items() if name.startswith("blk.") and _projection(name)}
    return bool(kinds) and kinds <= set(KINDS) and not kinds <= set(LEGACY)


def _projection(name: str) -> bool:
    return name.endswith(".weight") and any(name.split(".")[2] in shorts for shorts in PROJECTIONS.values())


def mapped_model(gguf_path: Path, cfg: ModelConfig) -> Transformer:
    """The model of a K-quant file, its products reading the file's blocks through one memory map."""
    header = read_header(gguf_path)
    if any(name.endswith("attn_q.bias") for name in header.tensors):
        raise ModelLoadError("--dtype q4 supports models without attention biases (Llama, Mistral); use bfloat16")
    # Copy-on-write: torch wants a writable array; nothing writes, so every page stays the file's page cache.
    file = torch.from_numpy(np.memmap(gguf_path, dtype=np.uint8, mode="c"))
    with torch.device("meta"):
        model = Transformer(cfg)
    llama = header.fields.get("general.architecture") == "llama"
    for i, layer in enumerate(model.model.layers):
        for attr, shorts in PROJECTIONS.items():
            owner, name = attr.split(".")
            reorder = llama and shorts[0] == "attn_q"  # Q and K are packed once reordered
            parts = [_blocks(header, file, f"blk.{i}.{short}.weight", pack=not (reorder and short != "attn_v"))
                     for short in shorts]
            if reorder:  # Q then K rows back into Hugging Face's order (a copy of them)
                parts[:2] = [_reordered(p, heads) for p, heads in zip(parts[:2], (cfg.n_heads, cfg.n_kv_heads),
                                                                      strict=True)]
            product = parts[0] if len(parts) == 1 else StackedQuant(parts)
            expected = getattr(getattr(layer, owner), name).weight.shape
            if (product.out_features, product.in_features) != tuple(expected):
                raise ModelLoadError(f"{gguf_path.name}: layer {i}'s {attr} is {product.out_features}x"
                                     f"{product.in_features}, the model's config says {tuple(expected)}")
            setattr(getattr(layer, owner), name, product)
    _embedding_and_head(model, header, file)
    for module in model.modules():  # prefill runs the kernels too: no float copy of any weight, ever
        if isinstance(module, BlockProduct):
            module.dense_rows = None
    model.load_state_dict(_float_tensors(header, model), assign=True, strict=False)
    left = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise ModelLoadError(f"{gguf_path.name} is missing {len(left)} tensors, e.g. {left[:3]}")
    return model.eval().requires_grad_(False)


def _blocks(header: GGUFHeader, file: torch.Tensor, name: str, pack: bool = True) -> QuantLinear:
    tensor = header.tensors.get(name)
    if tensor is None or tensor.kind not in KINDS:
        raise ModelLoadError(f"--dtype q4 needs every projection in one of {', '.join(KINDS)}; "
                             f"{header.path.name} stores {name} as {tensor.kind if tensor else 'nothing'}")
    in_features, out_features = tensor.shape
    blocks = file[tensor.offset:tensor.offset + tensor.n_bytes].view(out_features, -1)
    linear = QuantLinear(tensor.kind, blocks, out_features, in_features, pack)
    if linear.product_weight is not blocks:
        _hand_back(blocks)
    return linear


def _hand_back(blocks: torch.Tensor) -> None:
    """A packed weight's products read its copy (and prefill runs them too, with no float GEMM: tiles of rows are
    as fast here), so its file pages are not read again: they are handed back as soon as it is packed (madvise
    DONTNEED; a read maps them again from the file), and the resident memory stays about the file's size. Only
    for the file's own pages: a copy's would read back as zeros."""
    start = -(-blocks.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (blocks.data_ptr() + blocks.numel()) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


def _reordered(part: QuantLinear, heads: int) -> QuantLinear:
    """Llama's Q or K rows of a file's view in Hugging Face's order: a copy, the file's pages handed back."""
    linear = QuantLinear(part.kind, part.blocks[llama_rows(part.out_features, heads)], part.out_features,
                         part.in_features)
    _hand_back(part.blocks)
    return linear


def _embedding_and_head(model: Transformer, header: GGUFHeader, file: torch.Tensor) -> None:
    """The embedding and LM head kept in blocks where the file quantizes them; a tied head is the embedding's own
    blocks. An untied head's float weight (drafters read it) comes, like a tied one's, from its table on demand."""
    table, head = header.tensors.get("token_embd.weight"), header.tensors.get("output.weight")
    if table is not None and table.kind in KINDS:  # packed only where it is the head too
        model.model.embed_tokens = QuantEmbedding(_blocks(header, file, table.name, pack=head is None))
        if head is None:
            model.quantized_head = model.model.embed_tokens.table
            if not model.cfg.tie_embeddings:  # the file ties what the config does not
                model.lm_head = model.model.embed_tokens
    if head is not None and head.kind in KINDS:
        model.quantized_head = _blocks(header, file, head.name)
        if not model.cfg.tie_embeddings:
            model.lm_head = QuantEmbedding(model.quantized_head)


def _float_tensors(header: GGUFHeader, model: Transformer) -> dict[str, torch.Tensor]:
    """The tensors the model still lacks (norms; a float embedding or head), in float32 under our names."""
    wanted = {name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta}
    out = {}
    for name, info in header.tensors.items():
        ours = hf_name(name)
        if ours not in wanted:
            continue
        shape = tuple(reversed(info.shape))
        data = header.tensor_bytes(name).reshape(int(np.prod(shape[:-1])), -1)
        out[ours] = torch.from_numpy(np.array(dequantize(data, GGMLQuantizationType[info.kind]), dtype=np.float32)
                                     .reshape(shape))
    return out

