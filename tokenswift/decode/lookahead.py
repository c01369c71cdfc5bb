"""The next window filled ahead of its shift, on a core the decoding leaves idle.

A shift prefills the new window (window.py): ~6,000 tokens at a 7K context, about as long as writing the 2,048
tokens between two shifts takes on one thread. Yet most of the next window is settled long before its boundary:
the pinned text, and the story from its oldest kept token on, written a token at a time (WindowPlan.ahead). Where
the model prefills by rows (Transformer.prefills_by_rows), a slot's keys and values are the same whichever pass
computes them, so a thread computes those rows into a cache of its own while the story is written, and the shift
copies the leading slots whose tokens are the new window's and prefills only the rest. A slot is taken only where
every token up to it matches, so whatever was guessed (a Memory edited since, World Info, an instruction's answer
ending) the cache is the one a run without a lookahead fills.

It runs only where cores are spare (fills_ahead): on cores the decoding uses, it would slow every step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import torch

from tokenswift.draft.build import DraftNeeds
from tokenswift.model.forward import Transformer
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.prefill import prefill

# Rows per forward. Each forward's Python between its C calls takes the GIL from the decoding: with 32-row forwards
# (the story posted every 16 tokens) TokenSwift's decoding at 6-8K ran at 54.8 tokens/s beside it against 65.6 alone;
# with 128 (posted every 128: window.POSTS), 63.4, even with plain decoding's 63.1. A shift then waits for the
# forward in flight and computes the rows posted since itself: ~0.6 s at 7K, against ~30 s of writing between shifts.
CHUNK = 128


def fills_ahead(model: Transformer, threads: int, compiled: bool, asked: bool | None) -> bool:
    """Whether a run fills its next window ahead: where the model prefills by rows and its passes are not compiled
    ones (the fast path's cache layout); asked None (EngineOptions.lookahead): where this process may also run on
    twice the cores the decoding's `threads` take (the thread takes as many)."""
    if asked is False or not model.prefills_by_rows or compiled:
        return False
    return asked or len(os.sched_getaffinity(0)) >= 2 * threads


def matching(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of a and b."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class Lookahead:
    def __init__(self, model: Transformer, like: KVCache, needs: DraftNeeds):
        """like: the engine's cache, whose element, shape and capacity this one's has. needs: what the run's drafter
        reads of a window's last rows (their states: the layer drafter starts from 512 of them)."""
        self.model, self.needs = model, needs
        self.cache = KVCache(like.k.shape[0], like.k.shape[1], like.capacity, model.cfg.head_dim, like.k.device,
                             like.k.dtype)
        self.states = torch.empty(like.capacity, model.cfg.dim * (1 + len(needs.feature_layers)))
        self.tokens: list[int] = []  # the tokens whose rows self.cache (and self.states) hold, slot by slot
        self._wanted: list[int] | None = None  # None: stop after the forward in flight
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def want(self, tokens: list[int]) -> None:
        """The next window's leading tokens, as far as the story settles them now: the rows to have ready."""
        with self._lock:
            self._wanted = tokens
            if self._thread is None:
                # A daemon: a process that ends while it works is not held up by rows nobody will read.
                self._thread = threading.Thread(target=self._fill, name="tokenswift-lookahead", daemon=True)
                self._thread.start()

    def take(self, tokens: Sequence[int], into: KVCache, limit: int, keep: int) -> tuple[int, torch.Tensor]:
        """Copy into `into` the rows of the leading slots (at most `limit`) whose tokens are those of `tokens`, once
        the forward in flight ends; returns how many, and the drafter's states of the last `keep` of them (at
        most). The thread starts again at the next want()."""
        self.stop()
        if self._error is not None:
            raise RuntimeError("lookahead: filling the next window failed") from self._error
        n = max(0, min(matching(self.tokens, tokens), limit))
        into.k[:, :, :n] = self.cache.k[:, :, :n]
        into.v[:, :, :n] = self.cache.v[:, :, :n]
        return n, self.states[max(0, n - keep):n].clone()

    def stop(self) -> None:
        """Let the forward in flight end, and start no other."""
        with self._lock:
            self._wanted, thread = None, self._thread
        if thread is not None:
            thread.join()

    @torch.inference_mode()
    def _fill(self) -> None:
        # The decoding's count (fills_ahead): a new thread's OpenMP default would be every core.
        torch.set_num_threads(torch.get_num_threads())
        # On the upper half of the process's cores (this thread's only): unpinned, it shared the decoding's core
        # at every hand-over of the GIL (a woken thread is placed beside its waker), and the plain steps of `bench`
        # at 7K ran at 42-45 tokens/s against 52-62 without it; pinned, at 50-52 against 54.
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cores[len(cores) // 2:])
        try:
            while True:
                with self._lock:
                    wanted = self._wanted or []
                    done = matching(self.tokens, wanted)
                    end = min(len(wanted), done + CHUNK)
                    if end <= done:  # stopped, or caught up with the story: the next want() starts another
                        self._thread = None
                        return
                    del self.tokens[done:]
                out = prefill(self.model, torch.tensor(wanted[done:end]), self.cache, end - done,
                              keep_layers=self.needs.feature_layers, start=done)
                self.states[done:end] = self.needs.rows(out)
                self.tokens += wanted[done:end]
        except BaseException as error:  # noqa: BLE001 - surfaced by take()
            with self._lock:
                self._error, self._thread = error, None
