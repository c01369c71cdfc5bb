"""The model's other likely tokens at each generated position: what the Write tab's alternatives and branches show.

Recorded from the very distribution each token was drawn from: the processed scores of its row (after the penalty,
DRY, temperature, the filters and XTC), softmaxed. Greedy decoding (T = 0) draws from no distribution: its
alternatives are the softmax of the penalised logits at T = 1. The cost is one softmax and one top-k on a row the
sampler has already computed. TokenSwift records them for the rows of the accepted path and the target's token
after it, which are the rows plain decoding samples, so both record the same alternatives (in float64, to a few
ulps). Tokens a filter removed have probability 0: they are no alternative, and their slots are left empty (id
-1), so that the record does not depend on how top-k orders ties among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOP = 5  # alternatives kept per token
ROW = 1 + 2 * TOP  # one recorded row: the chosen token's probability, TOP ids, their probabilities


@dataclass(frozen=True)
class Alternatives:
    """One generated token's alternatives."""

    probability: float  # of the token that was drawn
    ids: tuple[int, ...]  # the TOP likeliest tokens, likeliest first; -1: an empty slot (probability 0)
    probs: tuple[float, ...]


def top_rows(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[R, ROW] float64 rows for processed scores [R, V] (-inf: removed) and the tokens drawn from them [R].

    Static shapes, no host sync: it runs inside a captured verify graph too (fastpath.py)."""
    probs = scores.double().softmax(dim=-1)
    top = probs.topk(min(TOP, probs.shape[-1]), dim=-1)
    ids = torch.where(top.values > 0, top.indices, -1).double()
    chosen = probs.gather(-1, tokens.view(-1, 1).long())
    return torch.cat((chosen, ids, top.values), dim=1)


def top_row_of(scores: torch.Tensor, columns: torch.Tensor, token: int) -> torch.Tensor:
    """top_rows of one row from its finite scores only (scores [n] of the token ids `columns`, n >= 1): after min-p a
    few dozen of 49K, whose softmax and top-k took ~0.25 ms over the whole row. The same probabilities to a few
    ulps (the sum runs over fewer zeros); where several tokens tie, top-k may list them in another order."""
    probs = scores.double().softmax(dim=-1)
    top = probs.topk(min(TOP, probs.shape[0]))
    row = torch.zeros(ROW, dtype=torch.float64)
    row[1:1 + TOP] = -1.0
    row[1:1 + len(top.indices)] = torch.where(top.values > 0, columns[top.indices], -1).double()
    row[1 + TOP:1 + TOP + len(top.values)] = top.values
    row[0] = probs[columns == token].sum()
    return row[None]


def from_rows(rows: torch.Tensor) -> list[Alternatives]:
    """Host records of top_rows' rows (one host read)."""
    k = (rows.shape[1] - 1) // 2
    return [Alternatives(row[0], tuple(int(i) for i in row[1:1 + k]), tuple(row[1 + k:]))
            for row in rows.tolist()]
