"""Build the bundled writer model `models/tswift-books/` from public-domain novels, on CPU.

The app and CLI need a small default model that writes book-like English offline. This one file builds it,
nanoGPT style, in four reproducible steps (fixed seeds; only the wall-time-driven LR schedule depends on the
machine's speed):

    python scripts/train_bundled_model.py tokenizer   # byte-level BPE, 8192 vocab -> data/bundled-tokenizer/
    python scripts/train_bundled_model.py data        # stream-decompress + tokenize + pack -> data/*.bin
    python scripts/train_bundled_model.py bench       # measure training tokens/s of candidate sizes
    python scripts/train_bundled_model.py train --time-budget-min 85   # -> models/tswift-books/
    python scripts/train_bundled_model.py train --resume ...           # continue a killed run

Data: ../shared/data/books/{train,train-large}.jsonl.xz (Project Gutenberg novels, public domain in the
USA); eval.jsonl.xz is used only for validation loss, never for training or for the tokenizer.

Vocabulary (8192): small enough that the tied embedding / LM head (8192 x 256 = 2.1M params, and the same
number of MACs per token in the output softmax) stays about a third of a 6M-parameter model, large enough
that English prose packs ~4 characters per token (so a 4096-token context is ~16k characters), and it fits
uint16 token files.

Model size, measured with `bench` (2 shared cores of an AMD EPYC, torch 2.13 CPU, fp32, seq 512,
8 x 512 tokens per forward/backward, AdamW step included; other jobs were loading the machine, so the
numbers are noisy, but the pairs run back to back agree):
    s  d256 x 4 layers, 4.87M params:  ~2400 tok/s (least contended run)
    m  d256 x 6 layers, 6.25M params:  1827 tok/s / 330 tok/s (idle-ish / contended)
    l  d384 x 4 layers, 9.44M params:  1778 tok/s / 354 tok/s (idle-ish / contended)
bf16 autocast was not reliably faster (1.5x for s once, 0.7x for m, 0.3-0.5x for l: the per-forward weight
casts dominate at this size), so training is fp32. `l` trains as fast as `m` (wider matmuls use the cores
better, fewer layers mean less per-op overhead), so at equal wall time it sees the same tokens with 1.5x the
parameters (6.3M non-embedding vs 4.2M); `s` would see only ~1.3x more tokens than `l` with half its
non-embedding parameters. With 85 minutes the run sees roughly 2-9M tokens (depending on how loaded the
machine is): far below compute-optimal (~20 tokens/param) for any of them, but in this regime the larger
model is also the more sample-efficient one, and 9.44M fp32 params (38 MB) is the most that fits the ~40 MB
size limit. Fewer layers also make generation in the app faster. Hence `l`, with 8192-token steps (more
optimizer steps than 16k-token ones when only a few million tokens are seen).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
BOOKS = REPO.parent / "shared" / "data" / "books"  # the read-only ../shared beside the repo
TRAIN_FILES = [BOOKS / "train.jsonl.xz", BOOKS / "train-large.jsonl.xz"]
EVAL_FILE = BOOKS / "eval.jsonl.xz"

# Special tokens. Llama convention for the first ids, so bos=1 / eos=2 match what generic code expects.
UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIALS = [UNK, BOS, EOS, PAD]  # ids 0, 1, 2, 3
BOS_ID, EOS_ID, PAD_ID = 1, 2, 3

# Filled in from `bench` on the build machine (tokens/s, fp32 vs bf16 autocast), kept for the model card.
BENCH_NOTES = "see training_record.json"


@dataclass
class ModelSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Candidates for `bench`. head_dim is 32 for all (cheap attention, many heads); GQA with 4 query heads per
# KV head for the 8-head sizes, which shrinks the KV cache the app keeps for long generations.
SIZES = {
    "s": ModelSize(hidden=256, layers=4, heads=8, kv_heads=2, ffn=688),
    "m": ModelSize(hidden=256, layers=6, heads=8, kv_heads=2, ffn=688),
    "l": ModelSize(hidden=384, layers=4, heads=12, kv_heads=4, ffn=1024),
}


@dataclass
class Config:
    size: str = "l"
    vocab_size: int = 8192
    tokenizer_sample_mb: float = 40.0  # text used to learn the BPE merges (a few minutes on 2 cores)
    max_train_tokens: int = 40_000_000  # packed training tokens: what the budget can consume plus margin
    val_tokens: int = 1_000_000
    seq_len: int = 512  # most steps: short context is ~2x cheaper per token on CPU
    long_seq_len: int = 4096  # final phase: teach positions up to 4096 (the app generates long texts)
    long_frac: float = 0.15  # fraction of the wall-time budget spent at long_seq_len
    batch_tokens: int = 8192  # tokens per optimizer step (same at both lengths); small: more steps on CPU
    micro_tokens: int = 4096  # tokens per forward/backward (bounds memory at 4096 context)
    lr: float = 1.5e-3  # small models tolerate a high peak LR; the schedule decays it to lr * min_lr_frac
    min_lr_frac: float = 0.1
    warmup_frac: float = 0.03
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    time_budget_min: float = 85.0
    bf16: bool = False  # bf16 autocast for matmuls (fp32 master weights); chosen from the bench
    log_every_s: float = 30.0
    ckpt_every_s: float = 300.0
    eval_windows: int = 64  # periodic val loss on a fixed slice: 64 x 512 tokens
    seed: int = 1337
    threads: int = 2
    rope_theta: float = 500_000.0  # large base: positions beyond the trained 4096 stay well separated
    max_position_embeddings: int = 32768
    data_dir: str = str(REPO / "data")
    ckpt_dir: str = str(REPO / "data" / "bundled-ckpt")
    out_dir: str = str(REPO / "models" / "tswift-books")
    extra: dict = field(default_factory=dict)

    @property
    def tok_dir(self) -> Path:
        return Path(self.data_dir) / "bundled-tokenizer"

    @property
    def train_bin(self) -> Path:
        return Path(self.data_dir) / "bundled-train.bin"

    @property
    def val_bin(self) -> Path:
        return Path(self.data_dir) / "bundled-val.bin"


def log(msg: str, cfg: Config | None = None) -> None:
    line = f"[{time.strftime('%H:%M:%S', time.gmtime())}Z] {msg}"
    print(line, flush=True)
    if cfg is not None:
        Path(cfg.ckpt_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(cfg.ckpt_dir) / "train.log", "a") as f:
            f.write(line + "\n")


def iter_books(paths):
    """Yield (id, text) for each book, decompressing on the fly (never holds the 200 MB corpus at once)."""
    for p in paths:
        with lzma.open(p, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    yield d["id"], d["text"]


# ----------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(cfg: Config) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # Sample paragraphs uniformly over all training books (fixed seed) so every author shapes the merges,
    # rather than the first N MB (which would be a handful of books).
    total = sum(len(t) for _, t in iter_books(TRAIN_FILES))
    keep = min(1.0, cfg.tokenizer_sample_mb * 1e6 / total)
    rng = random.Random(cfg.seed)
    sample = []
    for _, text in iter_books(TRAIN_FILES):
        sample.extend(p for p in text.split("\n\n") if rng.random() < keep)
    chars = sum(map(len, sample))
    log(f"tokenizer: {len(sample)} paragraphs, {chars / 1e6:.1f}M chars of {total / 1e6:.0f}M")

    tok = Tokenizer(models.BPE(unk_token=UNK))
    # Byte level: any UTF-8 text round-trips (curly quotes, accents), no <unk> in practice.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t0 = time.time()
    tok.train_from_iterator(sample, trainer, length=len(sample))
    log(f"tokenizer: trained vocab {tok.get_vocab_size()} in {time.time() - t0:.0f}s")
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, BOS_ID, EOS_ID, PAD_ID]
    # Encoding adds <s> at the start, as the model saw at every document start during training.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
            ),
        ]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=cfg.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(cfg.tok_dir)
    check_tokenizer(cfg.tok_dir)


def check_tokenizer(path) -> None:
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(path)
    ids = t("Hello, Mr. Darcy.").input_ids
    assert ids[0] == BOS_ID and t.bos_token_id == BOS_ID and t.eos_token_id == EOS_ID, (ids, t.bos_token_id)
    text = "“Well,” said she — naïvely.\n\nChapter II."
    assert t.decode(t(text).input_ids, skip_special_tokens=True) == text
    log(f"tokenizer ok: {path} {ids} -> {t.convert_ids_to_tokens(ids)}")


# ----------------------------------------------------------------------------------------------------- data


def encode_docs(tok, docs, max_tokens: int) -> np.ndarray:
    """Docs -> <s> doc </s> <s> doc </s> ... as uint16, stopping at max_tokens."""
    out, n = [], 0
    for text in docs:
        # The fast tokenizer is batched over paragraphs-sized chunks (Rust, parallel); chunks are split on
        # blank lines so no BPE merge crosses a chunk boundary that the pre-tokenizer would not also split.
        parts = text.split("\n\n")
        chunks = [p + "\n\n" for p in parts[:-1]] + [parts[-1]]
        ids = [BOS_ID]
        for enc in tok(chunks, add_special_tokens=False).input_ids:
            ids.extend(enc)
        ids.append(EOS_ID)
        out.append(np.asarray(ids, dtype=np.uint16))
        n += len(ids)
        if n >= max_tokens:
            break
    return np.concatenate(out)[:max_tokens]


def prepare_data(cfg: Config) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.tok_dir)
    books = list(iter_books(TRAIN_FILES))
    total_chars = sum(len(t) for _, t in books)
    # Only ~max_train_tokens are needed. Take the same fraction of every book (a contiguous stretch starting
    # at a seeded random paragraph), so all books and authors are represented; each stretch is a document.
    frac = min(1.0, cfg.max_train_tokens * 4.3 / total_chars * 1.05)  # ~4.3 chars/token, 5% margin
    rng = random.Random(cfg.seed)
    docs = []
    for _, text in books:
        n = int(len(text) * frac)
        start = rng.randint(0, len(text) - n)
        if start:
            cut = text.find("\n\n", start)
            start = cut + 2 if 0 <= cut < start + 20000 else start
        docs.append(text[start : start + n])
    rng.shuffle(docs)
    t0 = time.time()
    train = encode_docs(tok, docs, cfg.max_train_tokens)
    train.tofile(cfg.train_bin)
    log(f"data: {len(books)} books, {total_chars / 1e6:.0f}M chars, took {frac:.0%} of each -> "
        f"{len(train) / 1e6:.1f}M tokens ({train.nbytes / 1e6:.0f} MB) in {time.time() - t0:.0f}s")
    val = encode_docs(tok, (t for _, t in iter_books([EVAL_FILE])), cfg.val_tokens)
    val.tofile(cfg.val_bin)
    log(f"data: val {len(val) / 1e6:.2f}M tokens -> {cfg.val_bin}")


def get_batch(data: np.ndarray, n: int, seq: int, gen: torch.Generator):
    """n random windows of seq+1 tokens -> (inputs, targets)."""
    ix = torch.randint(len(data) - seq - 1, (n,), generator=gen).tolist()
    x = torch.from_numpy(np.stack([data[i : i + seq + 1].astype(np.int64) for i in ix]))
    return x[:, :-1], x[:, 1:]


# ---------------------------------------------------------------------------------------------------- model


def make_model(cfg: Config):
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SIZES[cfg.size]
    mc = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=s.hidden,
        intermediate_size=s.ffn,  # SwiGLU, ~8/3 x hidden rounded to a multiple of 16
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,  # saves vocab x hidden params, a big share at this size
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        attn_implementation="sdpa",
    )
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(mc)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once by parameters()


def make_optimizer(model, cfg: Config):
    # No weight decay on norms (1-D tensors); decay the matrices including the tied embedding.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(frac: float, cfg: Config) -> float:
    """Warm-up then cosine to min_lr, as a function of the elapsed fraction of the wall-time budget."""
    if frac < cfg.warmup_frac:
        return cfg.lr * max(frac, 1e-3) / cfg.warmup_frac
    p = min(1.0, (frac - cfg.warmup_frac) / (1 - cfg.warmup_frac))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def train_step(model, opt, data, seq: int, cfg: Config, gen: torch.Generator) -> float:
    micro = max(1, cfg.micro_tokens // seq)
    accum = max(1, cfg.batch_tokens // (micro * seq))
    total = 0.0
    for _ in range(accum):
        x, y = get_batch(data, micro, seq, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        (loss / accum).backward()
        total += loss.item() / accum
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def evaluate(model, val: np.ndarray, seq: int, windows: int, cfg: Config) -> float:
    """Mean next-token loss over a FIXED slice of the validation set (consecutive windows from its start)."""
    model.eval()
    losses = []
    bs = max(1, cfg.micro_tokens // seq)
    starts = [i * seq for i in range(min(windows, (len(val) - 1) // seq))]
    for b in range(0, len(starts), bs):
        x = torch.from_numpy(np.stack([val[i : i + seq + 1].astype(np.int64) for i in starts[b : b + bs]]))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 x[:, 1:].reshape(-1), reduction="none")
        losses.append(loss)
    model.train()
    return torch.cat(losses).mean().item()


# ---------------------------------------------------------------------------------------------------- bench


def bench(cfg: Config, sizes: list[str], seconds: float, bf16_modes: list[bool]) -> dict:
    """Training tokens/s per candidate (random tokens: speed does not depend on the data)."""
    torch.set_num_threads(cfg.threads)
    data = np.random.default_rng(0).integers(4, cfg.vocab_size, 2_000_000).astype(np.uint16)
    results = {}
    for size in sizes:
        for bf16 in bf16_modes:
            c = dataclasses.replace(cfg, size=size, bf16=bf16, batch_tokens=cfg.micro_tokens * 2)
            model = make_model(c)
            opt = make_optimizer(model, c)
            gen = torch.Generator().manual_seed(0)
            train_step(model, opt, data, c.seq_len, c, gen)  # warm-up (allocator, kernels)
            t0, toks = time.time(), 0
            while time.time() - t0 < seconds:
                train_step(model, opt, data, c.seq_len, c, gen)
                toks += c.batch_tokens
            tps = toks / (time.time() - t0)
            key = f"{size}{'-bf16' if bf16 else ''}"
            results[key] = {"params": n_params(model), "tokens_per_s": round(tps),
                            "tokens_in_85min": round(tps * 85 * 60 * (1 - 0.15 * 0.5))}
            log(f"bench {key}: {dataclasses.asdict(SIZES[size])} params={n_params(model) / 1e6:.2f}M "
                f"{tps:.0f} tok/s at seq {c.seq_len}")
    return results


# ---------------------------------------------------------------------------------------------------- train


def save_ckpt(path: Path, model, opt, gen, state: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "ckpt.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                "state": state}, tmp)
    os.replace(tmp, path / "ckpt.pt")  # atomic: a kill mid-save leaves the previous checkpoint intact


def train(cfg: Config, resume: bool) -> None:
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ckpt_dir = Path(cfg.ckpt_dir)
    train_data = np.memmap(cfg.train_bin, dtype=np.uint16, mode="r")
    val = np.fromfile(cfg.val_bin, dtype=np.uint16)
    model = make_model(cfg)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    state = {"step": 0, "tokens": 0, "elapsed": 0.0, "curve": [], "log": []}
    if resume and (ckpt_dir / "ckpt.pt").exists():
        ck = torch.load(ckpt_dir / "ckpt.pt", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        state = ck["state"]
        log(f"resumed at step {state['step']}, {state['tokens'] / 1e6:.2f}M tokens, "
            f"{state['elapsed'] / 60:.1f} of {cfg.time_budget_min} min", cfg)
    elif resume:
        log("no checkpoint found, starting fresh", cfg)
    log(f"config {json.dumps(dataclasses.asdict(cfg))}", cfg)
    log(f"model {cfg.size}: {n_params(model) / 1e6:.2f}M params, train {len(train_data) / 1e6:.1f}M tokens, "
        f"val {len(val) / 1e6:.2f}M tokens", cfg)

    budget = cfg.time_budget_min * 60
    # The elapsed clock counts training time only (restored on resume), so the LR schedule and the switch to
    # long context pick up where they stopped.
    t_start = time.time() - state["elapsed"]
    last_log = last_ckpt = time.time()
    toks_since, t_since = 0, time.time()
    model.train()
    while True:
        elapsed = time.time() - t_start
        frac = elapsed / budget
        if frac >= 1.0:
            break
        seq = cfg.long_seq_len if frac >= 1 - cfg.long_frac else cfg.seq_len
        lr = lr_at(frac, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = train_step(model, opt, train_data, seq, cfg, gen)
        state["step"] += 1
        state["tokens"] += cfg.batch_tokens
        toks_since += cfg.batch_tokens
        state["elapsed"] = time.time() - t_start
        now = time.time()
        if now - last_log >= cfg.log_every_s:
            tps = toks_since / (now - t_since)
            rec = {"step": state["step"], "tokens": state["tokens"], "min": round(state["elapsed"] / 60, 2),
                   "loss": round(loss, 4), "lr": lr, "seq": seq, "tok_s": round(tps)}
            state["log"].append(rec)
            log(f"step {rec['step']} tokens {rec['tokens'] / 1e6:.2f}M loss {loss:.4f} lr {lr:.2e} seq {seq} "
                f"{tps:.0f} tok/s elapsed {rec['min']:.1f}/{cfg.time_budget_min} min", cfg)
            last_log, toks_since, t_since = now, 0, now
        if now - last_ckpt >= cfg.ckpt_every_s:
            # Eval time is excluded from the training clock (shift t_start), so the budget is training time.
            t_eval = time.time()
            vl = evaluate(model, val, cfg.seq_len, cfg.eval_windows, cfg)
            state["curve"].append({"tokens": state["tokens"], "min": round(state["elapsed"] / 60, 2),
                                   "val_loss": round(vl, 4)})
            save_ckpt(ckpt_dir, model, opt, gen, state)
            log(f"val loss {vl:.4f} (ppl {math.exp(vl):.1f}) at {state['tokens'] / 1e6:.2f}M tokens; "
                f"checkpoint saved ({time.time() - t_eval:.0f}s)", cfg)
            t_start += time.time() - t_eval
            t_since += time.time() - t_eval
            last_ckpt = time.time()

    save_ckpt(ckpt_dir, model, opt, gen, state)
    finish(cfg, model, val, state)


def finish(cfg: Config, model, val: np.ndarray, state: dict) -> None:
    """Final eval, then write the HF-format model directory with tokenizer, card and training record."""
    from transformers import AutoTokenizer, GenerationConfig

    # Larger slices than the periodic eval (default 131k tokens each, at the short and the 4096 context).
    vl_short = evaluate(model, val, cfg.seq_len, cfg.eval_windows * 4, cfg)
    vl_long = evaluate(model, val, cfg.long_seq_len, max(1, cfg.eval_windows // 2), cfg)
    state["curve"].append({"tokens": state["tokens"], "min": round(state["elapsed"] / 60, 2),
                           "val_loss": round(evaluate(model, val, cfg.seq_len, cfg.eval_windows, cfg), 4)})
    log(f"final val loss {vl_short:.4f} (ppl {math.exp(vl_short):.1f}) at ctx {cfg.seq_len}; "
        f"{vl_long:.4f} (ppl {math.exp(vl_long):.1f}) at ctx {cfg.long_seq_len}", cfg)

    out = Path(cfg.out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.config.use_cache = True
    model.save_pretrained(out, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(cfg.tok_dir)
    tok.save_pretrained(out)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(out)
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; the repo files must be readable by everyone

    # A seeded sample for the card (and a check that the saved directory generates).
    sample = sample_text(out, "It was a dark and stormy night; the rain fell in torrents", 80)
    record = {
        "config": dataclasses.asdict(cfg),
        "model_size": dataclasses.asdict(SIZES[cfg.size]),
        "params": n_params(model),
        "steps": state["step"],
        "tokens_seen": state["tokens"],
        "train_minutes": round(state["elapsed"] / 60, 1),
        "final_val_loss": {f"ctx{cfg.seq_len}": round(vl_short, 4),
                           f"ctx{cfg.long_seq_len}": round(vl_long, 4)},
        "final_val_ppl": {f"ctx{cfg.seq_len}": round(math.exp(vl_short), 2),
                          f"ctx{cfg.long_seq_len}": round(math.exp(vl_long), 2)},
        "val_curve": state["curve"],
        "train_log": state["log"],
        "bench": cfg.extra.get("bench", BENCH_NOTES),
        "command": cfg.extra.get("command", ""),
        "sample": sample,
    }
    (out / "training_record.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "README.md").write_text(model_card(cfg, record))
    log(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)", cfg)


def sample_text(path, prompt: str, n: int) -> str:
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(path)
    m = LlamaForCausalLM.from_pretrained(path)
    torch.manual_seed(0)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = m.generate(ids, max_new_tokens=n, do_sample=True, temperature=0.8, top_p=0.95)
    return tok.decode(out[0], skip_special_tokens=True)


def model_card(cfg: Config, r: dict) -> str:
    s = SIZES[cfg.size]
    lo, hi = f"ctx{cfg.seq_len}", f"ctx{cfg.long_seq_len}"
    return f"""# tswift-books

