"""A GGUF file's header in one pass: its scalar and string metadata, and where each tensor's bytes are.

The gguf package's GGUFReader builds a numpy view of every element of every metadata array (a 49,152-token
vocabulary and its merges): 4.6 s for the default model's file on this machine, and a start read it three times
(the check, the q4 test, the q4 weights). What the engine takes from the header is read here in a tenth of a
second, arrays skipped; the gguf package still names the value and block types, and transformers' converter still
reads the whole file, once, the first time a file is converted (gguf_checkpoint).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
           GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
           GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str  # the block type's name: "Q4_1", "F32", ...
    shape: tuple[int, ...]  # as the file stores it, innermost first: (in_features, out_features) for a matrix
    offset: int  # of its first byte in the file
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    fields: dict[str, object]  # scalar and string values; an array's value is its length
    tensors: dict[str, TensorInfo]

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes, mapped from the file (read-only, nothing copied until used)."""
        info = self.tensors[name]
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.n_bytes,))


class _Cursor:
    def __init__(self, data: mmap.mmap):
        self.data, self.at = data, 0

    def take(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        size = self.take("Q")
        if self.at + size > len(self.data):
            raise ValueError("a string runs past the end of the file")
        text = self.data[self.at:self.at + size].decode("utf-8", errors="replace")
        self.at += size
        return text

    def value(self, kind: GGUFValueType):
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item, count = GGUFValueType(self.take("I")), self.take("Q")
            if item in SCALARS:
                self.at += count * struct.calcsize(SCALARS[item])
            elif item == GGUFValueType.STRING:  # skipped unread: decoding a vocabulary's strings took 0.2 s
                for _ in range(count):
                    self.at += 8 + struct.unpack_from("<Q", self.data, self.at)[0]
                if self.at > len(self.data):
                    raise ValueError("a string array runs past the end of the file")
            else:
                for _ in range(count):
                    self.value(item)
            return count
        return self.take(SCALARS[kind])


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at `path`; ValueError or struct.error if it is not one or is cut short."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if data[:4] != MAGIC:
            raise ValueError("it does not start with the GGUF magic bytes")
        cursor.at = 4
        version = cursor.take("I")
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version} (big-endian, or not supported: versions {VERSIONS})")
        n_tensors, n_fields = cursor.take("QQ")
        fields = {}
        for _ in range(n_fields):
            key = cursor.string()
            fields[key] = cursor.value(GGUFValueType(cursor.take("I")))
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = cursor.take(f"{cursor.take('I')}Q")
            shape = (dims,) if isinstance(dims, int) else tuple(dims)
            infos.append((name, GGMLQuantizationType(cursor.take("I")), shape, cursor.take("Q")))
        alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-cursor.at // alignment) * alignment
    tensors = {}
    for name, kind, shape, offset in infos:
        block, size = GGML_QUANT_SIZES[kind]
        tensors[name] = TensorInfo(name, kind.name, shape, start + offset, int(np.prod(shape)) * size // block)
    return GGUFHeader(path, fields, tensors)
