"""4-bit weights as the GGUF file stores them (`--dtype q4`): the CPU decoder's products read the file's blocks.
This is the path of files whose projections are all Q4_0, Q4_1 or Q8_0; K-quant files take mapped.py's.

Every layer's projections keep the file's Q4_0/Q4_1 blocks (Q8_0 is taken too), fused as the float model fuses
them (q/k/v, gate/up), and the LM head keeps the file's token-embedding (or output) blocks when they are
quantized: the weight bytes llama.cpp reads. The products are quant.QuantLinear's: activations stay float32 and
are quantized per block of 32 to int8 inside each product, as llama.cpp does; norms, RoPE, attention and the KV
cache are float32, as in the float32 model.

Its text is its own, not float32's (scripts/precision_quality.py measures how close), but TokenSwift in q4 writes
plain q4 decoding's: a verify batch runs these products row by row as a plain step does (native_rows.py), and
`bench` checks it. Exactness is proven in float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tokenswift.model.errors import ModelLoadError
from tokenswift.model.forward import Transformer
from tokenswift.model.gguf_header import GGUFHeader, TensorInfo, read_header
from tokenswift.model.native import kernels
from tokenswift.model.quant import KINDS, LEGACY, QuantLinear

PROJECTIONS = {  # our fused product -> the GGUF tensors whose rows it stacks
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"), "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"), "mlp.down_proj": ("ffn_down",),
}


def runs_quantized(gguf_path: Path) -> bool:
    """Whether `--dtype q4` can run this GGUF file: every layer's projections in blocks the kernel reads, no
    attention biases, and a C compiler to build the kernel with (native.kernels)."""
    try:
        names = {t.name: t.kind for t in read_header(gguf_path).tensors.values()}
    except Exception:  # noqa: BLE001 - a damaged file: loading it says what is wrong (gguf_checkpoint)
        return False
    shorts = [short for parts in PROJECTIONS.values() for short in parts]
    layers = {name.split(".")[1] for name in names if name.startswith("blk.")}
    if not layers or any(f"blk.{i}.attn_q.bias" in names for i in layers):
        return False
    if any(names.get(f"blk.{i}.{short}.weight") not in KINDS for i in layers for short in shorts):
        return False
    try:
        kernels()
    except ModelLoadError:
        return False
    return True


def llama_rows(rows: int, heads: int) -> torch.Tensor:
    """llama.cpp stores Llama's Q and K rows interleaved per head; this order undoes it (as transformers does)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def use_q4_weights(model: Transformer, gguf_path: Path, state: dict[str, torch.Tensor]) -> None:
    """Replace every layer's projections, and the LM head where the file quantizes it, by the GGUF file's own
    blocks. Each is checked against the float weight in `state` (our names, forward.fused_state), the checkpoint
    converted from the same file: a mismatch is a ModelLoadError."""
    if any(layer.self_attn.qkv_proj.bias is not None for layer in model.model.layers):
        raise ModelLoadError("--dtype q4 supports models without attention biases (Llama, Mistral); use bfloat16")
    header = read_header(gguf_path)
    tensors = header.tensors
    cfg = model.cfg
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}
    for i, layer in enumerate(model.model.layers):
        for attr, shorts in PROJECTIONS.items():
            owner, name = attr.split(".")
            reference = state[f"model.layers.{i}.{attr}.weight"].float()
            parts, row = [], 0
            for short in shorts:
                tensor = tensors.get(f"blk.{i}.{short}.weight")
                kind = tensor.kind if tensor is not None else "missing"
                if kind not in KINDS:
                    raise ModelLoadError(f"--dtype q4 needs Q4_0, Q4_1 or Q8_0 projections, or a K-quant mix's "
                                         f"({', '.join(k for k in KINDS if k not in LEGACY)}); {gguf_path.name} "
                                         f"stores blk.{i}.{short}.weight as {kind}: use float32 or bfloat16")
                linear = _blocks_linear(header, tensor, pack=len(shorts) == 1)
                want = reference[row:row + linear.out_features]
                if short in heads and not _close(linear, want):
                    order = llama_rows(linear.out_features, heads[short])
                    linear = QuantLinear(kind, linear.blocks[order], linear.out_features, linear.in_features,
                                         pack=len(shorts) == 1)
                if not _close(linear, want):
                    raise ModelLoadError(f"{gguf_path.name}: blk.{i}.{short}.weight does not match the model's own "
                                         "weight once unpacked; this file's layout is not supported by --dtype q4")
                parts.append(linear)
                row += linear.out_features
            setattr(getattr(layer, owner), name, _stacked(parts))
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if head is not None and head.kind in KINDS:
        linear = _blocks_linear(header, head)
        if not _close(linear, model.head_weight.float()):
            raise ModelLoadError(f"{gguf_path.name}: {head.name} does not match the model's LM head once unpacked")
        model.quantized_head = linear


def _blocks_linear(header: GGUFHeader, tensor: TensorInfo, pack: bool = True) -> QuantLinear:
    """pack=False: a part that _stacked packs once, fused with its neighbours."""
    in_features, out_features = tensor.shape
    blocks = torch.from_numpy(np.array(header.tensor_bytes(tensor.name)).reshape(out_features, -1))
    return QuantLinear(tensor.kind, blocks, out_features, in_features, pack)


def _stacked(parts: list[QuantLinear]) -> QuantLinear:
    """One product whose rows are the parts' rows in order (parts of one kind, as a file's layer stores them)."""
    if len(parts) == 1:
        return parts[0]
    kinds = {p.kind for p in parts}
    if len(kinds) != 1:
        raise ModelLoadError(f"--dtype q4 fuses q/k/v and gate/up; this file mixes block types {sorted(kinds)}")
    return QuantLinear(parts[0].kind, torch.cat([p.blocks for p in parts]), sum(p.out_features for p in parts),
                       parts[0].in_features)


def _close(linear: QuantLinear, reference: torch.Tensor) -> bool:
    """Whether the blocks hold the float weight (dequantized from the same blocks, float16 scales: equal to rounding),
    on the first and last 64 rows: a layout the kernels do not read (llama.cpp's Q and K row order, a transposed or
    shifted weight) moves the rows of every head, and the whole weights took 2 of a 5 s load."""
    rows = torch.arange(linear.out_features)
    rows = rows if len(rows) <= 128 else torch.cat((rows[:64], rows[-64:]))
    return torch.allclose(linear.dequantized(rows), reference[rows], rtol=1e-3, atol=1e-5)
