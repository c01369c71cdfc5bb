"""What a train-heads run is asked to do: its settings (TrainConfig, DistillConfig) and their command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

LOSSES = ("full", "sampled", "vocab", "distill")


@dataclass
class DistillConfig:
    """Self-distillation: the model first writes its own training text by plain sampling."""

    tokens: int = 0  # tokens to generate; 0 = off (train on --data)
    sample_tokens: int | None = None  # new tokens per sample (each with its own seed); None = seq_len
    prompt_tokens: int = 64  # each prompt: the opening of a --data document, or the BOS token alone
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.0
    penalty: float = 1.0
    penalty_length: int = 1024


@dataclass
class TrainConfig:
    model: str
    out: str
    data: tuple[str, ...] = ()  # .txt / .jsonl / .jsonl.xz; with self-distillation, the prompts' source
    distill: DistillConfig = field(default_factory=DistillConfig)
    seq_len: int = 8192  # tokens per training sequence
    doc_tokens: int | None = 8192  # keep the first doc_tokens of each document (None = all); the paper: 8K
    max_docs: int | None = None
    steps: int = 200  # optimiser steps
    batch: int = 4  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimiser step
    lr: float = 5e-3  # the paper: 5e-3 (1e-3 for 14B)
    min_lr: float = 5e-4  # the cosine ends here
    warmup: int = 20  # steps of linear warm-up
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm; 0 = off
    gamma: int = 3  # number of draft heads
    device: str = "auto"  # cuda when available
    dtype: str = "auto"  # the frozen model's dtype: bfloat16 on CUDA, float32 on CPU
    resume: bool = False  # continue from <out>/checkpoint.pt when there is one
    checkpoint_every: int = 50
    seed: int = 0  # data order and self-distillation sampling
    progress: bool = True  # tqdm bars
    features: str | None = None  # cache the frozen model's h0 and top-k here once, and train from it
    loss: str = "full"  # full: cross-entropy over the vocabulary; sampled: over candidates (head_features);
    # vocab: over the draft vocabulary, the only rows the drafters score (targets outside it are skipped);
    # distill: over the draft vocabulary against the frozen model's own distribution (distill_losses)
    topk: int = 16  # the base model's guesses stored per position (the sampled loss's hard negatives)
    negatives: int = 2048  # uniformly drawn negatives per micro-batch for the sampled loss
    draft_vocab: int = 8192  # the heads carry this many of the data's most frequent token ids (0 = none)
    next_token: bool = True  # the heads also read the token after h0's position (heads.py)
    init: str | None = None  # start from these trained heads (a heads directory) instead of the base head

    def __post_init__(self) -> None:
        self.data = tuple(self.data)
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.loss == "sampled" and not self.features:
            raise ValueError("the sampled loss needs --features DIR (it trains on the stored top-k guesses)")
        if self.topk < 1 or self.negatives < 1:
            raise ValueError("topk and negatives must be >= 1")
        if not self.data and not self.distill.tokens:
            raise ValueError("train-heads needs training text: --data FILE... or --self-distill N_TOKENS")
        if self.draft_vocab < 0:
            raise ValueError(f"draft_vocab must be >= 0, got {self.draft_vocab}")
        if self.loss in ("vocab", "distill") and not self.draft_vocab:
            raise ValueError(f"the {self.loss} loss needs a draft vocabulary: --draft-vocab N with N >= 1")
        for name in ("seq_len", "steps", "batch", "grad_accum", "checkpoint_every", "gamma", "doc_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < self.gamma + 2:
            raise ValueError(f"seq_len must be >= gamma + 2 = {self.gamma + 2}: every head needs a target")
        if not (0 <= self.warmup <= self.steps and self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError("need 0 <= warmup <= steps and 0 <= min_lr <= lr, lr > 0")


# -- command line (wired into tokenswift/cli/) --------------------------------------------------------------


FLAG_HELP = {  # shared with eval-heads; every text ends with the default argparse fills in
    "seq_len": "tokens per training sequence (default: %(default)s)",
    "doc_tokens": "keep only the first N tokens of each document; 0 = all (default: %(default)s)",
    "max_docs": "use at most this many documents (default: all)",
    "max_sequences": "evaluate at most this many sequences (default: %(default)s)",
    "steps": "optimiser steps (default: %(default)s)",
    "batch": "sequences per micro-batch (default: %(default)s)",
    "grad_accum": "micro-batches per optimiser step (default: %(default)s)",
    "warmup": "steps of linear learning-rate warm-up (default: %(default)s)",
    "checkpoint_every": "save a resumable checkpoint every N steps (default: %(default)s)",
    "seed": "data order and sampling seed (default: %(default)s)",
    "gamma": "number of draft heads, i.e. tokens guessed ahead (default: %(default)s)",
    "draft_vocab": "the heads carry the training text's most frequent token ids, and drafting scores only those; "
                   "0 = the whole vocabulary (default: %(default)s)",
    "lr": "peak learning rate (default: %(default)s)",
    "min_lr": "learning rate the cosine schedule ends at (default: %(default)s)",
    "weight_decay": "AdamW weight decay (default: %(default)s)",
    "grad_clip": "largest gradient norm; 0 = off (default: %(default)s)",
    "sample_tokens": "new tokens per self-distillation sample (default: --seq-len)",
    "prompt_tokens": "tokens of each prompt the samples start from (default: %(default)s)",
    "penalty_length": "W of the sampling penalty, in tokens (default: %(default)s)",
    "temperature": "sampling temperature (default: %(default)s)",
    "top_p": "sampling top-p; 1 = off (default: %(default)s)",
    "min_p": "sampling min-p; 0 = off (default: %(default)s)",
    "penalty": "sampling repetition penalty θ; 1 = off (default: %(default)s)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """train-heads"""
    d = TrainConfig.__dataclass_fields__
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument("--data", nargs="+", default=[], metavar="FILE",
                        help=".txt, .jsonl or .jsonl.xz (`text` field); with --self-distill: the prompts "
                             "(default: none)")
    parser.add_argument("--self-distill", type=int, default=0, metavar="N_TOKENS",
                        help="first generate N tokens with the model itself, then train on them (default: 0, off)")
    parser.add_argument("--out", required=True, help="heads directory (also holds the checkpoint)")
    for name in ("seq_len", "doc_tokens", "max_docs", "steps", "batch", "grad_accum", "warmup",
                 "checkpoint_every", "seed", "gamma", "draft_vocab"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=d[name].default, help=FLAG_HELP[name])
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=d[name].default,
                            help=FLAG_HELP[name])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--dtype", default="auto",
                        help="frozen model's dtype: auto, float32, bfloat16, ... (default: %(default)s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from <out>/checkpoint.pt if present (default: start afresh)")
    parser.add_argument("--features", metavar="DIR",
                        help="run the frozen model over the data once, store its hidden states and top-k guesses "
                             "in DIR (resumable), and train from them (default: run the model every step)")
    parser.add_argument("--loss", choices=LOSSES, default="full",
                        help="full: cross-entropy over the whole vocabulary; sampled: over the target, the "
                             "model's own top-k and shared random negatives (needs --features; far cheaper "
                             "on a CPU); vocab: over the draft vocabulary only; distill: over the draft "
                             "vocabulary, against the model's own distribution for each guessed token, so the "
                             "heads learn what the model will write rather than what the book says "
                             "(default: full)")
    parser.add_argument("--next-token", action=argparse.BooleanOptionalAction, default=True,
                        help="heads that also read the token after the state they start from (default: on)")
    parser.add_argument("--init", metavar="HEADS_DIR",
                        help="start from these trained heads, e.g. to fine-tune them with another loss "
                             "(default: fresh heads that repeat the base head)")
    parser.add_argument("--topk", type=int, default=d["topk"].default,
                        help="guesses of the model stored per position for the sampled loss (default: 16)")
    parser.add_argument("--negatives", type=int, default=d["negatives"].default,
                        help="random negatives per micro-batch for the sampled loss (default: 2048)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    g = parser.add_argument_group("self-distillation sampling")
    for name in ("sample_tokens", "prompt_tokens", "penalty_length"):
        g.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(DistillConfig, name, None),
                       help=FLAG_HELP[name])
    for name in ("temperature", "top_p", "min_p", "penalty"):
        g.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(DistillConfig, name),
                       help=FLAG_HELP[name])


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    distill = DistillConfig(args.self_distill, args.sample_tokens, args.prompt_tokens, args.temperature,
                            args.top_p, args.min_p, args.penalty, args.penalty_length)
    return TrainConfig(
        model=args.model, out=args.out, data=tuple(args.data), distill=distill, seq_len=args.seq_len,
        doc_tokens=args.doc_tokens or None, max_docs=args.max_docs, steps=args.steps, batch=args.batch,
        grad_accum=args.grad_accum, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, gamma=args.gamma, device=args.device,
        dtype=args.dtype, resume=args.resume, checkpoint_every=args.checkpoint_every, seed=args.seed,
        progress=not args.no_progress, features=args.features, loss=args.loss, topk=args.topk,
        negatives=args.negatives, draft_vocab=args.draft_vocab, next_token=args.next_token, init=args.init,
    )
