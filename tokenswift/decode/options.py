"""How an engine runs, never what it writes: passed explicitly to Engine and Generator.

Every option here changes speed only; the text is the same with any of them (design §3): TokenSwift's own
(speculation: the mode, the drafter, the tree, the n-grams, the partial cache; tokenswift.settings.Speculation)
and the passes' (the fast path, the adaptive batch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenswift.model.attention import effective_kind
from tokenswift.model.fastpath import FastOptions
from tokenswift.settings import Speculation


@dataclass(frozen=True)
class PathChoice:
    """Which path runs the model's passes and why no better one does (selftest.py): what the model notice, the
    job's metrics and the benches report."""

    path: str  # the fast path's kernel ("flex", "flex-fold", "sdpa") or "eager"
    dropped: tuple[str, ...] = ()  # each better path that was not taken, with why (failed self-test, error)
    tested: bool = True  # False: the caller chose the path and it was not self-tested (CPU, the CLI's --fast)

    def describe(self) -> str:
        verdict = "passed its self-test" if self.tested else "not self-tested"
        line = f"{self.path} ({verdict})" if self.path != "eager" else "eager passes"
        return line + "".join(f"; not {why}" for why in self.dropped)


@dataclass(frozen=True)
class EngineOptions:
    fast: FastOptions | None = None  # the static-shape passes, captured as CUDA graphs on a GPU (fastpath.py)
    adaptive: bool = False  # pick the candidate batch per iteration from measured costs (adaptive.py)
    choice: PathChoice | None = None  # how `fast` was chosen (selftest.choose_path); None: as given, untested
    alternatives: bool = False  # record each emitted token's likeliest alternatives (alternatives.py; the app's)
    speculation: Speculation = Speculation()  # how TokenSwift drafts, or plain decoding (mode "ar")
    # Fill the next window ahead of its shift (lookahead.py): None where cores are spare, True wherever the model
    # prefills by rows (the tests' way to have it on a core they share), False never.
    lookahead: bool | None = None

    def speculating(self, **changes) -> EngineOptions:
        """These options with `changes` to the speculation (mode="ar": the plain decoding they are checked against)."""
        return dataclasses.replace(self, speculation=self.speculation.replace(**changes))

    def path(self, cfg) -> PathChoice:
        """The path these options run on: as self-tested, else as given."""
        if self.choice is not None:
            return self.choice
        kind = effective_kind(self.fast.attention, cfg) if self.fast is not None else "eager"
        return PathChoice(kind, tested=False)
