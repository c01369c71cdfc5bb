"""Memory a step streams through, on 2 MiB pages where the kernel allows.

A decoding step on a CPU reads every packed weight once and, at a long context, tens of MB of keys and values: on
4 KiB pages (torch.empty's) each page costs a TLB miss and a page walk, and the hardware prefetchers stop at every
page. Linux's transparent huge pages (its "madvise" mode, the default) back memory asked for with 2 MiB pages.
"""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 << 20


def huge_pages(size: int) -> torch.Tensor:
    """size bytes of zeroed anonymous memory asked to be backed by 2 MiB pages (as uint8). From 2 MiB on it starts on
    a 2 MiB boundary (mmap aligns to 4 KiB: up to a huge page's worth at the start stayed on small pages); a smaller
    block keeps 4 KiB pages, as a whole huge page for it would waste the rest. Measured here: the Q4_K products of the
    1B shape ran at half the speed on 4 KiB pages (0.89 ms vs 0.42 for an 8192x2048 weight), and a q4 step at a 7K
    context 2-4% slower over a q8 cache on them."""
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    spare = HUGE_PAGE if size >= HUGE_PAGE else 0
    pages = mmap.mmap(-1, size + spare, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        pages.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(pages, dtype=torch.uint8, count=size + spare)
    start = -whole.data_ptr() % HUGE_PAGE if spare else 0
    return whole[start:start + size]


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor of `shape` on huge pages (huge_pages)."""
    return huge_pages(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)
