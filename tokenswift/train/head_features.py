"""What the frozen model says about the training text, computed once: the heads' inputs and hard negatives.

Training the draft heads on a CPU is dominated by the frozen model: every step would run the base forward
again, then project three heads' states onto the whole vocabulary. Both are avoidable.
- `extract` runs the base model once per training sequence and stores, in a directory of .npy files
  (memory-mapped, filled sequence by sequence, resumable after an interruption):
  tokens [N, T] int32, h0 [N, T, dim] float16 (the last layer's output before the final norm) and the base
  model's own top-k next-token ids at every position [N, T, k] int32.
- `sampled_losses` trains on a candidate set instead of the vocabulary: for head i at position t the target
  token t+1+i, the base model's top-k guesses for that token (the confusable ones: exactly what a head must
  rank correctly for its top-1/top-3), and negatives drawn uniformly from the vocabulary, shared by the batch,
  with the log(V/R) correction that makes them stand for the rest of the vocabulary (sampled softmax).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from tokenswift.train.head_model import base_hidden

MANIFEST = "features.json"


class FeatureStore:
    def __init__(self, directory: Path, mode: str = "r"):
        self.dir = Path(directory)
        self.meta = json.loads((self.dir / MANIFEST).read_text())
        self.tokens = np.load(self.dir / "tokens.npy", mmap_mode=mode)
        self.hidden = np.load(self.dir / "hidden.npy", mmap_mode=mode)
        self.topk = np.load(self.dir / "topk.npy", mmap_mode=mode)

    @property
    def filled(self) -> int:
        return self.meta["filled"]

    def batch(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, T] int64, h0 [B, T, dim] float32, top-k ids [B, T, k] int64 for the given sequences."""
        order = sorted(rows)  # memory-mapped reads in file order
        back = [order.index(r) for r in rows]
        tokens = torch.from_numpy(self.tokens[order].astype(np.int64))[back]
        hidden = torch.from_numpy(self.hidden[order].astype(np.float32))[back]
        topk = torch.from_numpy(self.topk[order].astype(np.int64))[back]
        return tokens, hidden, topk

    def save_meta(self) -> None:
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.meta, indent=2))
        tmp.replace(self.dir / MANIFEST)


def create(directory: Path, tokens: torch.Tensor, dim: int, k: int, model: str, data_id: str) -> FeatureStore:
    directory.mkdir(parents=True, exist_ok=True)
    n, t = tokens.shape
    np.save(directory / "tokens.npy", tokens.numpy().astype(np.int32))
    np.lib.format.open_memmap(directory / "hidden.npy", "w+", np.float16, (n, t, dim)).flush()
    np.lib.format.open_memmap(directory / "topk.npy", "w+", np.int32, (n, t, k)).flush()
    meta = {"model": model, "data": data_id, "sequences": n, "seq_len": t, "dim": dim, "topk": k, "filled": 0}
    (directory / MANIFEST).write_text(json.dumps(meta, indent=2))
    return FeatureStore(directory, "r+")


def open_or_create(directory: Path, tokens: torch.Tensor, dim: int, k: int, model: str,
                   data_id: str) -> FeatureStore:
    """The store for exactly these sequences; one made for other data or another top-k is refused."""
    if (directory / MANIFEST).is_file():
        store = FeatureStore(directory, "r+")
        same = (store.meta["data"], store.meta["topk"], store.meta["dim"]) == (data_id, k, dim)
        if not same:
            raise ValueError(f"{directory} holds features of other data or settings ({store.meta}); "
                             "use another --features directory")
        return store
    return create(directory, tokens, dim, k, model, data_id)


@torch.no_grad()
def extract(lm, store: FeatureStore, progress: bool = True, save_every: int = 8) -> None:
    """Fill the store's remaining sequences with h0 and the base model's top-k (resumes where it stopped)."""
    k, n = store.meta["topk"], store.meta["sequences"]
    with tqdm(total=n, initial=store.filled, desc="features", unit="seq", disable=not progress) as bar:
        while store.filled < n:
            i = store.filled
            tokens = torch.from_numpy(store.tokens[i : i + 1].astype(np.int64))
            hidden = base_hidden(lm, tokens)[0]
            logits = lm.model.head(lm.model.model.norm(hidden))
            store.hidden[i] = hidden.to(torch.float16).cpu().numpy()
            store.topk[i] = logits.topk(k, dim=-1).indices.to(torch.int32).cpu().numpy()
            store.meta["filled"] = i + 1
            if store.filled % save_every == 0 or store.filled == n:
                store.hidden.flush()
                store.topk.flush()
                store.save_meta()  # after the data: a crash can only lose work, never mark junk as done
            bar.update()


def sampled_losses(lm, states: list[torch.Tensor], tokens: torch.Tensor, topk: torch.Tensor, negatives: int,
                   generator: torch.Generator | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per head: sampled-softmax cross-entropy and top-1 over the candidate set (a [gamma] tensor, no grad).

    states: the heads' normalised states [B, T or T-1, dim]; head i (1-based) at position t predicts token t+1+i,
    and the base model's top-k at position t+i are its guesses for that same token."""
    weight = lm.model.model.embed_tokens.weight if lm.config.tie_embeddings else lm.model.lm_head.weight
    vocab = weight.shape[0]
    shared = torch.randint(0, vocab, (negatives,), generator=generator, device=weight.device)
    shared_w = weight[shared].float()
    correction = math.log(vocab / negatives)
    losses, top1 = [], []
    for i, s in enumerate(states, start=1):
        s = s[:, : tokens.shape[1] - 1 - i].float().flatten(0, 1)
        target = tokens[:, i + 1:].flatten()
        guesses = topk[:, i : tokens.shape[1] - 1].flatten(0, 1)
        own = torch.cat((target[:, None], guesses), dim=1)  # the target is candidate 0
        own_logits = torch.einsum("nd,nkd->nk", s, weight[own].float())
        own_logits[:, 1:] = own_logits[:, 1:].masked_fill(guesses == target[:, None], float("-inf"))
        rest = s @ shared_w.T + correction
        rest = rest.masked_fill(shared[None, :] == target[:, None], float("-inf"))
        logits = torch.cat((own_logits, rest), dim=1)
        losses.append(F.cross_entropy(logits, torch.zeros_like(target)))
        top1.append((logits.detach().argmax(-1) == 0).float().mean())
    return losses, torch.stack(top1)