The small default model bundled with TokenSwift Studio, so `python app.py` and the CLI write book-like English
offline. It is a tiny Llama-architecture causal LM trained from scratch on CPU; expect fluent-looking
19th-century prose style, not coherent plots.

## Model
- Llama architecture (`LlamaForCausalLM`): {s.layers} layers, hidden {s.hidden}, {s.heads} query heads /
  {s.kv_heads} KV heads (GQA), head_dim {s.head_dim}, SwiGLU FFN {s.ffn}, RMSNorm, tied embeddings.
- {r['params'] / 1e6:.2f}M parameters, fp32 safetensors.
- RoPE theta {cfg.rope_theta:.0f}, `max_position_embeddings` {cfg.max_position_embeddings} (trained up to
  {cfg.long_seq_len} tokens; longer generations run but are outside the trained range).
- Tokenizer: byte-level BPE, vocab {cfg.vocab_size}, `<s>`=1 (bos, added at the start of every encoding),
  `</s>`=2 (eos, ends a document), `<unk>`=0, `<pad>`=3.

## Data
Public-domain (USA) Project Gutenberg novels from `../shared/data/books` (`train.jsonl.xz`,
`train-large.jsonl.xz`; see that folder's README for sources). The same contiguous fraction of every training
book was packed ({cfg.max_train_tokens / 1e6:.0f}M tokens max). `eval.jsonl.xz` (held-out novels) was used
only for validation.

## Training
- {r['steps']} steps, {r['tokens_seen'] / 1e6:.2f}M tokens seen, {r['train_minutes']} min on {cfg.threads} CPU
  threads; {cfg.batch_tokens} tokens per step; context {cfg.seq_len}, then {cfg.long_seq_len} for the final
  {cfg.long_frac:.0%} of the time.
- AdamW (0.9, 0.95), weight decay {cfg.weight_decay}, peak LR {cfg.lr}, warm-up + cosine over wall time,
  gradient clipping {cfg.grad_clip}.
- Final validation loss: {r['final_val_loss'][lo]} (perplexity {r['final_val_ppl'][lo]}) at context
  {cfg.seq_len}; {r['final_val_loss'][hi]} (perplexity {r['final_val_ppl'][hi]}) at context
  {cfg.long_seq_len}.
- Curve and settings: `training_record.json`.

## Sample (temperature 0.8, top-p 0.95, seed 0)
```
{r['sample']}
```

## Reproduce
```
python scripts/train_bundled_model.py tokenizer
python scripts/train_bundled_model.py data
{r['command'] or 'python scripts/train_bundled_model.py train'}
```
Seeds are fixed; the learning-rate schedule follows elapsed wall time, so a slower or faster machine trains
for the same time but sees a different number of tokens.
"""


# ------------------------------------------------------------------------------------------------------ cli


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["tokenizer", "data", "bench", "train"])
    ap.add_argument("--size", default=Config.size, choices=sorted(SIZES))
    ap.add_argument("--time-budget-min", type=float, default=Config.time_budget_min)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (fp32 weights)")
    ap.add_argument("--max-train-tokens", type=int, default=Config.max_train_tokens)
    ap.add_argument("--out-dir", default=Config.out_dir)
    ap.add_argument("--ckpt-dir", default=Config.ckpt_dir)
    ap.add_argument("--ckpt-every-s", type=float, default=Config.ckpt_every_s)
    ap.add_argument("--log-every-s", type=float, default=Config.log_every_s)
    ap.add_argument("--eval-windows", type=int, default=Config.eval_windows)
    ap.add_argument("--batch-tokens", type=int, default=Config.batch_tokens)
    ap.add_argument("--bench-seconds", type=float, default=50)
    ap.add_argument("--bench-sizes", default="s,m,l")
    ap.add_argument("--bench-bf16", default="0", help="comma list of 0/1: which precisions to bench")
    ap.add_argument("--bench-json", default=None, help="bench results to record in the model card")
    a = ap.parse_args(argv)
    cfg = Config(size=a.size, time_budget_min=a.time_budget_min, bf16=a.bf16,
                 max_train_tokens=a.max_train_tokens, out_dir=a.out_dir, ckpt_dir=a.ckpt_dir,
                 ckpt_every_s=a.ckpt_every_s, log_every_s=a.log_every_s, eval_windows=a.eval_windows,
                 batch_tokens=a.batch_tokens)
    args = sys.argv[1:] if argv is None else argv
    cfg.extra["command"] = "python scripts/train_bundled_model.py " + " ".join(args)
    if a.bench_json and Path(a.bench_json).exists():
        cfg.extra["bench"] = json.loads(Path(a.bench_json).read_text())
    Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
    if a.cmd == "tokenizer":
        train_tokenizer(cfg)
    elif a.cmd == "data":
        prepare_data(cfg)
    elif a.cmd == "bench":
        modes = [m == "1" for m in a.bench_bf16.split(",")]
        res = bench(cfg, a.bench_sizes.split(","), a.bench_seconds, modes)
        out = Path(cfg.data_dir) / "bundled-bench.json"
        old = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**old, **res}, indent=1))
        print(json.dumps(res, indent=1))
    else:
        train(cfg, a.resume)


if __name__ == "__main__":
    main()
