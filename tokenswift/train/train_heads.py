"""Train the draft heads (design §2) on a frozen model, and import the official TokenSwift heads.

    train-heads --model M (--data FILE... | --self-distill N) --out DIR [--seq-len L] [--steps S] ...
    import-heads --from CHECKPOINT_DIR --out DIR

The base model runs under no_grad and gives h0, the last layer's output before the final norm, exactly as
the engine computes it: our own forward over a fresh KV cache under a causal mask, one sequence at a time
(the model API is batch-1). Only the heads train. Head i at position t predicts token t+1+i; the loss is
the plain sum of the heads' cross-entropies. AdamW, linear warm-up then cosine decay, gradient
accumulation, bf16 autocast on CUDA. Under `accelerate launch` the same command trains data-parallel.

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
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from tokenswift.decode.engine import PREFILL_CHUNK
from tokenswift.draft.heads import (
    OFFICIAL_PREFIX,
    DraftHeads,
    HeadsError,
    heads_from_state_dict,
    load_heads,
    new_heads,
    save_heads,
)
from tokenswift.model import gguf_checkpoint
from tokenswift.model.config import ModelConfig
from tokenswift.model.forward import causal_mask
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel, load_model, read_state_dict
from tokenswift.train.data import DataError, Packed, load_sequences, opening_tokens, pack, read_documents
from tokenswift.train.head_features import FeatureStore, extract, open_or_create, sampled_losses

CHECKPOINT_NAME = "checkpoint.pt"
DISTILL_NAME = "self-distill.jsonl"
# Settings a checkpoint must share with the run that resumes it, or the data order / schedule would differ.
RESUME_KEYS = ("seq_len", "batch", "grad_accum", "steps", "lr", "min_lr", "warmup", "seed", "gamma", "loss", "topk",
               "negatives", "next_token", "draft_vocab", "init")
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


@dataclass
class TrainResult:
    heads: DraftHeads
    record: dict  # also written into heads_config.json


# -- model side: the frozen base and the heads' logits ----------------------------------------------


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def pick_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


@torch.no_grad()
def base_hidden(lm: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """h0 [B, T, dim] for tokens [B, T]: the engine's own chunked prefill, one sequence at a time.

    no_grad rather than inference_mode: inference tensors could not be saved for the heads' backward."""
    cfg, dev = lm.config, lm.device
    t = tokens.shape[1]
    lm.check_positions(t)
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, t, cfg.head_dim, dev, lm.dtype)  # rows overwrite it
    rows = []
    for row in tokens.to(dev):
        chunks = []
        for start in range(0, t, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, t)
            pos = torch.arange(start, end, device=dev)
            mask = causal_mask(start, end - start, pos, cfg.sliding_window, dev)
            chunks.append(lm.model(row[start:end], pos, cache, start, mask, logits="none").hidden)
        rows.append(torch.cat(chunks))
    return torch.stack(rows)


def initial_heads(lm: LoadedModel, gamma: int = 3, next_token: bool = False) -> DraftHeads:
    """Fresh heads that start out exactly as the base head: W_i = 0 (new_heads), and each output norm
    takes the model's final-norm gain, so logits_i = the base logits at first instead of a rescaled copy."""
    heads = new_heads(lm.config, gamma, next_token).to(lm.device)
    with torch.no_grad():
        for layer in heads.layers:
            layer.post_layernorm.weight.copy_(lm.model.model.norm.weight)
    return heads


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


def self_distill(lm: LoadedModel, dc: DistillConfig, prompts: list[list[int]], sample_tokens: int,
                 seed: int, progress: bool = True) -> list[list[int]]:
    """Documents (prompt + sample) of plain decoding, dc.tokens generated tokens in all. Sample k uses
    prompt k mod len(prompts) and seed + k: sampling noise is keyed by seed and position, so one seed
    would repeat the same text."""
    from tokenswift.decode.generate import Generator
    from tokenswift.decode.settings import Settings

    docs, made = [], 0
    with tqdm(total=dc.tokens, desc="self-distill", unit="tok", disable=not progress) as bar:
        while made < dc.tokens:
            k = len(docs)
            settings = Settings(mode="ar", seed=seed + k, max_new_tokens=min(sample_tokens, dc.tokens - made),
                                temperature=dc.temperature, top_p=dc.top_p, min_p=dc.min_p,
                                penalty=dc.penalty, penalty_length=dc.penalty_length)
            prompt = prompts[k % len(prompts)]
            ids = Generator(lm, settings, prompt).run(lambda new: bar.update(len(new)))
            docs.append(prompt + ids)
            made += len(ids)
    return docs


