"""The one-pass drafter: the draft heads read the state the verify pass already computed (Medusa-style).

The paper's loop runs the target twice per iteration: a draft pass for the root over the partial cache, then
the verify pass. Here the draft comes free with the previous pass. The last accepted node a of a verify
pass (or the token of a plain step, or the prompt's last token) has a last-layer state h_a; the base head on
h_a gave the root r, and draft head i on h_a guesses the token i places below r. So the tree for r is built
from h_a before r is ever run through the model, and one forward per iteration verifies it. Heads that read the
next token (heads.py) get r itself.

What changes against the paper's drafter: depth 1 comes from a draft head instead of the base head (the
base head's guess there is r itself), and the n-gram paths hang from the root. No partial cache, no second
pass, and the state the heads read saw the full context rather than a partial one. Only the proposals
change: verification decides what is emitted, so the text is the same as plain decoding's.
"""

from __future__ import annotations

import torch

from tokenswift.draft.drafting import best_per_depth
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Speculation


class FusedDrafter:
    uses_hidden = True
    switch_s = 0.0

    def __init__(self, lm: LoadedModel, spec: Speculation, sampler: Sampler):
        self.lm, self.sampler = lm, sampler
        gamma = min(spec.gamma, lm.heads.gamma) if lm.heads is not None else 0
        # Depth d below the root is head d's guess: the tree loses the base head's level, which is the root.
        # Without heads nothing is drafted and the n-gram paths are the only candidates.
        self.widths = list(spec.tree[1:gamma + 1])
        self.hidden: torch.Tensor | None = None  # [1, dim]: the state whose base-head sample is the root
        # The next proposals, when the pass that sampled the root already made them (device_drafts.py).
        self.ready: list[list[int]] | None = None
        self.vocab = lm.heads.vocab if lm.heads is not None else None
        self.weight = None  # the LM head's rows for the draft vocabulary; None: the whole head
        if self.vocab is not None:
            if int(self.vocab.max()) >= lm.config.vocab_size:
                raise ValueError(f"the heads' draft vocabulary names token ids past the model's {lm.config.vocab_size}")
            self.weight = lm.model.head_weight[self.vocab]

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        self.ready = None  # the heads need the prompt's last state only, given through observe()

    def wants_queries(self, count: int) -> bool:
        return False

    def observe(self, hidden: torch.Tensor, following: list[int], first: int) -> None:
        """The last-layer states of the tokens just committed; the heads read the last one's (the root was
        sampled after it)."""
        self.hidden = hidden.reshape(len(following), -1)[-1:].clone()  # on the fast path a pass buffer
        self.ready = None

    def given(self, levels: list[list[int]]) -> None:
        """The proposals for the root just observed, made inside the pass that sampled it (device_drafts.py)."""
        self.ready = levels

    def ngram_prefix(self, root: int, levels: list[list[int]]) -> list[int]:
        return []  # the root is certain: n-gram continuations hang from it

    def propose(self, root: int, position: int, window: torch.Tensor | None, depth: int,
                key: int) -> list[list[int]]:
        lm, widths = self.lm, self.widths[:depth]
        if not widths:
            return []
        if self.ready is not None:
            levels, self.ready = self.ready[:depth], None
            return levels
        # Scored over the draft vocabulary only, when the heads have one: tokens outside it are never proposed.
        root_id = torch.tensor([root], device=self.hidden.device) if lm.heads.next_token else None
        logits = lm.heads.logits(lm.model, self.hidden, root_id, len(widths), self.weight)
        return best_per_depth(logits, self.sampler, window, widths, key, self.vocab)

    def commit(self, full: KVCache, start: int, end: int, queries: list[torch.Tensor] | None) -> None:
        pass  # the next observe() brings all the drafter keeps
