"""What the model itself says about book text, computed once and kept in shards: the draft layer's teacher.

Training the draft layer by distillation needs, at every position t of a training text, the model's
last-layer state h_t (the draft's input) and the model's own next-token distribution there (its soft label).
The frozen model's forward is most of the cost of a training step on a CPU, so it runs once per text and its
answers are stored: shard after shard of

    tokens [S, T] int32, hidden [S, T, dim] float16, top_ids [S, T, K] int32, top_logp [S, T, K] float16

where top_ids/top_logp are the model's K most likely next tokens and their log-probabilities (over the whole
vocabulary); with `features` (layer numbers, for a draft layer that fuses a low, a middle and the last layer's
states, as EAGLE-3) also features [S, T, len(features)·dim] float16, those layers' outputs side by side. Epochs
of draft training then reuse them at no further cost.

Which texts: every book of the given files is tokenised whole and cut into non-overlapping sequences of T
tokens; the sequences of all books are shuffled once (seed fixed), so each shard mixes many books and a
shorter run is a fair sample of a longer one. A shard is written to a temporary folder and renamed into place,
then the manifest counts it: an interrupted extraction loses at most the shard it was on and resumes there.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import causal_mask
from tokenswift.train.data import DataError, read_documents

MANIFEST = "teacher.json"
ARRAYS = ("tokens", "hidden", "top_ids", "top_logp")
FP16_MAX = 65504.0


def array_names(features: bool) -> tuple[str, ...]:
    """A shard's arrays: ARRAYS, and "features" where the other layers' states are stored (and wanted)."""
    return ARRAYS + (("features",) if features else ())


@dataclass(frozen=True)
class TeacherPlan:
    files: tuple[str, ...]  # the book files, as given
    seq_len: int
    topk: int
    shard_seqs: int  # sequences per shard
    seed: int
    features: tuple[int, ...] = ()  # layers (numbered from 1) whose outputs are stored besides the last one's

    def key(self) -> dict:
        key = {"files": [Path(f).name for f in self.files], "seq_len": self.seq_len, "topk": self.topk,
               "shard_seqs": self.shard_seqs, "seed": self.seed}
        return key | ({"features": list(self.features)} if self.features else {})


class TeacherStore:
    """A folder of shards; `shards` counts the complete ones (the manifest is written after each)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        manifest = self.dir / MANIFEST
        if not manifest.is_file():
            raise DataError(f"{self.dir}: no teacher data here (no {MANIFEST}); run `tokenswift draft-data` first")
        try:
            self.meta = json.loads(manifest.read_text())
        except ValueError as error:
            raise DataError(f"{manifest}: not valid JSON ({error})") from error

    @property
    def shards(self) -> int:
        return self.meta["shards"]

    @property
    def features(self) -> tuple[int, ...]:
        return tuple(self.meta["plan"].get("features", ()))

    @property
    def tokens_per_shard(self) -> int:
        return self.meta["plan"]["shard_seqs"] * self.meta["plan"]["seq_len"]

    def shard(self, i: int, features: bool = True) -> dict[str, np.ndarray]:
        """Shard i's arrays (memory-mapped); features=False leaves the other layers' states out."""
        if not 0 <= i < self.shards:
            raise IndexError(f"shard {i} of {self.shards}")
        folder = self.dir / f"shard-{i:05d}"
        return {name: np.load(folder / f"{name}.npy", mmap_mode="r")
                for name in array_names(bool(self.features) and features)}

    def save_meta(self) -> None:
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.meta, indent=2))
        os.replace(tmp, self.dir / MANIFEST)


def open_store(directory: Path, plan: TeacherPlan, model_id: str) -> TeacherStore:
    """The store for this plan and model, created if absent; one made for another plan or model is refused."""
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        store = TeacherStore(directory)
        if store.meta["plan"] != plan.key() or store.meta["model"] != model_id:
            raise DataError(f"{directory} holds teacher data of another model or plan "
                            f"({store.meta['model']}, {store.meta['plan']}); use another folder")
        return store
    directory.mkdir(parents=True, exist_ok=True)
    store_meta = {"model": model_id, "plan": plan.key(), "shards": 0, "sequences_total": None}
    (directory / MANIFEST).write_text(json.dumps(store_meta, indent=2))
    return TeacherStore(directory)


