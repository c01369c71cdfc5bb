"""Training the draft layer by distillation from the model itself (draft_layer.py, draft_data.py).

The objective (draft_loss.py): the draft's distribution against the model's own, with chain steps unrolled as
drafting runs them. The learning curve's points: eval_draft.py.

Training stops and resumes at will: the layer, the optimizer and the data position are saved to a state file
(outside the repository) every few minutes and at each evaluation, and the latest weights (int8 rows,
draft_layer.save_layer) and the learning curve go to the output folder. Without a state file, training starts from
the output folder's weights when there are some, so committed weights carry on where the state was lost.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tokenswift.model.draft_layer import (
    CONFIG_NAME,
    DraftLayer,
    initial_layer,
    load_layer,
    save_layer,
    with_features,
)
from tokenswift.model.forward import fused_state
from tokenswift.settings import WRITING_DEFAULTS
from tokenswift.train.draft_data import TeacherStore
from tokenswift.train.draft_loss import (
    Penalty,
    distill_loss,
    penalised_loss,
    penalised_targets,
    soft_targets,
    unrolled_states,
)
from tokenswift.train.eval_draft import evaluate, point_line, print_curve

CURVE_NAME = "curve.json"


@dataclass(frozen=True)
class TrainDraftConfig:
    teacher: str  # draft-data folder of training text
    eval_teacher: str  # draft-data folder of held-out text
    out: str  # the draft layer's folder (weights, config, curve)
    state: str  # resumable state file (layer, optimizer, data position)
    model: str | None = None  # None: the default model
    tokens: int = 5_000_000  # train until this many tokens were seen (epochs over the teacher data count)
    batch: int = 4  # sequences per step
    seq_len: int = 512  # tokens per training row (a stored sequence is cut into rows of this length)
    draft_vocab: int = 8192
    unroll: int = 2  # chain steps trained per position (training-time test)
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100  # steps
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    noise: float = 0.03  # Gaussian noise on the model's states, relative to each state's RMS
    # The app's repetition penalty (tokenswift.settings.WRITING_DEFAULTS): the draft also learns the model's penalised
    # choices (draft_loss.penalised_loss), with this share of the score; penalty 1 leaves it out.
    penalty: float = WRITING_DEFAULTS["penalty"]
    penalty_window: int = WRITING_DEFAULTS["penalty_window"]
    penalised_share: float = 2 / 3
    eval_every: int = 250_000  # training tokens between evaluations (points of the learning curve)
    save_every_s: float = 300.0
    seed: int = 0
    # bfloat16 autocast for the products: off, because torch's CPU dispatch here (AVX2) has no bfloat16 kernels and
    # a bf16 product of these shapes runs ~4x slower than float32's; worth it on a GPU or an AMX CPU
    bf16: bool = False
    device: str = "cpu"  # where the model and the layer run: a GPU trains the same way in minutes
    # A fresh layer reads the layers the teacher data stores (draft_data --features, fused as EAGLE-3); this trains
    # one on the last layer's states alone from the same data (the two compared on equal terms).
    last_layer_only: bool = False


# -- data -------------------------------------------------------------------------------------------------


def vocab_from_teacher(store: TeacherStore, size: int, shards: int = 8) -> torch.Tensor:
    """The `size` token ids the model itself predicts most often (its top-1 over the first shards), then the
    most frequent text tokens to fill up: what drafts must be able to say."""
    counts: np.ndarray | None = None
    for i in range(min(shards, store.shards)):
        data = store.shard(i)
        top1 = np.bincount(data["top_ids"][..., 0].ravel(), minlength=1)
        text = np.bincount(data["tokens"].ravel(), minlength=1)
        n = max(len(top1), len(text))
        both = np.pad(top1, (0, n - len(top1))) * 4 + np.pad(text, (0, n - len(text)))
        counts = both if counts is None else np.pad(counts, (0, max(0, n - len(counts)))) + np.pad(
            both, (0, max(0, len(counts) - n)))
    order = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(order.astype(np.int64))


class Batches:
    """Batches of rows in a fixed order from a position (pass, index in the pass): a pass visits every shard
    present when it began, in an order fixed by (seed, pass), each shard's rows shuffled the same way. features:
    whether the rows bring the other layers' states (a layer that reads them)."""

    def __init__(self, store: TeacherStore, cfg: TrainDraftConfig, position: dict | None, features: bool):
        self.store, self.cfg, self.features = store, cfg, features
        seq = store.meta["plan"]["seq_len"]
        if seq % cfg.seq_len:
            raise ValueError(f"seq-len: {cfg.seq_len} must divide the teacher's sequences of {seq} tokens")
        self.split = seq // cfg.seq_len
        self.rows_per_shard = store.meta["plan"]["shard_seqs"] * self.split
        if self.rows_per_shard % cfg.batch:
            raise ValueError(f"batch: {cfg.batch} must divide the {self.rows_per_shard} rows of a shard")
        self.position = position or {"pass": 0, "shards": store.shards, "index": 0, "known": 0, "unique": 0}

    def _order(self) -> np.ndarray:
        rng = np.random.default_rng([self.cfg.seed, self.position["pass"]])
        return rng.permutation(self.position["shards"])

    def next(self) -> dict[str, torch.Tensor]:
        per_shard = self.rows_per_shard // self.cfg.batch
        if self.position["index"] >= self.position["shards"] * per_shard:
            self.store = TeacherStore(self.store.dir)  # shards written since the last pass join this one
            # "known": shards of earlier passes; rows of the others are seen for the first time
            self.position = {**self.position, "pass": self.position["pass"] + 1, "shards": self.store.shards,
                             "index": 0, "known": self.position["shards"]}
        i = self.position["index"]
        shard = int(self._order()[i // per_shard])
        rows = np.random.default_rng([self.cfg.seed, self.position["pass"], shard]).permutation(self.rows_per_shard)
        pick = np.sort(rows[(i % per_shard) * self.cfg.batch:(i % per_shard + 1) * self.cfg.batch])
        self.position["index"] = i + 1
        if shard >= self.position["known"]:
            self.position["unique"] += self.cfg.batch * self.cfg.seq_len
        return rows_of(self.store.shard(shard, self.features), pick, self.split, self.cfg.seq_len)


def rows_of(data: dict[str, np.ndarray], rows: np.ndarray, split: int, length: int) -> dict[str, torch.Tensor]:
    """Rows (a stored sequence cut into `split` parts of `length`) as tensors."""
    seqs, parts = rows // split, rows % split
    out = {}
    for name, arr in data.items():
        picked = np.stack([arr[s, p * length:(p + 1) * length] for s, p in zip(seqs, parts, strict=True)])
        out[name] = torch.from_numpy(picked.astype(np.float32 if arr.dtype == np.float16 else np.int64))
    return out


def all_rows(store: TeacherStore, length: int, features: bool = True) -> dict[str, torch.Tensor]:
    """Every row of a (small, held-out) store (features=False: without the other layers' states)."""
    parts = [store.shard(i, features) for i in range(store.shards)]
    seq = store.meta["plan"]["seq_len"]
    split = seq // length
    chunks = [rows_of(p, np.arange(len(p["tokens"]) * split), split, length) for p in parts]
    return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}


# -- the loop ------------------------------------------------------------------------------------------------


def lr_at(cfg: TrainDraftConfig, tokens: int, fresh_from: int = 0) -> float:
    """Cosine from lr to min_lr over cfg.tokens, with a linear warm-up over the first steps of a fresh optimizer
    (`fresh_from`: the token count where it started; a resume from weights alone starts one mid-schedule)."""
    step_tokens = cfg.batch * cfg.seq_len
    fresh_steps = (tokens - fresh_from) // step_tokens
    progress = min(1.0, tokens / cfg.tokens)
    cosine = cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))
    return cosine * min(1.0, (fresh_steps + 1) / cfg.warmup)


