"""A small reference quantizer for the K-quant blocks (numpy): float weights -> Q4_K, Q5_K or Q6_K blocks as
llama.cpp lays them out, and Q5_0/Q5_1 by the gguf package's own quantizer (it has none for the K kinds). It makes
the project's test and benchmark files (scripts/make_kquant_files.py); the gguf package's dequantize reads them
back (tests/test_kquant_ref.py).

The scales are chosen the plain way (each sub-block's range, then the super-block's largest scale over 63 or
127), not by llama.cpp's search for the least squared error: its files are a little closer to their float
weights, with the same layout and the same cost to multiply.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

QK_K = 256
K_KINDS = ("Q4_K", "Q5_K", "Q6_K")


def quantize(weight: np.ndarray, kind: str) -> np.ndarray:
    """weight [rows, cols] float -> [rows, cols / block * block bytes] uint8 blocks of `kind`."""
    rows, cols = weight.shape
    if kind not in K_KINDS:
        return gguf_quantize(weight.astype(np.float32), GGMLQuantizationType[kind]).reshape(rows, -1)
    if cols % QK_K:
        raise ValueError(f"{kind} needs rows of whole super-blocks of {QK_K}; got {cols} columns")
    blocks = weight.astype(np.float32).reshape(-1, QK_K)
    packed = _q6_k(blocks) if kind == "Q6_K" else _q45_k(blocks, 31 if kind == "Q5_K" else 15)
    return packed.reshape(rows, -1)


def _half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(len(values), 2)


def _q45_k(x: np.ndarray, top: int) -> np.ndarray:
    """Q4_K (top 15) or Q5_K (top 31): w = d sc q - dmin mn per sub-block of 32, sc and mn 6-bit."""
    sub = x.reshape(len(x), 8, 32)
    low = np.maximum(-sub.min(-1), 0.0)  # each sub-block's minimum, made non-negative: x + low >= 0
    scale = (sub.max(-1) + low) / top
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (low.max(-1) / 63).astype(np.float16)
    sc = _levels(scale, d, 63)
    mn = _levels(low, dmin, 63)
    step = d.astype(np.float32)[:, None] * sc
    offset = dmin.astype(np.float32)[:, None] * mn
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] > 0, np.rint((sub + offset[..., None]) / step[..., None]), 0)
    q = np.clip(q, 0, top).astype(np.uint8).reshape(len(x), 4, 2, 32)  # chunks of 64: two sub-blocks each
    qs = (q[:, :, 0] & 0x0F) | ((q[:, :, 1] & 0x0F) << 4)
    parts = [_half(d), _half(dmin), _pack_scales(sc, mn)]
    if top == 31:  # Q5_K: bit s of qh[l] is the fifth bit of weight 32 s + l
        fifth = (q.reshape(len(x), 8, 32) >> 4).astype(np.uint8)
        parts.append(np.bitwise_or.reduce(fifth << np.arange(8, dtype=np.uint8)[None, :, None], axis=1))
    return np.concatenate([*parts, qs.reshape(len(x), 128)], axis=1)


def _levels(values: np.ndarray, unit: np.ndarray, top: int) -> np.ndarray:
    """values / unit rounded to integers in [0, top] (0 where unit is 0)."""
    unit = unit.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.clip(np.where(unit > 0, np.rint(values / unit), 0), 0, top).astype(np.uint8)


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and minimums in 12 bytes: the first four of each in the low 6 bits of bytes 0..7, the
    last four's low nibbles in bytes 8..11 and their top 2 bits above the first four's."""
    out = np.empty((len(sc), 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K: w = d sc (q - 32) per group of 16, sc int8, q 6-bit."""
    groups = x.reshape(len(x), 16, 16)
    scale = np.abs(groups).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16)
    sc = _levels(scale, d, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] > 0, np.rint(groups / step[..., None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(len(x), 2, 4, 32)  # halves of 128, quarters of 32
    ql = np.concatenate([(q[:, :, 0] & 0x0F) | ((q[:, :, 2] & 0x0F) << 4),
                         (q[:, :, 1] & 0x0F) | ((q[:, :, 3] & 0x0F) << 4)], axis=2)  # [n, 2, 64]
    qh = np.bitwise_or.reduce((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None], axis=2)
    return np.concatenate([ql.reshape(len(x), 128), qh.reshape(len(x), 64), sc.view(np.uint8), _half(d)], axis=1)