def sequence_starts(books: list[np.ndarray], seq_len: int, seed: int) -> list[tuple[int, int]]:
    """(book, start) of every whole sequence of every book, shuffled once by `seed`."""
    starts = [(b, s) for b, ids in enumerate(books) for s in range(0, len(ids) - seq_len + 1, seq_len)]
    order = np.random.default_rng(seed).permutation(len(starts))
    return [starts[i] for i in order]


def tokenized_books(lm, files: tuple[str, ...], cache: Path) -> list[np.ndarray]:
    """Every document of the files as token ids, tokenised once and kept beside the shards."""
    path = cache / "books.npz"
    if path.is_file():
        with np.load(path) as saved:
            return [saved[f"b{i}"] for i in range(len(saved.files))]
    docs = read_documents(list(files))
    books = [np.asarray(lm.encode(text), dtype=np.int32) for text in tqdm(docs, desc="tokenising", unit="book")]
    tmp = cache / "books.tmp.npz"
    np.savez(tmp, **{f"b{i}": ids for i, ids in enumerate(books)})
    os.replace(tmp, path)
    return books


@torch.no_grad()
def teacher_outputs(lm, tokens: torch.Tensor, topk: int, features: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    """For one sequence [T]: last-layer states hidden [T, dim], the top-k next-token ids top_ids [T, k] and their
    log-probabilities top_logp; with `features`, those layers' outputs side by side [T, len(features)·dim]."""
    cfg, dev, t = lm.config, lm.device, tokens.shape[0]
    lm.check_positions(t)
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, t, cfg.head_dim, dev, lm.dtype)
    pos = torch.arange(t, device=dev)
    out = lm.model(tokens.to(dev), pos, cache, 0, causal_mask(0, t, pos, cfg.sliding_window, dev), logits="none",
                   keep_layers=features)
    logp = torch.log_softmax(lm.model.logits_of(out.hidden).float(), dim=-1)
    top = logp.topk(topk, dim=-1)
    outputs = {"hidden": out.hidden.float(), "top_ids": top.indices, "top_logp": top.values}
    return outputs | ({"features": torch.cat(out.layers, dim=-1).float()} if features else {})