def write_distilled(path: Path, docs: list[list[int]], lm: LoadedModel) -> None:
    """One JSON line per sample: the ids we train on, and the text, so the file also serves as --data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"text": lm.decode(d), "ids": d}, ensure_ascii=False) for d in docs)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


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


# -- parallelism: accelerate only when launched by it -------------------------------------------------


class Parallel:
    """Data parallelism under `accelerate launch` (WORLD_SIZE > 1): heads wrapped in DDP, each process
    reads its own stride of the data stream. On one device it does nothing, and accelerate is not imported."""

    def __init__(self, device: str):
        self.acc = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.acc = Accelerator(cpu=device == "cpu")
        self.rank = self.acc.process_index if self.acc else 0
        self.world = self.acc.num_processes if self.acc else 1
        self.device = str(self.acc.device) if self.acc else device

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wrap(self, heads: DraftHeads) -> torch.nn.Module:
        return self.acc.prepare_model(heads) if self.acc else heads

    def no_sync(self, model: torch.nn.Module, skip: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        return model.no_sync() if self.acc and skip else nullcontext()

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.acc.reduce(t, "mean") if self.acc else t

    def barrier(self) -> None:
        if self.acc:
            self.acc.wait_for_everyone()


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


# -- import of the official TokenSwift heads ----------------------------------------------------------


@dataclass
class ImportConfig:
    source: str  # an official TokenSwift checkpoint directory (model.medusa_layers.{j}.* tensors)
    out: str  # our heads directory


def official_head_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Only the `model.medusa_layers.*` tensors. From safetensors files we read just those keys (a 32B
    checkpoint's other 60 GB stay on disk); .bin checkpoints go through read_state_dict."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted({f for k, f in json.loads(index.read_text())["weight_map"].items()
                        if k.startswith(OFFICIAL_PREFIX)})
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        return {k: v for k, v in read_state_dict(path).items() if k.startswith(OFFICIAL_PREFIX)}
    found = {}
    for name in files:
        with safe_open(str(path / name), "pt") as f:
            found |= {k: f.get_tensor(k) for k in f.keys() if k.startswith(OFFICIAL_PREFIX)}  # noqa: SIM118
    return found


def import_heads(cfg: ImportConfig) -> DraftHeads:
    from transformers import AutoConfig

    path = Path(cfg.source)
    if not (path / "config.json").is_file():
        raise HeadsError(f"{path} has no config.json: not a checkpoint directory")
    try:  # the heads' width and norm epsilon are the model's
        model_cfg = ModelConfig.from_hf(AutoConfig.from_pretrained(path, local_files_only=True))
    except Exception as error:  # noqa: BLE001 - name the file that failed
        raise HeadsError(f"cannot read {path / 'config.json'}: {error}") from error
    heads = heads_from_state_dict(official_head_tensors(path), model_cfg)
    if heads is None:
        raise HeadsError(f"{path} holds no draft heads: no {OFFICIAL_PREFIX}* tensors")
    record = {"imported_from": str(path), "format": "TokenSwift model.medusa_layers"}
    save_heads(heads, Path(cfg.out), record=record)
    return heads


# -- command line (wired into tokenswift/cli/main.py) -------------------------------------------------------


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


def run(args: argparse.Namespace) -> int:
    result = train_heads(config_from_args(args))
    final = result.record["final"]
    if final:
        print(f"heads written to {args.out}: loss {final['loss']:.4f}, top-1 per head "
              + " / ".join(f"{a:.3f}" for a in final["top1_per_head"]))
    return 0


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """import-heads"""
    parser.add_argument("--from", dest="source", required=True, metavar="CHECKPOINT_DIR",
                        help="an official TokenSwift checkpoint (model.medusa_layers.* tensors)")
    parser.add_argument("--out", required=True, help="heads directory to write")


def run_import(args: argparse.Namespace) -> int:
    heads = import_heads(ImportConfig(args.source, args.out))
    print(f"imported {heads.gamma} heads (dim {heads.dim}) from {args.source} to {args.out}")
    return 0


__all__ = ["DataError", "DistillConfig", "ImportConfig", "TrainConfig", "TrainResult", "add_arguments",
           "add_import_arguments", "base_hidden", "draft_logits", "import_heads", "run", "run_import",
           "self_distill", "train_heads"]
