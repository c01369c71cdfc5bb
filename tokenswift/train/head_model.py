"""The frozen model's side of head training: its last-layer states h0, fresh heads, and the heads' losses.

h0 is the last layer's output before the final norm, exactly as the engine computes it: our own forward over a
fresh KV cache under a causal mask, one sequence at a time (the model API is batch-1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenswift.model.heads import DraftHeads, new_heads
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.prefill import prefill
from tokenswift.model.run_defaults import default_device, default_dtype


def pick_device(device: str) -> str:
    return default_device() if device == "auto" else device


def pick_dtype(dtype: str, device: str) -> str:
    return default_dtype(device) if dtype == "auto" else dtype


@torch.no_grad()
def base_hidden(lm: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """h0 [B, T, dim] for tokens [B, T]: the engine's own chunked prefill, one sequence at a time.

    no_grad rather than inference_mode: inference tensors could not be saved for the heads' backward."""
    cfg, dev = lm.config, lm.device
    t = tokens.shape[1]
    lm.check_positions(t)
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, t, cfg.head_dim, dev, lm.dtype)  # rows overwrite it
    return torch.stack([prefill(lm.model, row, cache, keep=t).hidden for row in tokens.to(dev)])


def initial_heads(lm: LoadedModel, gamma: int = 3, next_token: bool = False) -> DraftHeads:
    """Fresh heads that start out exactly as the base head: W_i = 0 (new_heads), and each output norm
    takes the model's final-norm gain, so logits_i = the base logits at first instead of a rescaled copy."""
    heads = new_heads(lm.config, gamma, next_token).to(lm.device)
    with torch.no_grad():
        for layer in heads.layers:
            layer.post_layernorm.weight.copy_(lm.model.model.norm.weight)
    return heads


def head_states(lm: LoadedModel, heads: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor):
    """The heads' normalised states [B, T-1, dim] at positions 0..T-2 of tokens [B, T] (the last position has
    no target for any head). Heads that read the next token get the embedding of token t+1 at position t."""
    param = next(heads.parameters())
    after = None
    if getattr(heads, "module", heads).next_token:  # DDP wraps the heads in .module
        after = lm.model.model.embed_tokens(tokens[:, 1:]).to(param.dtype)
    return heads(hidden[:, :-1].to(param.dtype), after)


def draft_logits(lm: LoadedModel, heads: torch.nn.Module, hidden: torch.Tensor,
                 tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each draft head's float32 logits [B, T-1-i, vocab], only where there is a target: head i (1-based)
    at position t predicts token t+1+i, so its last i+1 positions have none."""
    states = head_states(lm, heads, hidden, tokens)
    return [lm.model.head(s[:, : s.shape[1] - i].to(lm.dtype)).float() for i, s in enumerate(states, start=1)]


def vocab_losses(lm: LoadedModel, states: list[torch.Tensor], tokens: torch.Tensor, vocab: torch.Tensor):
    """Per head: cross-entropy over the draft vocabulary's rows and top-1 there (a [gamma] tensor, no grad).
    Targets outside the vocabulary are skipped: the drafters can never propose them anyway."""
    index = torch.full((lm.config.vocab_size,), -100, dtype=torch.int64, device=tokens.device)
    index[vocab] = torch.arange(len(vocab), device=tokens.device)
    weight = lm.model.head_weight[vocab].float()
    losses, top1 = [], []
    for i, s in enumerate(states, start=1):
        logits = s[:, : tokens.shape[1] - 1 - i].float() @ weight.T
        target = index[tokens[:, i + 1:]]
        losses.append(F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100))
        top1.append((logits.detach().argmax(-1) == target).float().mean())
    return losses, torch.stack(top1)


def distill_losses(lm: LoadedModel, states: list[torch.Tensor], hidden: torch.Tensor, vocab: torch.Tensor):
    """Per head: cross-entropy against the frozen model's own next-token distribution, over the draft vocabulary,
    and how often the head's best guess is the model's (a [gamma] tensor, no grad).

    A draft is accepted when it is what the model itself would write, not what the book says. At position t
    head i guesses token t+1+i; the model's distribution for that token is its base head at position t+i (given
    the text up to there). Soft targets carry the whole distribution: the best guess for greedy decoding and
    the likely ones for sampling, with far more signal per position than the one token of the book."""
    weight = lm.model.head_weight[vocab].float()
    with torch.no_grad():
        teacher = lm.model.model.norm(hidden.to(lm.dtype)).float() @ weight.T  # [B, T, |vocab|]
    losses, agree = [], []
    for i, s in enumerate(states, start=1):
        n = hidden.shape[1] - 1 - i
        logits = s[:, :n].float() @ weight.T
        target = teacher[:, i:i + n]
        losses.append(-(target.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean())
        agree.append((logits.detach().argmax(-1) == target.argmax(-1)).float().mean())
    return losses, torch.stack(agree)


def head_losses(lm: LoadedModel, heads: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor):
    """Per draft head: mean cross-entropy over the vocabulary and top-1 accuracy (a [gamma] tensor, no grad)."""
    losses, top1 = [], []
    for i, logits in enumerate(draft_logits(lm, heads, hidden, tokens), start=1):
        target = tokens[:, i + 1:]
        losses.append(F.cross_entropy(logits.flatten(0, 1), target.flatten()))
        top1.append((logits.detach().argmax(-1) == target).float().mean())
    return losses, torch.stack(top1)