def save_state(path: Path, layer, optimizer, position: dict, tokens: int, curve: list, fresh_from: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"layer": layer.state_dict(), "optimizer": optimizer.state_dict(), "position": position,
                "tokens": tokens, "curve": curve, "fresh_from": fresh_from,
                "feature_layers": list(layer.feature_layers)}, tmp)
    os.replace(tmp, path)


def write_out(layer, out: Path, cfg: TrainDraftConfig, tokens: int, curve: list, record: dict) -> None:
    save_layer(layer, out, record | {"tokens_seen": tokens, "train": asdict(cfg)})
    (out / CURVE_NAME).write_text(json.dumps(curve, indent=2))


def train_draft(cfg: TrainDraftConfig, lm, progress: bool = True) -> list[dict]:
    """Train (or resume) until cfg.tokens; returns the learning curve."""
    from tokenswift.train.draft_data import model_id

    store, held = _teachers(cfg, model_id(lm))
    model, state_path, out, dev = lm.model, Path(cfg.state), Path(cfg.out), lm.device
    embed = model.model.embed_tokens
    rope = (model.rope_cos.float(), model.rope_sin.float())
    layer, saved = _start_layer(cfg, lm, store, state_path, out)
    _check_features(cfg, layer, store)
    layer = layer.to(dev)
    head_rows = model.head_weight[layer.vocab].float()
    to_draft = torch.full((lm.config.vocab_size,), -1, dtype=torch.int64, device=dev)
    to_draft[layer.vocab] = torch.arange(len(layer.vocab), device=dev)
    params = list(layer.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    tokens, curve = saved.get("tokens", 0), saved.get("curve", [])
    fresh_from = tokens
    # A state saved before the projections were fused (forward.fused_state) resumes with a fresh optimizer.
    if saved.get("optimizer") and "layer.self_attn.qkv_proj.weight" in saved["layer"]:
        optimizer.load_state_dict(saved["optimizer"])
        fresh_from = saved.get("fresh_from", 0)
    batches = Batches(store, cfg, saved.get("position"), bool(layer.feature_layers))
    eval_rows = all_rows(held, cfg.seq_len, bool(layer.feature_layers))
    # base_sha256: a GGUF file's draft layer is found by the file's hash wherever the file lies (default_model.py)
    record = {"model": store.meta["model"], "base_sha256": store.meta["model"].removeprefix("gguf:"),
              "teacher": store.meta["plan"],
              "eval_rows": int(eval_rows["tokens"].shape[0])}
    step_tokens = cfg.batch * cfg.seq_len
    next_eval = (tokens // cfg.eval_every + 1) * cfg.eval_every
    if not curve:
        curve.append(_curve_point(layer, embed, head_rows, eval_rows, rope, to_draft, tokens, batches, cfg,
                                  model.model.norm))
        print_curve(curve[-1:])
    last_save = time.monotonic()
    bar = tqdm(total=cfg.tokens, initial=tokens, unit="tok", unit_scale=True, desc="draft layer",
               disable=not progress, smoothing=0.05)
    autocast = torch.autocast(lm.device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    while tokens < cfg.tokens:
        batch = {name: value.to(dev, non_blocking=True) for name, value in batches.next().items()}
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, tokens, fresh_from)
        with autocast:
            noise = torch.Generator().manual_seed(cfg.seed * 1_000_003 + tokens)
            states = unrolled_states(layer, embed, batch, rope, cfg.unroll, cfg.noise, noise)
            loss = _score(layer, states, batch, head_rows, to_draft, model.model.norm, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        tokens += step_tokens
        bar.update(step_tokens)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.1e}")
        if tokens >= next_eval or tokens >= cfg.tokens:
            next_eval += cfg.eval_every
            curve.append(_curve_point(layer, embed, head_rows, eval_rows, rope, to_draft, tokens, batches, cfg,
                                      model.model.norm))
            bar.write(point_line(curve[-1]))
            write_out(layer, out, cfg, tokens, curve, record)
            save_state(state_path, layer, optimizer, batches.position, tokens, curve, fresh_from)
            last_save = time.monotonic()
        elif time.monotonic() - last_save > cfg.save_every_s:
            save_state(state_path, layer, optimizer, batches.position, tokens, curve, fresh_from)
            last_save = time.monotonic()
    bar.close()
    write_out(layer, out, cfg, tokens, curve, record)
    save_state(state_path, layer, optimizer, batches.position, tokens, curve, fresh_from)
    return curve


def _teachers(cfg: TrainDraftConfig, model: str) -> tuple[TeacherStore, TeacherStore]:
    """The training and the held-out teacher data, checked to be this model's and alike."""
    store, held = TeacherStore(Path(cfg.teacher)), TeacherStore(Path(cfg.eval_teacher))
    for s, flag in ((store, "teacher"), (held, "eval-teacher")):
        if s.meta["model"] != model:
            raise ValueError(f"{flag}: {s.dir} holds another model's outputs ({s.meta['model']})")
        if s.shards == 0:
            raise ValueError(f"{flag}: {s.dir} has no complete shard yet")
    if held.features != store.features:
        raise ValueError(f"eval-teacher: {held.dir} stores layers {list(held.features)}, the teacher "
                         f"{list(store.features)}: extract both with the same --features")
    return store, held


def _check_features(cfg: TrainDraftConfig, layer: DraftLayer, store: TeacherStore) -> None:
    """A layer that reads other layers than the last trains on teacher data that stores those very layers."""
    if layer.feature_layers and cfg.last_layer_only:
        raise ValueError(f"last-layer-only: the layer to go on with ({cfg.state} or {cfg.out}) reads layers "
                         f"{list(layer.feature_layers)} besides the last")
    if layer.feature_layers and layer.feature_layers != store.features:
        raise ValueError(f"teacher: {store.dir} stores layers {list(store.features)}, the draft layer reads "
                         f"{list(layer.feature_layers)}: train it on teacher data of its own --features")


def _score(layer, states, batch, head_rows, to_draft, final_norm, cfg: TrainDraftConfig) -> torch.Tensor:
    """The training score of one batch's unrolled chain steps: distillation, and where cfg has a penalty, its share
    of the penalised distillation (draft_loss.py)."""
    ids, probs = soft_targets(batch, to_draft)
    logits = [layer.logits(st, head_rows) for st in states]
    loss = sum(distill_loss(z, ids, probs, s) for s, z in enumerate(logits)) / len(states)
    penalty = _penalty(cfg)
    if penalty is None:
        return loss
    p_probs, mask = penalised_targets(batch, final_norm, head_rows, to_draft, penalty)
    penalised = sum(penalised_loss(z, p_probs, mask, cfg.penalty, s) for s, z in enumerate(logits)) / len(states)
    return (1 - cfg.penalised_share) * loss + cfg.penalised_share * penalised


def _penalty(cfg: TrainDraftConfig) -> Penalty | None:
    return Penalty(cfg.penalty, cfg.penalty_window) if cfg.penalty != 1.0 and cfg.penalised_share > 0 else None


def _start_layer(cfg: TrainDraftConfig, lm, store: TeacherStore, state_path: Path, out: Path):
    """The layer to train, and what was saved with it: the state file, else the output folder's weights (a fresh
    optimizer and data position, the curve and token count kept; widened to the teacher's --features unless
    last_layer_only), else a fresh layer."""
    model = lm.model
    if state_path.is_file():
        saved = torch.load(state_path, map_location="cpu", weights_only=False)
        vocab = saved["layer"]["vocab"]
        layer = DraftLayer(lm.config, len(vocab), cfg.seq_len, tuple(saved.get("feature_layers", ())))
        layer.load_state_dict(fused_state(saved["layer"]))
        return layer.float().train().requires_grad_(True), saved
    if (out / CONFIG_NAME).is_file():
        layer = load_layer(out, lm.config, model.head_weight, "cpu", torch.float32)
        if store.features and not layer.feature_layers and not cfg.last_layer_only:
            layer = with_features(layer, store.features)  # goes on as it was, then learns the rest
        record = json.loads((out / CONFIG_NAME).read_text()).get("record", {})
        curve = json.loads((out / CURVE_NAME).read_text()) if (out / CURVE_NAME).is_file() else []
        return layer.train().requires_grad_(True), {"tokens": record.get("tokens_seen", 0), "curve": curve}
    features = () if cfg.last_layer_only else store.features
    layer = initial_layer(model, vocab_from_teacher(store, cfg.draft_vocab), cfg.seq_len, cfg.seed, features)
    return layer.train().requires_grad_(True), {}


def _curve_point(layer, embed, head_rows, rows, rope, to_draft, tokens: int, batches: Batches,
                 cfg: TrainDraftConfig, final_norm) -> dict:
    layer.eval()
    point = evaluate(layer, embed, head_rows, rows, rope, 3, to_draft, penalty=_penalty(cfg), final_norm=final_norm)
    layer.train()
    return {"tokens": tokens, "unique_tokens": batches.position["unique"], **point}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """train-draft"""
    d = TrainDraftConfig.__dataclass_fields__
    parser.add_argument("--model", help="checkpoint directory or .gguf file (default: the default model)")
    parser.add_argument("--teacher", required=True, help="draft-data folder of training text")
    parser.add_argument("--eval-teacher", required=True, help="draft-data folder of held-out text")
    parser.add_argument("--out", required=True, help="draft layer folder: weights, config and curve")
    parser.add_argument("--state", required=True,
                        help="resumable state file (layer, optimizer, data position); keep it outside the repo")
    for name in ("tokens", "batch", "seq_len", "draft_vocab", "unroll", "warmup", "eval_every", "seed",
                 "penalty_window"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=d[name].default,
                            help=f"(default: {d[name].default})")
    for name in ("lr", "min_lr", "weight_decay", "grad_clip", "noise", "save_every_s", "penalty", "penalised_share"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=d[name].default,
                            help=f"(default: {d[name].default})")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the products (default: float32)")
    parser.add_argument("--last-layer-only", action="store_true",
                        help="a layer that reads the last layer's states alone, also from teacher data stored with "
                             "--features (default: the layers the teacher data stores)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: loading.cpu_threads's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")


def run(args: argparse.Namespace) -> int:
    from tokenswift.model.default_model import default_model_path
    from tokenswift.model.loading import load_model

    for name in ("tokens", "batch", "seq_len", "draft_vocab", "unroll", "eval_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1")
    if not (args.lr > 0 and args.min_lr >= 0):
        raise ValueError("lr: must be > 0 (and min-lr >= 0)")
    if not (args.penalty >= 1.0 and 0.0 <= args.penalised_share <= 1.0 and args.penalty_window >= 1):
        raise ValueError("penalty: must be >= 1 (1 = off), penalised-share in [0, 1] and penalty-window >= 1")
    cfg = TrainDraftConfig(**{n: getattr(args, n) for n in TrainDraftConfig.__dataclass_fields__})
    lm = load_model(cfg.model or str(default_model_path()), device=cfg.device, dtype="float32", heads="none",
                    draft="none", threads=args.threads)
    with lm.running():
        curve = train_draft(cfg, lm, not args.no_progress)
    print_curve(curve)
    return 0
