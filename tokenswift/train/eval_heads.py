"""Evaluate draft heads on held-out text: `eval-heads --model M --heads DIR --data FILE [--json OUT]`.

Per head: top-1 and top-3 accuracy and cross-entropy of its guess for token t+1+i, over every position
of the packed sequences that has a target; the base LM head (token t+1) is shown for reference. Beside them,
how often the model's own best guess for that token (its base head at position t+i) is the head's top-1 or
among its top-3: a draft is accepted when it is what the model writes, so these are the closer estimates of
greedy acceptance. Top-1 of head i is roughly the chance that depth i+1 of a width-1 draft is right given the
depths above it.
`--heads untrained` evaluates the heads training starts from (each repeats the base head's guess).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from tokenswift.model.heads import DraftHeads, load_heads
from tokenswift.model.loading import LoadedModel, load_model
from tokenswift.train.data import load_sequences
from tokenswift.train.head_config import FLAG_HELP
from tokenswift.train.head_model import base_hidden, draft_logits, initial_heads, pick_device, pick_dtype

UNTRAINED = "untrained"


@dataclass
class EvalConfig:
    model: str
    heads: str  # a heads directory, or "untrained"
    data: tuple[str, ...]
    seq_len: int = 8192
    doc_tokens: int | None = 8192  # as in training: the opening of each document
    max_docs: int | None = None
    max_sequences: int | None = 64  # evaluate at most this many sequences (the first ones)
    batch: int = 4
    device: str = "auto"
    dtype: str = "auto"
    json: str | None = None  # also write the result here
    progress: bool = True


@torch.no_grad()
def evaluate(lm: LoadedModel, heads: DraftHeads, tokens: torch.Tensor, batch: int = 4,
             progress: bool = False) -> dict:
    """{"base": row, "head1": row, ...}, row = loss, top1, top3, model_top1, model_top3 and the number of
    positions scored (the base head's model_top1 is 1 by definition)."""
    names = ["base"] + [f"head{i}" for i in range(1, heads.gamma + 1)]
    sums = torch.zeros(len(names), 6, dtype=torch.float64)  # loss, top-1, top-3, model top-1, model top-3, positions
    for chunk in tqdm(tokens.split(batch), desc="eval-heads", disable=not progress):
        chunk = chunk.to(lm.device)
        hidden = base_hidden(lm, chunk)
        base = lm.model.head(lm.model.model.norm(hidden[:, :-1])).float()
        own = base.argmax(-1)  # the model's best guess for every token from t+1 on
        for row, logits in enumerate([base, *draft_logits(lm, heads, hidden, chunk)]):
            target, choice = chunk[:, row + 1:], own[:, row:]
            top3 = logits.topk(3, dim=-1).indices
            sums[row, 0] += F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
            sums[row, 1] += (top3[..., 0] == target).sum().item()
            sums[row, 2] += (top3 == target[..., None]).any(-1).sum().item()
            sums[row, 3] += (top3[..., 0] == choice).sum().item()
            sums[row, 4] += (top3 == choice[..., None]).any(-1).sum().item()
            sums[row, 5] += target.numel()
    keys = ("loss", "top1", "top3", "model_top1", "model_top3")
    return {name: {k: v / s[5] for k, v in zip(keys, s, strict=False)} | {"positions": int(s[5])}
            for name, s in zip(names, sums.tolist(), strict=True)}


def format_table(rows: dict) -> str:
    lines = [f"{'head':<7} {'predicts':>8} {'loss':>8} {'top-1':>7} {'top-3':>7} {'model top-1':>12} "
             f"{'model top-3':>12}"]
    for i, (name, r) in enumerate(rows.items()):
        lines.append(f"{name:<7} {f't+{i + 1}':>8} {r['loss']:8.4f} {r['top1']:7.3f} {r['top3']:7.3f} "
                     f"{r['model_top1']:12.3f} {r['model_top3']:12.3f}")
    return "\n".join(lines)


def heads_for(lm: LoadedModel, spec: str) -> DraftHeads:
    if spec == UNTRAINED:
        return initial_heads(lm).to(lm.device, lm.dtype).eval().requires_grad_(False)
    return load_heads(Path(spec), lm.config, lm.device, lm.dtype)


def eval_heads(cfg: EvalConfig, lm: LoadedModel | None = None) -> dict:
    """Evaluate, print nothing; returns {"heads", "model", "data": {...}, "rows": {...}}; writes cfg.json."""
    if lm is None:
        device = pick_device(cfg.device)
        lm = load_model(cfg.model, device=device, dtype=pick_dtype(cfg.dtype, device), heads="none")
    packed = load_sequences(cfg.data, lm.encode, cfg.seq_len, cfg.doc_tokens, cfg.max_docs)
    tokens = packed.tokens[: cfg.max_sequences]
    rows = evaluate(lm, heads_for(lm, cfg.heads), tokens, cfg.batch, cfg.progress)
    data = {"files": list(cfg.data)} | packed.describe() | {"evaluated_sequences": len(tokens)}
    result = {"model": cfg.model, "heads": cfg.heads, "data": data, "rows": rows,
              "settings": {k: v for k, v in asdict(cfg).items() if k not in ("model", "heads", "data")}}
    if cfg.json:
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(result, indent=2))
    return result


# -- command line (wired into tokenswift/cli/) ------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """eval-heads"""
    d = EvalConfig.__dataclass_fields__
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument("--heads", required=True, help=f"heads directory, or {UNTRAINED!r} for fresh heads")
    parser.add_argument("--data", nargs="+", required=True, metavar="FILE", help="held-out text files")
    for name in ("seq_len", "doc_tokens", "max_docs", "max_sequences", "batch"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=d[name].default, help=FLAG_HELP[name])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, ... (default: %(default)s)")
    parser.add_argument("--json", metavar="OUT", help="also write the result as JSON (default: none)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    return EvalConfig(model=args.model, heads=args.heads, data=tuple(args.data), seq_len=args.seq_len,
                      doc_tokens=args.doc_tokens or None, max_docs=args.max_docs,
                      max_sequences=args.max_sequences, batch=args.batch, device=args.device,
                      dtype=args.dtype, json=args.json, progress=not args.no_progress)


def run(args: argparse.Namespace) -> int:
    result = eval_heads(config_from_args(args))
    d = result["data"]
    print(f"{result['heads']} on {d['evaluated_sequences']} sequences of {d['seq_len']} tokens")
    print(format_table(result["rows"]))
    return 0
