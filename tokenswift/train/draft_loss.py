"""The draft layer's training objective: chain steps unrolled as drafting runs them, scored against the model.

Drafting feeds the layer its own predicted states from the second depth on; training does the same
("training-time test", as EAGLE-3): `steps` chain steps per position, step s reading step s-1's output states,
each row attending to the true rows up to its chain's start and to its own chain's earlier rows (unroll_mask).
The score is the cross-entropy against the model's own next-token distribution (its stored top-k), restricted
to the draft vocabulary: what verification accepts is what the model writes, not what the book says.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenswift.draft.draft_layer import DraftLayer


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
    prediction at j-1 (step 0: the model's true state at j) and the token at j+1. noise: Gaussian, relative to each
    state's RMS, drawn from `generator` (seeded per step, so a resumed run draws what an uninterrupted one would)."""
    hidden, tokens = batch["hidden"], batch["tokens"]
    t = tokens.shape[1] - 1
    feature = hidden[:, :t]
    if noise:
        scale = noise * feature.pow(2).mean(-1, keepdim=True).sqrt()
        feature = feature + scale * torch.randn(feature.shape, generator=generator)
    following = embed(tokens[:, 1:])
    cos, sin = rope[0][:t], rope[1][:t]
    attend = UnrollAttention(layer.cfg.group)
    states = []
    for _ in range(steps):
        out = layer.step(feature, following, cos, sin, attend)
        states.append(out)
        feature = torch.cat((torch.zeros_like(out[:, :1]), out[:, :-1]), dim=1)
    return states



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
