"""A draft model as the drafter (llama.cpp's `-md`, LM Studio's draft model): any smaller model with the target's
tokenizer guesses the tokens below the root, one at a time, each guess knowing the ones before it.

State: the draft model's own KV cache, slot = position as in the target's cache, and the token each of its slots
holds. The draft model is run lazily, when the next draft is asked for: the committed tokens it has not seen
(read from the engine's token buffer, whose slots are the target's) and the root, then one row per guess. The
guesses' rows sit in the slots past the root; when the target accepts a guess, its slot already holds the right
keys and values and is kept, and from the first slot whose token differs on, the cache is run again. A prefill
(the first, a resume, a context shift or a World Info rebuild) starts it afresh: start() forgets every slot, and
the next draft runs the new window through the draft model.

Each depth is ranked as the target will sample it (drafting.best_per_depth): greedy, or with the very noise of
that position, so where the draft model agrees with the target its guesses are the target's tokens. Exactness does
not depend on any of this: the proposals are only candidates; verification decides the text.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tokenswift.draft.choice import vocabulary_problem
from tokenswift.draft.drafting import best_per_depth
from tokenswift.model import gguf_checkpoint
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel, ModelLoadError, load_model
from tokenswift.model.masks import causal_mask
from tokenswift.model.prefill import PREFILL_CHUNK
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.windows import node_windows
from tokenswift.settings import SettingsError, Speculation


class ModelDrafter:
    uses_hidden = False
    switch_s = 0.0

    def __init__(self, lm: LoadedModel, spec: Speculation, sampler: Sampler, tokens: torch.Tensor, capacity: int):
        """tokens: the engine's buffer of token ids by slot (committed tokens, then the root)."""
        self.draft, self.sampler, self.tokens = lm.draft_model, sampler, tokens
        self.widths = list(spec.tree[1:])  # the top widths[d] guesses at depth d: a chain where they are all 1
        cfg = self.draft.config
        self.cache = KVCache(cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim, self.draft.device,
                             self.draft.dtype)
        self.held: list[int] = []  # the token in each slot of the draft cache, from slot 0
        self.checked = 0  # slots below this are committed and held as the target's buffer has them

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        self.held, self.checked = [], 0  # a new window: every slot may hold other tokens now

    def wants_queries(self, count: int) -> bool:
        return False

    def observe(self, hidden: torch.Tensor, following: list[int], first: int) -> None:
        pass  # the draft model computes its own states

    def commit(self, full: KVCache, start: int, end: int, queries: list[torch.Tensor] | None) -> None:
        pass  # the committed tokens are read from the token buffer at the next draft

    def ngram_prefix(self, root: int, levels: list[list[int]]) -> list[int]:
        return []  # the root is certain: n-gram continuations hang from it

    @torch.inference_mode()
    def propose(self, root: int, position: int, window: torch.Tensor | None, depth: int,
                key: int) -> list[list[int]]:
        widths = self.widths[:depth]
        if not widths:
            return []
        logits = self._catch_up(position)
        levels, rows, chain = [], window, []
        for d, width in enumerate(widths):
            levels.append(best_per_depth(logits, self.sampler, rows, [width], key + d)[0])
            if d + 1 == len(widths) or not levels[-1]:
                break
            chain.append(levels[-1][0])
            logits = self._run([chain[-1]], position + 1 + d)
            if window is not None:  # the penalty and DRY of the next guess see the chain, as the target's will
                rows = node_windows(window[0], window.new_tensor([chain]), window.new_tensor([len(chain)]))
        return [level for level in levels if level]

    def _catch_up(self, position: int) -> torch.Tensor:
        """Bring the draft cache to the committed tokens and the root at `position`; the root row's logits [1, V].
        Slots whose held token is the buffer's (accepted guesses) are kept; the root is always run, for its row."""
        fresh = self.tokens[self.checked:position + 1].tolist()
        same = 0
        for held, token in zip(self.held[self.checked:], fresh[:-1], strict=False):
            if held != token:
                break
            same += 1
        first = self.checked + same
        self.checked = position + 1  # the root is committed with whatever the target accepts below it
        del self.held[first:]
        return self._run(fresh[same:], first)

    def _run(self, tokens: list[int], first: int) -> torch.Tensor:
        """tokens at slots first.. of the draft cache, in chunks of a prefill's size; the last one's logits."""
        dev, window = self.draft.device, self.draft.config.sliding_window
        logits = None
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[start:start + PREFILL_CHUNK]
            at = first + start
            pos = torch.arange(at, at + len(chunk), device=dev)
            mask = causal_mask(at, len(chunk), pos, window, dev)
            last = start + PREFILL_CHUNK >= len(tokens)
            out = self.draft.model(torch.tensor(chunk, device=dev), pos, self.cache, at, mask,
                                   logits="last" if last else "none")
            logits = out.logits
        self.held.extend(tokens)
        return logits


def check_draft_model(lm: LoadedModel, drafter: str, window: int) -> None:
    """SettingsError where a run cannot draft with the draft model (`drafter`: choice.drafter_for's): its context
    is shorter than the `window` tokens the run's cache holds at most (its slots are the target's)."""
    if drafter == "model" and lm.draft_model.max_context < window:
        raise SettingsError("draft_model", f"the draft model's context of {lm.draft_model.max_context} tokens is "
                                           f"shorter than this draft's window of {window}: set a smaller one")


def attach_draft_model(lm: LoadedModel, path: str | None) -> LoadedModel:
    """lm with the draft model at `path` loaded beside it (on its device, in its precision; a q4 target's draft
    model in float32 unless it is a GGUF file too); lm itself when path is empty. SettingsError naming
    `draft_model` when it cannot be loaded or its vocabulary is not the target's. A copy: the target the caller
    holds keeps its own drafters."""
    if not path:
        return lm
    dtype = lm.precision
    if dtype == "q4" and not gguf_checkpoint.is_gguf(path):
        dtype = "float32"
    try:
        draft = load_model(path, device=str(lm.device), dtype=dtype, heads="none", draft="none", threads=lm.threads)
    except (ModelLoadError, OSError, ValueError) as error:
        raise SettingsError("draft_model", f"cannot load {path}: {error}") from None
    if problem := vocabulary_problem(lm.config.vocab_size, lm.tokenizer, draft.config.vocab_size, draft.tokenizer):
        raise SettingsError("draft_model", f"{Path(path).name} cannot draft for {lm.name}: {problem}")
    return dataclasses.replace(lm, draft_model=draft)
