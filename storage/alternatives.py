"""Each generated token's likeliest alternatives, packed into a chunk's `alternatives` column.

Layout, little-endian: one byte k (alternatives per token), then for each of the chunk's n tokens its probability
and its k alternatives' probabilities (float32, n * (1 + k)), then the alternatives' token ids (int32, n * k; -1
where a slot is empty). 44 bytes a token for k = 5: about 11 times the token ids themselves, 4.4 MB for a
100K-token book. The worker writes them with each chunk (tokenswift/sampling/alternatives.py records them); storage does
not import the engine, so the records are read through the Recorded protocol.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Recorded(Protocol):
    """What packing needs of tokenswift.sampling.alternatives.Alternatives."""

    probability: float
    ids: tuple[int, ...]
    probs: tuple[float, ...]


@dataclass(frozen=True)
class Choices:
    """One token's alternatives as stored."""

    probability: float  # of the token that was written
    ids: tuple[int, ...]  # likeliest first; -1: an empty slot
    probs: tuple[float, ...]


def pack(records: Sequence[Recorded]) -> bytes:
    k = len(records[0].ids) if records else 0
    if any(len(r.ids) != k or len(r.probs) != k for r in records) or k > 255:
        raise ValueError("every token needs the same number (at most 255) of alternatives")
    probs = array("f", [p for r in records for p in (r.probability, *r.probs)])
    ids = array("i", [i for r in records for i in r.ids])
    return bytes([k]) + _little(probs).tobytes() + _little(ids).tobytes()


def unpack(data: bytes) -> list[Choices]:
    k = data[0]
    n = (len(data) - 1) // (4 * (1 + 2 * k))
    probs, ids = array("f"), array("i")
    split = 1 + 4 * n * (1 + k)
    probs.frombytes(data[1:split])
    ids.frombytes(data[split:])
    probs, ids = _little(probs), _little(ids)
    return [Choices(probs[t * (1 + k)], tuple(ids[t * k:(t + 1) * k]), tuple(probs[t * (1 + k) + 1:(t + 1) * (1 + k)]))
            for t in range(n)]


def _little(values: array) -> array:
    """`values` in little-endian order (a copy on a big-endian machine), as pack_ids stores token ids."""
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    return values