def extract(lm, store: TeacherStore, plan: TeacherPlan, max_tokens: int, progress: bool = True) -> TeacherStore:
    """Add shards until the store holds `max_tokens` tokens (or the books run out); resumes where it stopped."""
    books = tokenized_books(lm, plan.files, store.dir)
    starts = sequence_starts(books, plan.seq_len, plan.seed)
    store.meta["sequences_total"] = len(starts)
    available = len(starts) // plan.shard_seqs
    wanted = min(available, -(-max_tokens // store.tokens_per_shard))
    if wanted == 0:
        raise DataError(f"{', '.join(plan.files)}: fewer than {plan.shard_seqs} sequences of {plan.seq_len} tokens")
    with tqdm(total=wanted * store.tokens_per_shard, initial=min(store.shards, wanted) * store.tokens_per_shard,
              desc="teacher", unit="tok", unit_scale=True, disable=not progress) as bar:
        while store.shards < wanted:
            i = store.shards
            batch = starts[i * plan.shard_seqs:(i + 1) * plan.shard_seqs]
            _write_shard(lm, store.dir / f"shard-{i:05d}", batch, books, plan)
            store.meta["shards"] = i + 1
            store.save_meta()  # after the shard is in place: a crash can only lose work, never count junk
            bar.update(store.tokens_per_shard)
    return store


def _write_shard(lm, folder: Path, batch: list[tuple[int, int]], books: list[np.ndarray], plan: TeacherPlan) -> None:
    arrays: dict[str, list[np.ndarray]] = {name: [] for name in array_names(bool(plan.features))}
    for b, s in batch:
        ids = books[b][s:s + plan.seq_len]
        out = teacher_outputs(lm, torch.from_numpy(ids.astype(np.int64)), plan.topk, plan.features)
        arrays["tokens"].append(ids)
        for name in ("hidden", "features"):
            if name in out:
                arrays[name].append(out[name].clamp(-FP16_MAX, FP16_MAX).to(torch.float16).cpu().numpy())
        arrays["top_ids"].append(out["top_ids"].to(torch.int32).cpu().numpy())
        arrays["top_logp"].append(out["top_logp"].clamp(min=-FP16_MAX).to(torch.float16).cpu().numpy())
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, rows in arrays.items():
        np.save(tmp / f"{name}.npy", np.stack(rows))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def model_id(lm) -> str:
    """What the teacher data belongs to: a GGUF file's content hash, else the checkpoint's name and shape."""
    from tokenswift.model.gguf_checkpoint import source_record

    source = source_record(lm.path)
    if source:
        return f"gguf:{source['sha256']}"
    cfg = lm.config
    return f"{Path(str(lm.name)).name}:{cfg.vocab_size}x{cfg.dim}x{cfg.n_layers}"


def feature_layers(text: str, n_layers: int) -> tuple[int, ...]:
    """--features "2,15" -> (2, 15): distinct layers below the last (whose output is always stored), ascending."""
    try:
        layers = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise ValueError(f"features: {text!r} is not a comma-separated list of layer numbers") from None
    if any(not 1 <= n < n_layers for n in layers):
        raise ValueError(f"features: layer numbers must be in 1..{n_layers - 1} (the last layer's output is "
                         f"always stored)")
    return layers


def add_arguments(parser) -> None:
    """draft-data"""
    parser.add_argument("--model", help="checkpoint directory, hub id or .gguf file (default: the default model)")
    parser.add_argument("--data", nargs="+", required=True, metavar="FILE", help=".txt, .jsonl or .jsonl.xz books")
    parser.add_argument("--out", required=True, help="folder for the shards (resumable; keep it outside the repo)")
    parser.add_argument("--tokens", type=int, default=5_000_000,
                        help="stop once this many tokens are stored (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--topk", type=int, default=32,
                        help="the model's most likely next tokens stored per position (default: %(default)s)")
    parser.add_argument("--shard-seqs", type=int, default=32, help="sequences per shard (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="order of the sequences (default: %(default)s)")
    parser.add_argument("--features", default="", metavar="N,N",
                        help="also store these layers' outputs (numbered from 1), the inputs of a fused-feature "
                             "draft layer, e.g. 2,15 (default: the last layer's alone)")
    # float32: torch's CPU dispatch here is AVX2, without bfloat16 kernels, so a bfloat16 product of a 1,024-row
    # sequence runs about 4x slower than float32's (teacher data measured at 14 tokens/s in bf16, 38 in fp32)
    parser.add_argument("--dtype", default="float32", help="the model's dtype (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: loading.cpu_threads's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")


def run(args) -> int:
    from tokenswift.model.default_model import default_model_path
    from tokenswift.model.loading import load_model

    for name in ("tokens", "seq_len", "topk", "shard_seqs"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1")
    lm = load_model(args.model or str(default_model_path()), device=args.device, dtype=args.dtype, heads="none",
                    draft="none", threads=args.threads)
    features = feature_layers(args.features, lm.config.n_layers)
    plan = TeacherPlan(tuple(args.data), args.seq_len, args.topk, args.shard_seqs, args.seed, features)
    with lm.running():
        store = extract(lm, open_store(Path(args.out), plan, model_id(lm)), plan, args.tokens, not args.no_progress)
    print(f"{store.shards} shards, {store.shards * store.tokens_per_shard:,} tokens in {args.out}")
    return 0
