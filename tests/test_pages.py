"""Memory on 2 MiB pages (model/pages.py): what a step streams, the packed weights and the KV cache."""

import torch

from tokenswift.model import pages
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.kv_q8 import Q8, row_width


def test_a_block_of_a_huge_page_or_more_starts_on_one_and_is_zeroed_memory_of_its_own():
    big = pages.huge_pages(3 * pages.HUGE_PAGE + 100)
    small = pages.huge_pages(5000)
    assert big.numel() == 3 * pages.HUGE_PAGE + 100 and small.numel() == 5000 and pages.huge_pages(0).numel() == 0
    assert big.data_ptr() % pages.HUGE_PAGE == 0  # all but its last partial huge page can lie on huge pages
    assert int(big.sum()) == 0 and int(small.sum()) == 0
    big[-1], small[0] = 7, 9
    assert int(big.sum()) == 7 and int(small.sum()) == 9
    floats = pages.zeros((4, 3, 5), torch.float32)
    assert floats.shape == (4, 3, 5) and floats.dtype == torch.float32 and floats.is_contiguous()
    assert torch.equal(floats, torch.zeros(4, 3, 5))


def test_a_cpu_cache_lies_on_huge_pages_and_starts_empty():
    cache = KVCache(30, 3, 8192, 64, "cpu", Q8)
    for part in (cache.k, cache.v):
        assert part.shape == (30, 3, 8192, row_width(64)) and part.dtype == Q8
        assert part.data_ptr() % pages.HUGE_PAGE == 0 and not part.any()
    cache.k[2, 1, 5] = 3
    assert int(cache.view(2, 6)[0].sum()) == 3 * row_width(64) and not cache.v.any()
    major = KVCache(2, 3, 100, 8, "cpu", torch.float32, slot_major=True)  # [layer, slot, head] underneath
    assert major.k.shape == (2, 3, 100, 8) and major.k.stride()[1:3] == (8, 24) and not major.k.any()
