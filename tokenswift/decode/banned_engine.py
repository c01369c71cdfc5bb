"""BannedEngine: an Engine under banned phrases, rewinding where one completes (the rule, why nothing shown is
taken back and why a resume is exact: sampling/banned.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from tokenswift.decode.engine import Engine
from tokenswift.sampling.banned import MAX_BANS_AT, PhraseWatch
from tokenswift.text.context_window import WindowPlan

# open_engine(ids, bans, plan): an Engine from ids, with bans {story index: token ids}, on a window plan (None: the
# run's first one)
OpenEngine = Callable[[list[int], dict[int, tuple[int, ...]], WindowPlan | None], Engine]


class BannedEngine:
    """An Engine under banned phrases, for the Generator and the benchmarks alike: start, ar_step and ts_step
    return only the tokens that are final, holding back the tail that could still become a banned phrase (module
    docstring) and rewinding when one completes. At its length (prompt + max_new_tokens ids) or at end-of-text
    the run shows its held tail (it is no phrase: a completed one rewinds first); past that, tokens pass as they
    come."""

    def __init__(self, open_engine: OpenEngine, ids: Sequence[int], phrases: Sequence[str], tokenizer,
                 limit: int, ends: Callable[[int], bool]):
        """limit: the story length at which the run ends; ends(token): whether the token ends it (end-of-text)."""
        self.open, self.limit, self.ends = open_engine, limit, ends
        self.story = list(ids)  # prompt + shown + held
        self.shown = len(self.story)  # story index of the first held token
        self.bans: dict[int, tuple[int, ...]] = {}
        self.done = False
        self.watch = PhraseWatch(phrases, tokenizer, self.story)
        self.engine = open_engine(self.story, {}, None)
        self.metrics = self.engine.metrics  # one record for the whole run, whichever engine runs
        self._held_alts: list = []  # the held tokens' alternatives, when the engine records them
        self._out: list[int] = []
        self._out_alts: list = []

    # -- the Engine's interface -------------------------------------------------------------------------

    def start(self) -> list[int]:
        return self._screen(self.engine.start())

    def ar_step(self):
        result = self.engine.ar_step()
        return dataclasses.replace(result, tokens=self._screen(result.tokens))

    def ts_step(self):
        result = self.engine.ts_step()
        return dataclasses.replace(result, tokens=self._screen(result.tokens))

    def take_alternatives(self) -> list | None:
        """The alternatives of the tokens returned since the last call (None: not recorded)."""
        if not self.engine.record:
            return None
        out, self._out_alts = self._out_alts, []
        return out

    def context_use(self):
        return self.engine.context_use()

    def close(self) -> None:
        self.engine.close()

    @property
    def policy(self):
        return self.engine.policy

    @property
    def drafter(self):
        return self.engine.drafter

    @property
    def lm(self):
        return self.engine.lm

    # -- holding and rewinding ----------------------------------------------------------------------------

    def _screen(self, tokens: list[int]) -> list[int]:
        """The engine's new tokens through the watch; returns the tokens that became final."""
        alternatives = self.engine.take_alternatives()
        while tokens:
            tokens, alternatives = self._feed(tokens, alternatives)
        if not self.done:
            self._show(self.shown + self.watch.keep())
        out, self._out = self._out, []
        return out

    def _feed(self, tokens: list[int], alternatives: list | None) -> tuple[list[int], list | None]:
        """Take tokens up to a completed phrase; after a rewind, returns what the restarted engine emitted."""
        for i, token in enumerate(tokens):
            self.story.append(token)
            if alternatives is not None:
                self._held_alts.append(alternatives[i])
            if self.done:  # past the run's end: nothing is held
                self._show(len(self.story))
                continue
            hit = self.watch.push(token)
            if hit is not None:
                k = self.shown + hit
                if len(self.bans.get(k, ())) < MAX_BANS_AT:
                    return self._rewind(k)
                self._show(len(self.story))  # a position out of bans: the phrase stays
            if len(self.story) >= self.limit or self.ends(token):
                self.done = True
                self._show(len(self.story))
        return [], None

    def _show(self, upto: int) -> None:
        """Make story[shown:upto] final."""
        n = upto - self.shown
        self._out += self.story[self.shown:upto]
        self._out_alts += self._held_alts[:n]
        self._held_alts = self._held_alts[n:]
        self.watch.drop(n)
        self.shown = upto

    def _rewind(self, k: int) -> tuple[list[int], list | None]:
        """Back to story index k with its token banned there; the engine starts again from ids[:k]."""
        t0 = time.perf_counter()
        self.bans = {p: b for p, b in self.bans.items() if p < k} | {k: (*self.bans.get(k, ()), self.story[k])}
        del self.story[k:]
        del self._held_alts[k - self.shown:]
        self.watch.cut(k - self.shown, self.story)
        prefill_s = self.metrics.prefill_s
        self.engine.close()
        clock = self.engine.clock  # its AR step timings: a few tokens back they still hold, and time saved needs them
        self.engine = self.open(self.story, {k: self.bans[k]}, self.engine.window.plan)
        self.engine.metrics, self.engine.clock = self.metrics, clock
        tokens = self.engine.start()
        self.metrics.prefill_s = prefill_s
        self.metrics.add_rewind(time.perf_counter() - t0)
        return tokens, self.engine.take_alternatives()
