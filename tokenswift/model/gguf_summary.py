"""What a GGUF file is and what it will take to run, read from its header alone (the Model tab shows it before
anything loads): its quantization, parameters, context length, and the memory of a run at a context.

The memory is an estimate of what the engine holds: on the q4 path the file's blocks (mapped, or repacked at
about their size) plus float32 keys and values for every token of the context; in float32 or bfloat16 the
dequantized weights instead of the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import LlamaFileType

from tokenswift.model.gguf_header import read_header


@dataclass(frozen=True)
class GGUFSummary:
    quantization: str  # the file's type as llama.cpp names it ("Q4_K_M"), else its commonest block type by bytes
    parameters: int
    context_length: int | None
    file_bytes: int
    kv_bytes_per_token: int  # float32 keys and values of one token, every layer

    def memory_bytes(self, dtype: str, context: int) -> int:
        """Bytes a run in `dtype` holds with `context` tokens cached."""
        weights = {"q4": self.file_bytes, "float32": 4 * self.parameters, "float64": 8 * self.parameters}
        width = 8 if dtype == "float64" else 4 if dtype in ("q4", "float32") else 2
        return weights.get(dtype, 2 * self.parameters) + self.kv_bytes_per_token * width // 4 * context

    def describe(self, dtype: str) -> str:
        """One line: type, size, context, and the memory at the full context (and at 8K where that is less)."""
        parts = [self.quantization, f"{self.parameters / 1e9:.2f}B parameters" if self.parameters >= 1e9
                 else f"{self.parameters / 1e6:.0f}M parameters"]
        if self.context_length:
            parts.append(f"{self.context_length:,}-token context")
            contexts = sorted({min(8192, self.context_length), self.context_length})
            memory = " or ".join(f"{_size(self.memory_bytes(dtype, c))} at {c:,} tokens" for c in contexts)
            parts.append(f"about {memory} in {dtype}")
        return ", ".join(parts)


def _size(count: int) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


def summarize(path: Path) -> GGUFSummary:
    header = read_header(path)
    fields, tensors = header.fields, header.tensors.values()
    arch = fields.get("general.architecture")
    by_kind: dict[str, int] = {}
    for t in tensors:
        by_kind[t.kind] = by_kind.get(t.kind, 0) + t.n_bytes
    file_type = fields.get("general.file_type")
    names = {int(member): name.removeprefix("MOSTLY_") for name, member in LlamaFileType.__members__.items()}
    quantization = names.get(file_type) if isinstance(file_type, int) else None
    layers, kv_heads = fields.get(f"{arch}.block_count"), fields.get(f"{arch}.attention.head_count_kv")
    heads, dim = fields.get(f"{arch}.attention.head_count"), fields.get(f"{arch}.embedding_length")
    head_dim = fields.get(f"{arch}.attention.key_length") or (dim // heads if dim and heads else 0)
    context = fields.get(f"{arch}.context_length")
    return GGUFSummary(quantization or max(by_kind, key=by_kind.get, default="empty"),
                       sum(int(np.prod(t.shape)) for t in tensors), int(context) if context else None,
                       path.stat().st_size, 2 * int(layers or 0) * int(kv_heads or heads or 0) * int(head_dim) * 4)
