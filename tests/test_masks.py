"""The visibility rule (model/masks.py): the eager masks, the fast path's device-side mask and the sliding window
agree slot for slot."""

from __future__ import annotations

import torch

from tokenswift.model.attention import Visible
from tokenswift.model.masks import causal_mask, with_prefix


def test_the_eager_mask_is_the_fast_paths_mask():
    """with_prefix (the host knows start) and Visible.mask (start on the device) give one mask for one tree."""
    t, start, capacity = 5, 9, 32
    tree = torch.rand(t, t, generator=torch.Generator().manual_seed(0)) < 0.5
    visible = Visible(t, capacity, "cpu")
    visible.tree.copy_(tree)
    visible.start.fill_(start)
    eager = with_prefix(tree, start, torch.arange(start, start + t), None)
    assert torch.equal(eager, visible.mask(start + t))
    assert not visible.mask(capacity)[:, start + t:].any()  # slots past the new tokens are never seen


def test_a_sliding_window_sees_only_the_last_window_positions():
    """Query at position p sees slots (p - window, p]: the rule the layer drafter's cache counts from its first kept
    slot (slot = position, so a shift of both cancels)."""
    prefix, t, window = 6, 4, 3
    mask = causal_mask(prefix, t, torch.arange(prefix, prefix + t), window, "cpu")
    rows, slots = torch.arange(prefix, prefix + t)[:, None], torch.arange(prefix + t)[None, :]
    assert torch.equal(mask, (slots <= rows) & (slots > rows - window))
    assert torch.equal(causal_mask(prefix, t, torch.arange(prefix, prefix + t), None, "cpu"), slots <= rows)
