"""The draft layer's training objective: chain steps unrolled as drafting runs them, scored against the model.

Drafting feeds the layer its own predicted states from the second depth on; training does the same
("training-time test", as EAGLE-3): `steps` chain steps per position, step s reading step s-1's output states,
each row attending to the true rows up to its chain's start and to its own chain's earlier rows (unroll_mask).
The score is the cross-entropy against the model's own next-token distribution (its stored top-k), restricted
to the draft vocabulary: what verification accepts is what the model writes, not what the book says.

The app writes with a repetition penalty (θ over the last W tokens, tokenswift.settings.WRITING_DEFAULTS), and so
the tokens verification accepts are the model's penalised choices: about one in four differs from its unpenalised
top-1 on a novel, most often a word not yet in the window taken over one that is. The drafter penalises its own
scores the same way (drafting.best_per_depth; DRY too, which changes far fewer choices and is left out here), so
the draft must also rank those runners-up as the model does.
A second score trains that: the cross-entropy of the penalised draft against the penalised model, whose full
logits over the draft vocabulary the stored last-layer states give (the model's final norm and LM-head rows),
with each row's window taken from the text before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenswift.model.draft_layer import DraftLayer
from tokenswift.sampling.sampler import apply_penalty


def unroll_mask(t: int, step: int, device=None) -> torch.Tensor:
    """[t, (step+1)*t] bool: which keys a row of chain step `step` at position j sees, over the keys of steps
    0..step side by side. Step 0 keys (true states): positions <= j - step (its chain started at j - step).
    Step s keys (1 <= s <= step): the one at j - step + s, the same chain's row at that depth."""
    j = torch.arange(t, device=device)[:, None]
    i = torch.arange(t, device=device)[None, :]
    blocks = [i <= j - step] + [i == j - step + s for s in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


class UnrollAttention:
    """attend() for training: keeps each step's keys so that later steps see their chain's rows."""

    def __init__(self, group: int):
        self.group, self.keys, self.values = group, [], []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys.append(k)
        self.values.append(v)
        step, t = len(self.keys) - 1, q.shape[1]
        keys = torch.cat(self.keys, dim=1).transpose(1, 2)  # [B, kv_heads, (step+1)*t, hd]
        values = torch.cat(self.values, dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=unroll_mask(t, step, q.device),
                                             enable_gqa=self.group > 1)
        return out.transpose(1, 2).flatten(2)


def unrolled_states(layer: DraftLayer, embed: torch.nn.Embedding, batch: dict[str, torch.Tensor], rope, steps: int,
                    noise: float = 0.0, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """Each chain step's predicted states [B, T-1, dim]: row j of step s predicts the state at j+1 from step s-1's
    prediction at j-1 (step 0: the model's true state at j, fused with its other layers' where the layer reads
    them) and the token at j+1. noise: Gaussian, relative to each state's RMS, drawn on the CPU from `generator`
    (seeded per step, so a resumed run draws what an uninterrupted one would, on any device)."""
    hidden, tokens = batch["hidden"], batch["tokens"]
    t = tokens.shape[1] - 1
    inputs = torch.cat((batch["features"][:, :t], hidden[:, :t]), dim=-1) if layer.feature_layers else hidden[:, :t]
    feature = layer.first_feature(_noisy(inputs, layer.cfg.dim, noise, generator))
    following = embed(tokens[:, 1:])
    cos, sin = rope[0][:t], rope[1][:t]
    attend = UnrollAttention(layer.cfg.group)
    states = []
    for _ in range(steps):
        out = layer.step(feature, following, cos, sin, attend)
        states.append(out)
        feature = torch.cat((torch.zeros_like(out[:, :1]), out[:, :-1]), dim=1)
    return states


def _noisy(states: torch.Tensor, dim: int, noise: float, generator: torch.Generator | None) -> torch.Tensor:
    """states [..., k·dim] (k layers' states side by side) plus Gaussian noise of `noise` times each state's RMS."""
    if not noise:
        return states
    parts = states.unflatten(-1, (-1, dim))
    scale = noise * parts.pow(2).mean(-1, keepdim=True).sqrt()
    return (parts + scale * torch.randn(parts.shape, generator=generator).to(states.device)).flatten(-2)


def soft_targets(batch: dict[str, torch.Tensor], to_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's distribution for the token after each row's target state, restricted to the draft vocabulary:
    (draft indices [B, T-1, K] with -1 outside it, probabilities [B, T-1, K] renormalised over the inside)."""
    ids = to_draft[batch["top_ids"][:, 1:]]
    probs = batch["top_logp"][:, 1:].exp() * (ids >= 0)
    return ids, probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)


def distill_loss(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, valid_from: int) -> torch.Tensor:
    """Cross-entropy of the draft (logits [B, T-1, V_draft]) against the soft targets, rows from valid_from on."""
    logq = torch.log_softmax(logits[:, valid_from:].float(), dim=-1)
    picked = logq.gather(-1, ids[:, valid_from:].clamp_min(0))
    return -(picked * probs[:, valid_from:]).sum(-1).mean()


@dataclass(frozen=True)
class Penalty:
    theta: float  # the repetition penalty θ the app writes with
    window: int  # W: how many earlier tokens it looks back


def window_mask(tokens: torch.Tensor, to_draft: torch.Tensor, window: int) -> torch.Tensor:
    """[B, T, V_draft] bool: draft-vocabulary token occurs among tokens[b, i - window + 1 .. i] (row i's window
    includes its own token), by running counts over the rows."""
    size = int(to_draft.max()) + 1
    ids = to_draft[tokens]
    ids = torch.where(ids < 0, size, ids)  # outside the draft vocabulary: a spare column, dropped
    counts = torch.zeros(*tokens.shape, size + 1, dtype=torch.int32, device=tokens.device)
    counts = counts.scatter_(2, ids[..., None], 1).cumsum(1)
    before = torch.cat((torch.zeros_like(counts[:, :window]), counts[:, :-window]), dim=1)
    return (counts - before)[..., :size] > 0


@torch.no_grad()
def penalised_targets(batch: dict[str, torch.Tensor], final_norm, head_rows: torch.Tensor, to_draft: torch.Tensor,
                      penalty: Penalty) -> tuple[torch.Tensor, torch.Tensor]:
    """For the rows of unrolled_states (row j: the token at j+2): the model's penalised distribution over the draft
    vocabulary [B, T-1, V_draft], and the window masks [B, T-1, V_draft] its penalty used (tokens up to j+1)."""
    mask = window_mask(batch["tokens"], to_draft, penalty.window)[:, 1:]
    logits = F.linear(final_norm(batch["hidden"][:, 1:].float()), head_rows)
    return F.softmax(apply_penalty(logits, mask, penalty.theta), dim=-1), mask


def penalised_loss(logits: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor, theta: float,
                   valid_from: int) -> torch.Tensor:
    """Cross-entropy of the penalised draft (logits [B, T-1, V_draft]) against penalised_targets, rows from
    valid_from on."""
    logq = torch.log_softmax(apply_penalty(logits[:, valid_from:].float(), mask[:, valid_from:], theta), dim=-1)
    return -(logq * probs[:, valid_from:]).sum(-1).mean()
