"""The fused drafter's next proposals, made inside the pass that samples the root (issue 48: one host read per
TokenSwift iteration).

On the fast path a verify pass samples the target's token after every trie node in its graph, and the host
reads those tokens to walk the trie. The fused drafter's next tree hangs from the last accepted node a: the
draft heads on a's state, with the root the target sampled after a. Which node that is, the host learns only
from the read, and drafting afterwards would cost a second read (the drafts must reach the host, which builds the
trie). So the pass drafts below every row instead, each row's sampled token taken as its root, and the host
reads the targets and every row's drafts together; the walk then picks row a's. A few head rows per candidate
cost next to nothing on a GPU, where the extra read was a whole round trip.

Each row's drafts are the ones FusedDrafter.propose would make after that row was accepted: the same heads on the
same state, ranked by drafting.rank_on_device with the window and noise positions the root would have there.
The plain step inside a TokenSwift run (the adaptive policy's plain gear) drafts the same way from its one row,
where the next iteration may draft (CandidatePolicy.plain_next).
"""

from __future__ import annotations

import torch

from tokenswift.draft.drafting import rank_on_device
from tokenswift.draft.fused_drafter import FusedDrafter
from tokenswift.sampling.in_graph import MAX_DEPTH, DeviceSampler
from tokenswift.sampling.windows import last_ids, node_windows


class DeviceDrafts:
    """Draft ids [T, depth, width] for the T rows of a pass: row i's, as if its sampled token were the root."""

    def __init__(self, drafter: FusedDrafter, draw: DeviceSampler):
        self.drafter, self.draw = drafter, draw
        self.widths = drafter.widths
        self.depth, self.width = len(self.widths), max(self.widths)
        self.steps = torch.arange(self.depth, device=draw.ids.device)

    def size(self, t: int) -> int:
        """Elements of t rows' drafts."""
        return t * self.depth * self.width

    def __call__(self, x: torch.Tensor, sampled: torch.Tensor, start: torch.Tensor, positions: torch.Tensor,
                 paths: torch.Tensor | None) -> torch.Tensor:
        """x [T, dim]: the rows' last-layer states; sampled [T]: the target's token after each row (its root);
        start: the committed length (the pass's root slot); positions [T]; paths [T, MAX_DEPTH]: each row's trie
        path below the pass's root (None: one row, the root itself)."""
        d, lm, t = self.drafter, self.drafter.lm, x.shape[0]
        below = positions - start  # each row's depth below the pass's root; its sampled token lies one deeper
        windows = None
        if self.draw.w:
            path = torch.full((t, MAX_DEPTH + 1), -1, dtype=torch.long, device=x.device)
            if paths is not None:
                path[:, :MAX_DEPTH] = paths
            path.scatter_(1, below[:, None], sampled[:, None])
            history = last_ids(self.draw.ids, start + 1, self.draw.offsets)
            windows = node_windows(history, path, below + 1).repeat_interleave(self.depth, 0)
        root = sampled if lm.heads.next_token else None
        logits = lm.heads.logits(lm.model, x, root, self.depth, d.weight)  # head-major [depth * T, V]
        logits = logits.view(self.depth, t, -1).transpose(0, 1).reshape(t * self.depth, -1)
        # Depth k below row i's root is sampled at story index positions[i] + 2 + k (the root sits at + 1).
        keys = (positions + 2 + self.draw.key_offset)[:, None] + self.steps[None, :]
        return rank_on_device(logits, d.sampler, windows, keys.flatten(), self.width, d.vocab).view(t, -1)

    def levels(self, drafted: list[int], row: int) -> list[list[int]]:
        """Row `row`'s drafts from the flat host copy of every row's (T * depth * width ids): a list per depth."""
        at = row * self.depth * self.width
        rows = [drafted[at + k * self.width: at + k * self.width + w] for k, w in enumerate(self.widths)]
        return [[token for token in ids if token >= 0] for ids in rows]
