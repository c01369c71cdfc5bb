"""Draft heads (design §2): gamma chained residual heads on the last hidden state, sharing the LM head.

    h_0 = the last decoder layer's output before the model's final norm
    h_i = h_{i-1} + W_i · RMSNorm_in_i(h_{i-1})          (square, bias-free, no activation)
    logits_i = LMHead(RMSNorm_out_i(h_i))                 (head i at position t predicts token t+1+i)

The chain matters: the paper's ablation shows independent Medusa-style heads draft clearly worse.

Heads may also read the next token (`next_token`, ours, Hydra-style): a drafter always knows the token right
after h_0's position (the one-pass drafter's root, the paper drafter's depth-1 guess), and

    h_0' = h_0 + U · RMSNorm_next(embed(next))            (U square, zero at the start of training)

starts the chain instead of h_0. Predicting t+2 from h_t alone must guess t+1 first; given it, the default
model's first head is right 1.7 times as often with the same data and steps (its model card has the numbers).

Our own files are small and separate from the model: `heads.safetensors` + `heads_config.json`.

Heads may carry a draft vocabulary (`vocab`: the token ids most frequent in their training text, most
frequent first). A drafter then applies the LM head to those rows only: on a 49K vocabulary the LM head
costs a sixth of a 135M model's step per head, and the rare tokens it skips are seldom guessed right.
Tensor names match the official TokenSwift checkpoints' `model.medusa_layers.{j}.*` after the prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from tokenswift.model.config import ModelConfig
from tokenswift.model.errors import ModelLoadError, read_config_and_weights
from tokenswift.model.forward import Linear, RMSNorm, Transformer, project

CONFIG_NAME = "heads_config.json"
WEIGHTS_NAME = "heads.safetensors"
OFFICIAL_PREFIX = "model.medusa_layers."


class HeadsError(ModelLoadError):
    pass


class HeadLayer(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.linear = Linear(dim, dim, bias=False)
        self.post_layernorm = RMSNorm(dim, eps)


class DraftHeads(nn.Module):
    def __init__(self, dim: int, gamma: int, eps: float, vocab_size: int = 0, next_token: bool = False):
        super().__init__()
        self.dim, self.gamma, self.eps, self.next_token = dim, gamma, eps, next_token
        self.layers = nn.ModuleList(HeadLayer(dim, eps) for _ in range(gamma))
        if next_token:
            self.next_norm = RMSNorm(dim, eps)
            self.next_proj = Linear(dim, dim, bias=False)
        # None (no draft vocabulary) is a buffer too: absent from the state dict, moved with the module.
        self.register_buffer("vocab", torch.zeros(vocab_size, dtype=torch.int64) if vocab_size else None)

    def forward(self, h0: torch.Tensor, after: torch.Tensor | None = None) -> list[torch.Tensor]:
        """h0: [T, dim] -> gamma normalised states [T, dim]; apply the model's LM head to get logits.
        after: [T, dim], the model's embedding of the token after each h0 position (next_token heads only)."""
        states, h = [], h0
        if self.next_token:
            if after is None:
                raise ValueError("these draft heads read the next token: pass its embedding")
            h = h + self.next_proj(self.next_norm(after))
        for layer in self.layers:
            h = h + layer.linear(layer.input_layernorm(h))
            states.append(layer.post_layernorm(h))
        return states

    def logits(self, model: Transformer, h0: torch.Tensor, next_ids: torch.Tensor | None, rows: int,
               weight: torch.Tensor | None = None) -> torch.Tensor:
        """Every drafter's draft logits: [rows * T, V] from the first `rows` heads on h0 [T, dim], head-major.
        next_ids [T]: the token after each h0 position (read by next_token heads only, else may be None).
        weight: the LM-head rows to score (the draft vocabulary's); None: the whole LM head."""
        after = model.model.embed_tokens(next_ids) if self.next_token else None
        return project(torch.cat(self(h0, after)[:rows]), model.head_weight if weight is None else weight)

    def config_dict(self) -> dict:
        return {"format": "tokenswift-heads", "version": 1, "dim": self.dim, "gamma": self.gamma, "eps": self.eps,
                "draft_vocab": 0 if self.vocab is None else len(self.vocab), "next_token": self.next_token}

    def with_vocab(self, ids: torch.Tensor) -> DraftHeads:
        """A copy of these heads carrying the draft vocabulary `ids` (most frequent first)."""
        weight = next(self.parameters())
        heads = DraftHeads(self.dim, self.gamma, self.eps, len(ids), self.next_token).to(weight.device, weight.dtype)
        heads.load_state_dict({**self.state_dict(), "vocab": ids.to(torch.int64)})
        return heads.train(self.training).requires_grad_(weight.requires_grad)


def save_heads(heads: DraftHeads, directory: Path, record: dict | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
               for k, v in heads.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_NAME))
    config = heads.config_dict() | ({"record": record} if record else {})
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2))


def load_heads(directory: Path, cfg: ModelConfig, device, dtype) -> DraftHeads:
    meta, state = read_config_and_weights(directory, CONFIG_NAME, WEIGHTS_NAME, HeadsError, "draft heads")
    if meta.get("dim") != cfg.dim:
        raise HeadsError(f"heads in {directory} are for hidden size {meta.get('dim')}, the model has {cfg.dim}")
    return _build(state, meta["dim"], meta["gamma"], meta.get("eps", cfg.norm_eps), str(directory)).to(device, dtype)


def heads_from_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> DraftHeads | None:
    """Heads stored inside an official TokenSwift checkpoint, or None when there are none."""
    ours = {k[len(OFFICIAL_PREFIX):]: v for k, v in state.items() if k.startswith(OFFICIAL_PREFIX)}
    if not ours:
        return None
    renamed = {f"layers.{k}": v for k, v in ours.items()}
    gamma = len({k.split(".")[1] for k in renamed})
    return _build(renamed, cfg.dim, gamma, cfg.norm_eps, "checkpoint")


def _build(state: dict[str, torch.Tensor], dim: int, gamma: int, eps: float, source: str) -> DraftHeads:
    vocab = state.get("vocab")
    if vocab is not None and (vocab.dim() != 1 or vocab.is_floating_point() or len(vocab) == 0):
        raise HeadsError(f"draft heads from {source}: the draft vocabulary must be a non-empty list of token ids")
    with torch.device("meta"):
        heads = DraftHeads(dim, gamma, eps, 0 if vocab is None else len(vocab), "next_proj.weight" in state)
    expected = heads.state_dict()
    if set(expected) != set(state):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise HeadsError(f"draft heads from {source} do not match: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise HeadsError(f"head tensor {name} has shape {tuple(state[name].shape)}, expected {tuple(ref.shape)}")
    heads.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, assign=True,
                          strict=True)
    return heads.eval().requires_grad_(False)


def new_heads(cfg: ModelConfig, gamma: int = 3, next_token: bool = False) -> DraftHeads:
    """Fresh heads: W_i = 0 (and U = 0) and unit norms. Training starts from train_heads.initial_heads, which
    also copies the model's final-norm gain into each output norm so that every head starts as the base head."""
    heads = DraftHeads(cfg.dim, gamma, cfg.norm_eps, next_token=next_token)
    for layer in heads.layers:
        nn.init.zeros_(layer.linear.weight)
    if next_token:
        nn.init.zeros_(heads.next_proj.weight)
    return heads
