"""No verbatim repeats: the token that would complete a run of n tokens already in the text is not chosen.

A small model that has lost its thread copies itself: a sentence, then a whole paragraph, word for word. DRY pushes
against extending a repeat, but only within its range (a few hundred tokens) and only as a penalty. This rule is
absolute over the last REPEAT_RANGE tokens (tokenswift.settings): no n-token run that is already there is written
again (with n = 10, one token in about 3,300 of held-out novels would have been refused; a copied sentence is cut at
its tenth token). On by default (settings.WRITING_DEFAULTS): instruction drafts of 1,500 tokens on the default model
kept none of the repeated runs they had (3.5% of one draft's tokens) and changed nowhere
else (scripts/instruction_drafts.py).

It is a function of each row's history alone (the sampling window: the text before the position, and a trie node's
own path), row-wise and with static shapes, so plain decoding, every verify row, a captured graph and a resumed run
refuse the same tokens.
"""

from __future__ import annotations

import torch


def repeat_followers(windows: torch.Tensor, n: int) -> torch.Tensor:
    """windows: [R, W] token ids padded with -1 (the last W tokens before each row's position) -> [R, W - n + 1]
    token ids, -1 = none: the tokens that would end an n-token run already in the window."""
    rows, w = windows.shape
    starts = w - n + 1  # earlier runs of n - 1 tokens that have a token after them inside the window
    if starts < 1:
        return windows[:, :0]
    tail = windows[:, w - n + 1:]  # the row's last n - 1 tokens
    match = (tail >= 0).all(dim=1, keepdim=True).expand(rows, starts)
    for k in range(n - 1):
        match = match & (windows[:, k:k + starts] == tail[:, k:k + 1])
    return torch.where(match, windows[:, n - 1:], -1)
