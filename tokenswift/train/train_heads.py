"""Train the draft heads (design §2) on a frozen model.

    train-heads --model M (--data FILE... | --self-distill N) --out DIR [--seq-len L] [--steps S] ...

The base model runs under no_grad and gives h0 (head_model.py). Only the heads train. Head i at position t
predicts token t+1+i; the loss is the plain sum of the heads' cross-entropies. AdamW, linear warm-up then cosine
decay, gradient accumulation, bf16 autocast on CUDA. Under `accelerate launch` the same command trains data-
parallel.

Every `checkpoint_every` steps `<out>/checkpoint.pt` holds heads, optimiser, schedule, step, RNG and data
position; the data order is a function of the seed alone, so `--resume` after an interruption ends with
the very heads an uninterrupted run would have produced.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from tokenswift.model import gguf_checkpoint
from tokenswift.model.heads import DraftHeads, HeadsError, load_heads, save_heads
from tokenswift.model.loading import LoadedModel, load_model
from tokenswift.train.data import Packed, load_sequences, opening_tokens, pack, read_documents
from tokenswift.train.head_config import TrainConfig, config_from_args
from tokenswift.train.head_features import FeatureStore, extract, open_or_create, sampled_losses
from tokenswift.train.head_model import (
    base_hidden,
    distill_losses,
    head_losses,
    head_states,
    initial_heads,
    pick_device,
    pick_dtype,
    vocab_losses,
)
from tokenswift.train.parallel import Parallel
from tokenswift.train.self_distill import self_distill, write_distilled

CHECKPOINT_NAME = "checkpoint.pt"
DISTILL_NAME = "self-distill.jsonl"
# Settings a checkpoint must share with the run that resumes it, or the data order / schedule would differ.
RESUME_KEYS = ("seq_len", "batch", "grad_accum", "steps", "lr", "min_lr", "warmup", "seed", "gamma", "loss", "topk",
               "negatives", "next_token", "draft_vocab", "init")


@dataclass
class TrainResult:
    heads: DraftHeads
    record: dict  # also written into heads_config.json


# -- the heads training starts from ----------------------------------------------------------------


def starting_heads(lm: LoadedModel, cfg: TrainConfig) -> DraftHeads:
    """The heads training starts from: fresh ones that repeat the base head, or cfg.init's trained heads (their
    draft vocabulary is dropped: the one of this run's data replaces it when the heads are saved)."""
    if cfg.init is None:
        return initial_heads(lm, cfg.gamma, cfg.next_token)
    trained = load_heads(Path(cfg.init), lm.config, lm.device, torch.float32)
    if (trained.gamma, trained.next_token) != (cfg.gamma, cfg.next_token):
        raise HeadsError(f"heads in {cfg.init} have gamma {trained.gamma} and next_token {trained.next_token}; "
                         f"this run trains gamma {cfg.gamma}, next_token {cfg.next_token}")
    heads = initial_heads(lm, cfg.gamma, cfg.next_token)
    heads.load_state_dict({k: v for k, v in trained.state_dict().items() if k != "vocab"})
    return heads


# -- data ---------------------------------------------------------------------------------------------


def training_data(lm: LoadedModel, cfg: TrainConfig, par: Parallel) -> tuple[Packed, dict]:
    """The packed training sequences and how they were made (for the heads' record)."""
    info: dict = {"files": [str(p) for p in cfg.data], "doc_tokens": cfg.doc_tokens, "max_docs": cfg.max_docs}
    if not cfg.distill.tokens:
        packed = load_sequences(cfg.data, lm.encode, cfg.seq_len, cfg.doc_tokens, cfg.max_docs)
        return packed, info | packed.describe()
    cache = Path(cfg.out) / DISTILL_NAME
    if par.main and not (cfg.resume and cache.exists()):
        length = cfg.distill.sample_tokens or cfg.seq_len
        docs = self_distill(lm, cfg.distill, distill_prompts(lm, cfg), length, cfg.seed, cfg.progress)
        write_distilled(cache, docs, lm)
    par.barrier()  # the other processes read what the main one wrote
    docs = [json.loads(line)["ids"] for line in cache.read_text().splitlines()]
    packed = pack(docs, cfg.seq_len, f"self-distilled text ({cache})")
    info |= {"self_distill": asdict(cfg.distill), "distilled_file": str(cache)}
    return packed, info | packed.describe()


