"""The public generation API shared by the CLI, the worker and the benchmarks.

    gen = Generator(lm, settings, prompt_ids, generated_ids=stored)   # validates, loads nothing
    for event in gen.steps():                                        # one event per iteration
        store(event.tokens)
    gen.metrics().to_dict()

Both modes (options.speculation.mode) emit the same tokens for the same seed and settings (design §3); TokenSwift
only emits them in fewer, larger steps. Passing the ids generated so far resumes the very same token stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tokenswift.decode.banned_engine import BannedEngine
from tokenswift.decode.engine import Engine
from tokenswift.decode.metrics import RunMetrics
from tokenswift.decode.options import EngineOptions
from tokenswift.draft.choice import drafter_for
from tokenswift.draft.model_drafter import check_draft_model
from tokenswift.model.loading import LoadedModel
from tokenswift.sampling.alternatives import Alternatives
from tokenswift.settings import Settings, SettingsError, Speculation
from tokenswift.text.context_window import ContextUse, PinnedText, WindowPlan, leading_bos, window_plan
from tokenswift.text.detok import IncrementalDetokenizer


@dataclass
class StepEvent:
    tokens: list[int]  # new ids this iteration, already cut at max_new_tokens / EOS / a stop string
    done: bool
    finish_reason: str | None  # "length", "eos" or "stop" when done
    # One per token of `tokens` when options.alternatives is set (alternatives.py), else None.
    alternatives: list[Alternatives] | None = None


def validate(lm: LoadedModel, settings: Settings, prompt_ids: Sequence[int], generated: Sequence[int],
             pinned: PinnedText | None = None, spec: Speculation | None = None) -> WindowPlan:
    """Check the request (and that `spec`'s drafter is there; None: TokenSwift's defaults); returns its context
    windows."""
    spec = spec or Speculation()
    if not prompt_ids:
        raise SettingsError("prompt", "is empty")
    pinned = pinned or PinnedText()
    plan = window_plan(settings, prompt_ids, leading_bos(lm, prompt_ids), pinned, lm.max_context)
    total = len(prompt_ids) + settings.max_new_tokens
    settings.check_fits(len(prompt_ids), plan.size, pinned=plan.fixed - plan.lead)  # Memory, Author's Note, markers
    drafter = drafter_for(lm, spec)  # the drafter asked for is there
    if spec.mode == "tokenswift":  # the draft model's positions must reach the window's
        check_draft_model(lm, drafter, min(plan.size, plan.fixed + total))
    if len(generated) > settings.max_new_tokens:
        raise SettingsError("max_new_tokens", f"{len(generated)} tokens were already generated")
    vocab = lm.config.vocab_size
    if any(not 0 <= t < vocab for t in [*prompt_ids, *generated]):
        raise SettingsError("prompt", f"token ids must lie in [0, {vocab})")
    return plan


def open_engine(lm: LoadedModel, settings: Settings, ids: list[int], prompt_len: int, options: EngineOptions,
                plan: WindowPlan, pinned_source: Callable[[], PinnedText] | None = None) -> Engine | BannedEngine:
    """The engine of a run: with banned phrases, one that holds back and rewinds (banned.py); it emits only final
    tokens, so what follows (cuts, stop strings, the store) never sees a token taken back."""
    if not settings.ban:
        return Engine(lm, settings, ids, prompt_len, options, plan=plan, pinned_source=pinned_source)

    def restart(story: list[int], bans: dict[int, tuple[int, ...]], now: WindowPlan | None) -> Engine:
        return Engine(lm, settings, story, prompt_len, options, plan=now or plan, pinned_source=pinned_source,
                      bans=bans)

    eos = set(lm.eos_ids)
    return BannedEngine(restart, ids, settings.ban, lm.tokenizer, prompt_len + settings.max_new_tokens,
                        lambda token: token in eos and not settings.ignore_eos)


class Generator:
    def __init__(self, lm: LoadedModel, settings: Settings, prompt_ids: Sequence[int],
                 generated_ids: Sequence[int] = (), options: EngineOptions | None = None,
                 pinned: PinnedText | None = None, pinned_source: Callable[[], PinnedText] | None = None):
        """options: how the engine runs (options.py; speed only). pinned: the draft's Memory and Author's Note, as
        ids (context_window.pinned_ids); pinned_source: where to read them again at each context shift, so an
        edit made meanwhile applies from there."""
        self.options = options or EngineOptions()
        self.spec = self.options.speculation
        self.plan = validate(lm, settings, prompt_ids, generated_ids, pinned, self.spec)
        self.lm, self.s = lm, settings
        self.prompt_ids = list(prompt_ids)
        self.produced: list[int] = list(generated_ids)
        self.eos = set(lm.eos_ids)
        self._pinned_source = pinned_source
        self._engine: Engine | BannedEngine | None = None
        self._stop_text = ""

    def steps(self) -> Iterator[StepEvent]:
        reason = self._finished(self.produced)
        if reason:
            yield StepEvent([], True, reason)
            return
        with self.lm.running():  # the model's own thread count (LoadedModel.running)
            yield from self._decode()

    def _decode(self) -> Iterator[StepEvent]:
        engine = self._engine = open_engine(self.lm, self.s, self.prompt_ids + self.produced, len(self.prompt_ids),
                                            self.options, self.plan, self._pinned_source)
        try:
            detok = self._stop_detokenizer()
            emitted = engine.start()
            step = engine.ts_step if self.spec.mode == "tokenswift" else engine.ar_step
            while True:
                alternatives = engine.take_alternatives()
                tokens, reason = self._cut(emitted, detok)
                self.produced.extend(tokens)
                if reason or tokens:
                    yield StepEvent(tokens, reason is not None, reason,
                                    alternatives[:len(tokens)] if alternatives is not None else None)
                if reason:
                    return
                emitted = step().tokens
        finally:  # ended, paused or dropped: no next window to fill
            engine.close()

    def _cut(self, tokens: list[int], detok: IncrementalDetokenizer | None) -> tuple[list[int], str | None]:
        """Tokens up to the first that ends the run, and why it ends."""
        for i, token in enumerate(tokens):
            reason = None
            if len(self.produced) + i + 1 >= self.s.max_new_tokens:
                reason = "length"
            if token in self.eos and not self.s.ignore_eos:
                reason = "eos"
            if detok is not None and self._hits_stop(detok.push([token])):
                reason = "stop"
            if reason:
                return tokens[: i + 1], reason
        return tokens, None

    def _stop_detokenizer(self) -> IncrementalDetokenizer | None:
        if not self.s.stop:
            return None
        return IncrementalDetokenizer(self.lm.tokenizer, self.prompt_ids + self.produced)

    def _hits_stop(self, text: str) -> bool:
        keep = max(len(s) for s in self.s.stop)
        self._stop_text = (self._stop_text + text)[-(keep + len(text)):]
        return any(s in self._stop_text for s in self.s.stop)

    def _finished(self, produced: list[int]) -> str | None:
        if len(produced) >= self.s.max_new_tokens:
            return "length"
        if produced and produced[-1] in self.eos and not self.s.ignore_eos:
            return "eos"
        return None

    def context_use(self) -> ContextUse | None:
        """What the model sees now (None before the first step)."""
        return self._engine.context_use() if self._engine is not None else None

    def metrics(self) -> RunMetrics:
        if self._engine is None:
            return RunMetrics(self.spec.mode, depth=len(self.spec.tree))
        return self._engine.metrics

    def run(self, on_tokens: Callable[[list[int]], None] | None = None) -> list[int]:
        """Generate to the end; returns all generated ids (including any passed in to resume)."""
        for event in self.steps():
            if on_tokens is not None and event.tokens:
                on_tokens(event.tokens)
        return self.produced
