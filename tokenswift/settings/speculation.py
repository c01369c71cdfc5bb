"""How TokenSwift drafts: the options that change speed only, never the text (design §3), apart from Settings (what
the text is), as vLLM keeps SpeculativeConfig apart from SamplingParams.

The engine takes them in its options (decode/options.EngineOptions); the drafters (draft/) read them, so they live
here, at the level every package may import. A draft is asked for with both (DraftSettings): the front doors (the
command line, the REST API, the Write tab) take the speed fields beside the text's, and the store keeps the two in
one flat JSON object, as it always has, so rows written before the split read back unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from tokenswift.settings.limits import (
    CAPACITY_SPARE,
    DRAFTERS,
    MAX_WINDOW,
    MODES,
    ROPE_SLACK,
    SettingsError,
    max_nodes,
)
from tokenswift.settings.settings import RENAMED, Settings


@dataclass(frozen=True)
class Speculation:
    mode: str = "tokenswift"  # "tokenswift" or "ar" (plain autoregressive decoding)
    gamma: int = 3  # number of chained draft heads used (depth of the tree beyond the base head)
    tree: tuple[int, ...] = (1, 3, 3, 3)  # top-k taken from each of the gamma+1 draft distributions
    ngram_topk: int = 20  # k: n-gram candidates per iteration
    ngram_lag: int | None = None  # 4-grams enter the table this many tokens late; None: lag(settings)
    budget: int | None = None  # |B| of the partial cache; None = min(prompt length, 4096), at least 64
    sinks: int = 16  # |S|: initial tokens always kept in the partial cache
    drafter: str = "auto"  # how TokenSwift proposes candidates (draft/choice.drafter_for resolves auto)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tree", tuple(int(x) for x in self.tree))  # JSON gives lists
        self._check()

    def _check(self) -> None:
        def need(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise SettingsError(name, message)

        need(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        need(1 <= self.gamma <= 8, "gamma", "must be in 1..8")
        need(len(self.tree) >= 1 and all(k >= 1 for k in self.tree), "tree", "needs positive widths")
        need(len(self.tree) <= self.gamma + 1, "tree", f"has at most gamma+1 = {self.gamma + 1} levels")
        need(self.tree[0] == 1, "tree", "the first level is the base head's top-1 (width 1)")
        need(0 <= self.ngram_topk <= 256, "ngram_topk", "k must be in 0..256")
        rows = max_nodes(self.tree, self.ngram_topk) + CAPACITY_SPARE
        need(self.mode != "tokenswift" or rows <= ROPE_SLACK, "tree",
             f"the tree and {self.ngram_topk} n-gram paths make up to {rows} candidate rows an iteration; at most "
             f"{ROPE_SLACK} fit: use fewer or narrower levels, or a lower ngram_topk")
        need(self.ngram_lag is None or self.ngram_lag >= 0, "ngram_lag", "must be >= 0")
        need(self.sinks >= 0, "sinks", "must be >= 0")
        need(self.budget is None or self.budget >= self.sinks + 8, "budget", "must be >= sinks + 8")
        need(self.drafter in DRAFTERS, "drafter", f"must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")

    def lag(self, settings: Settings) -> int:
        """How many tokens late a 4-gram enters the n-gram table. A path proposes what followed its 4-gram; with a
        repetition penalty that continuation is penalised while within the penalty's window, so a path drawn from
        the table is mostly rejected until it leaves the window (the default lag). Speed only: the text never
        depends on it. Without a penalty nothing works against it: every 4-gram counts at once (a greedy tiny
        model that loops repeats the text of a few tokens ago)."""
        if self.ngram_lag is not None:
            return self.ngram_lag
        return settings.penalty_window if settings.penalty != 1.0 else 0

    def replace(self, **changes) -> Speculation:
        unknown = set(changes) - set(SPEED_FIELDS)
        if unknown:
            raise SettingsError(sorted(unknown)[0], "unknown setting")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict) -> Speculation:
        unknown = set(values) - set(SPEED_FIELDS)
        if unknown:
            raise SettingsError(sorted(unknown)[0], "unknown setting")
        return cls(**values)


SPEED_FIELDS = tuple(f.name for f in dataclasses.fields(Speculation))
PLAIN = Speculation(mode="ar")  # plain decoding: what TokenSwift's text is checked against


@dataclass(frozen=True)
class DraftSettings:
    """What a draft is asked for: the text's settings and the speed options, as the store keeps them (one flat JSON
    object: storage.records.JobSettings) and the front doors take them (one flat set of names)."""

    settings: Settings = field(default_factory=Settings)
    speed: Speculation = field(default_factory=Speculation)

    @property
    def mode(self) -> str:
        return self.speed.mode

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def max_new_tokens(self) -> int:
        return self.settings.max_new_tokens

    def replace(self, **changes) -> DraftSettings:
        """Either half's fields, by name."""
        speed = {k: v for k, v in changes.items() if k in SPEED_FIELDS}
        text = {k: v for k, v in changes.items() if k not in SPEED_FIELDS}
        return DraftSettings(self.settings.replace(**text) if text else self.settings,
                             self.speed.replace(**speed) if speed else self.speed)

    def values(self) -> dict:
        return {**dataclasses.asdict(self.settings), **dataclasses.asdict(self.speed)}

    def to_json(self) -> str:
        return json.dumps(self.values(), sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict) -> DraftSettings:
        """One flat set of names, each to its half; an unknown name is refused (by Settings)."""
        speed = {k: v for k, v in values.items() if k in SPEED_FIELDS}
        text = {k: v for k, v in values.items() if k not in SPEED_FIELDS}
        return cls(Settings.from_dict(text), Speculation.from_dict(speed))

    @classmethod
    def from_json(cls, text: str) -> DraftSettings:
        """A draft's settings as the store kept them, under today's names (RENAMED). A row written before a limit
        existed is brought within it without changing its text: a window past the limit looks back over the same
        tokens in any draft shorter than it, and the candidate batch (the n-gram count, then the tree) is speed
        only."""
        values = {RENAMED.get(key, key): value for key, value in json.loads(text).items()}
        if isinstance(window := values.get("penalty_window"), int):
            values["penalty_window"] = min(window, MAX_WINDOW)
        try:
            return cls.from_dict(values)
        except SettingsError as error:
            if error.field != "tree":  # the candidate-row limit; other tree errors were refused before a row was kept
                raise
            return cls.from_dict({**values, "tree": Speculation.tree, "ngram_topk": Speculation.ngram_topk})