def distill_prompts(lm: LoadedModel, cfg: TrainConfig) -> list[list[int]]:
    if cfg.data:
        texts = read_documents(cfg.data, cfg.max_docs)
        return [opening_tokens(t, lm.encode, cfg.distill.prompt_tokens) for t in texts]
    # Qwen has no BOS: its end-of-text token is what precedes a document there.
    starts = (lm.config.bos_token_id, lm.tokenizer.bos_token_id, lm.tokenizer.eos_token_id)
    return [[next(t for t in starts if t is not None)]]


def sample_indices(n: int, seed: int, start: int, count: int) -> list[int]:
    """Items start..start+count-1 of an endless stream over n sequences, each epoch a fresh permutation.
    It depends on (seed, position) alone, so a resumed run reads exactly what an uninterrupted one would."""
    orders: dict[int, torch.Tensor] = {}
    picks = []
    for k in range(start, start + count):
        epoch, i = divmod(k, n)
        if epoch not in orders:
            rng = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            orders[epoch] = torch.randperm(n, generator=rng)
        picks.append(int(orders[epoch][i]))
    return picks


def fingerprint(tokens: torch.Tensor) -> str:
    return hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()[:16]


# -- optimisation -------------------------------------------------------------------------------------


def make_optimizer(heads: DraftHeads, cfg: TrainConfig) -> torch.optim.AdamW:
    # Decay the square matrices only: shrinking a norm's gain towards 0 would just rescale the logits.
    decay = [p for p in heads.parameters() if p.dim() >= 2]
    other = [p for p in heads.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at `step`: 1) linear warm-up, 2) cosine down to min_lr at the last step."""
    if step < cfg.warmup:
        return (step + 1) / (cfg.warmup + 1)
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_step(lm: LoadedModel, heads: torch.nn.Module, opt, sched, data: torch.Tensor, position: int,
               cfg: TrainConfig, par: Parallel, store: FeatureStore | None = None,
               vocab: torch.Tensor | None = None) -> torch.Tensor:
    """One optimiser step over grad_accum micro-batches, read from data-stream micro-batch `position` on.
    Returns [2*gamma]: per-head loss then per-head top-1, averaged over micro-batches and processes."""
    device = torch.device(par.device)
    totals = torch.zeros(2 * cfg.gamma, device=device)
    for a in range(cfg.grad_accum):
        start = ((position + a) * par.world + par.rank) * cfg.batch
        rows = sample_indices(len(data), cfg.seed, start, cfg.batch)
        if store is None:
            tokens = data[rows].to(device)
            hidden, guesses = base_hidden(lm, tokens), None
        else:
            tokens, hidden, guesses = (t.to(device) for t in store.batch(rows))
        with par.no_sync(heads, skip=a < cfg.grad_accum - 1):
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                if cfg.loss == "sampled":
                    noise = torch.Generator(device).manual_seed(cfg.seed * 1_000_003 + start)
                    states = head_states(lm, heads, hidden, tokens)
                    losses, top1 = sampled_losses(lm, states, tokens, guesses, cfg.negatives, noise)
                elif cfg.loss == "vocab":
                    losses, top1 = vocab_losses(lm, head_states(lm, heads, hidden, tokens), tokens, vocab)
                elif cfg.loss == "distill":
                    losses, top1 = distill_losses(lm, head_states(lm, heads, hidden, tokens), hidden, vocab)
                else:
                    losses, top1 = head_losses(lm, heads, hidden, tokens)
            (sum(losses) / cfg.grad_accum).backward()
        totals += torch.cat((torch.stack(losses).detach(), top1)) / cfg.grad_accum
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(heads.parameters(), cfg.grad_clip)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return par.mean(totals)


# -- checkpoints --------------------------------------------------------------------------------------


def resume_settings(cfg: TrainConfig, data_id: str, world: int) -> dict:
    return {k: getattr(cfg, k) for k in RESUME_KEYS} | {"distill": asdict(cfg.distill), "world": world,
                                                       "data": data_id}


def save_checkpoint(path: Path, heads: DraftHeads, opt, sched, step: int, position: int, cfg: TrainConfig,
                    data_id: str, world: int) -> None:
    state = {
        "step": step,
        "data_position": position,  # micro-batches consumed (per process; the stream is strided by rank)
        "heads": heads.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "settings": resume_settings(cfg, data_id, world),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: an interruption mid-write leaves the previous checkpoint intact


def load_checkpoint(path: Path, heads: DraftHeads, opt, sched, cfg: TrainConfig, data_id: str,
                    world: int) -> tuple[int, int]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    now = resume_settings(cfg, data_id, world)
    then = state["settings"]
    changed = [f"{k}: {then.get(k)} -> {v}" for k, v in now.items() if then.get(k) != v]
    if changed:
        raise ValueError(f"cannot resume from {path}: settings or data differ ({'; '.join(changed)}); "
                         "keep them, or train into a fresh --out")
    heads.load_state_dict(state["heads"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"], state["data_position"]


# -- the run ------------------------------------------------------------------------------------------


def train_heads(cfg: TrainConfig, lm: LoadedModel | None = None,
                on_step: Callable[[int, dict], None] | None = None) -> TrainResult:
    """Train, checkpoint, and write <out>/heads.safetensors + heads_config.json (with the record).

    lm: an already loaded model on the right device (tests, notebooks); on_step(step, metrics) runs
    after every step, after any checkpoint of that step."""
    device = pick_device(cfg.device)
    par = Parallel(device)
    if lm is None:
        lm = load_model(cfg.model, device=par.device, dtype=pick_dtype(cfg.dtype, device), heads="none")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    packed, data_info = training_data(lm, cfg, par)
    data_id = fingerprint(packed.tokens)
    store = None
    if cfg.features:
        store = open_or_create(Path(cfg.features), packed.tokens, lm.config.dim, cfg.topk, cfg.model, data_id)
        if par.main:
            extract(lm, store, cfg.progress)
        par.barrier()
        store = FeatureStore(Path(cfg.features))
        data_info |= {"features": cfg.features}
    heads = starting_heads(lm, cfg).to(par.device, torch.float32)  # float32 master weights
    vocab = draft_vocabulary(packed.tokens, lm.config.vocab_size, cfg.draft_vocab).to(par.device) \
        if cfg.draft_vocab else None
    opt = make_optimizer(heads, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    step = position = 0
    if cfg.resume and (out / CHECKPOINT_NAME).exists():
        step, position = load_checkpoint(out / CHECKPOINT_NAME, heads, opt, sched, cfg, data_id, par.world)
    model = par.wrap(heads)
    metrics = {}
    bar = tqdm(total=cfg.steps, initial=step, desc="train-heads", disable=not (cfg.progress and par.main))
    while step < cfg.steps:
        values = train_step(lm, model, opt, sched, packed.tokens, position, cfg, par, store, vocab).tolist()
        step, position = step + 1, position + cfg.grad_accum
        metrics = {"loss": sum(values[: cfg.gamma]), "loss_per_head": values[: cfg.gamma],
                   "top1_per_head": values[cfg.gamma:], "lr": sched.get_last_lr()[0]}
        top1 = "/".join(f"{a:.2f}" for a in metrics["top1_per_head"])
        bar.set_postfix_str(f"loss={metrics['loss']:.3f} top1={top1}", refresh=False)
        bar.update()
        if par.main and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            save_checkpoint(out / CHECKPOINT_NAME, heads, opt, sched, step, position, cfg, data_id, par.world)
        if on_step is not None:
            on_step(step, metrics)
    bar.close()
    record = make_record(cfg, data_info, metrics, par.world)
    if source := gguf_checkpoint.source_record(lm.path):  # shipped heads are found by the GGUF file's hash
        record["base_sha256"] = source["sha256"]
    if vocab is not None:
        heads = heads.with_vocab(vocab)
    if par.main:
        save_heads(heads, out, record=record)
    par.barrier()
    return TrainResult(heads.eval().requires_grad_(False), record)


def draft_vocabulary(tokens: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` token ids most frequent in `tokens`, most frequent first (ties: lower id first)."""
    counts = torch.bincount(tokens.flatten(), minlength=vocab_size)
    return torch.sort(counts, descending=True, stable=True).indices[: min(size, vocab_size)]


def make_record(cfg: TrainConfig, data_info: dict, final: dict, world: int) -> dict:
    """final: the last step's metrics (empty when a resumed run had no step left)."""
    skip = ("model", "out", "data", "resume", "progress")
    settings = {k: v for k, v in asdict(cfg).items() if k not in skip}
    tokens_per_step = cfg.batch * cfg.grad_accum * world * cfg.seq_len
    return {"trained_by": "tokenswift train-heads", "model": cfg.model, "data": data_info,
            "settings": settings | {"processes": world}, "steps": cfg.steps,
            "tokens_seen": cfg.steps * tokens_per_step, "final": final}


# -- command line (wired into tokenswift/cli/) ------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    result = train_heads(config_from_args(args))
    final = result.record["final"]
    if final:
        print(f"heads written to {args.out}: loss {final['loss']:.4f}, top-1 per head "
              + " / ".join(f"{a:.3f}" for a in final["top1_per_head"]))
    return 0
