"""Generation settings: one frozen dataclass shared by the CLI, the worker and the UI.

Field names follow the paper. Validation lives in __post_init__ so that every entry point (command line,
REST API, UI form, a job row read back from the store) rejects bad values with the same message.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from tokenswift.settings.limits import (
    CAPACITY_SPARE,
    DRAFTERS,
    INT64_MAX,
    MAX_WINDOW,
    MODES,
    PROMPT_FORMATS,
    REPEAT_RANGE,
    ROPE_SLACK,
    SettingsError,
    finite,
    lone_surrogate,
    max_nodes,
)
from tokenswift.settings.phrases import merged, phrase_problem


@dataclass(frozen=True)
class Settings:
    mode: str = "tokenswift"  # "tokenswift" or "ar" (plain autoregressive decoding)
    seed: int = 0  # keys the position-indexed sampling noise (design §3)
    max_new_tokens: int = 1024  # target length of the generated text, in tokens
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # nucleus sampling; 1 = off
    min_p: float = 0.0  # drop tokens below min_p * p_max; 0 = off
    eta: float = 0.0  # eta-sampling epsilon; 0 = off
    min_keep: int = 1  # filters never keep fewer tokens (the published code uses 20)
    penalty: float = 1.0  # contextual repetition penalty theta (>= 1; 1 = off)
    penalty_length: int = 1024  # W: window of the penalty, in tokens (0 = off)
    gamma: int = 3  # number of chained draft heads used (depth of the tree beyond the base head)
    tree: tuple[int, ...] = (1, 3, 3, 3)  # top-k taken from each of the gamma+1 draft distributions
    ngram_topk: int = 20  # k: n-gram candidates per iteration
    ngram_lag: int | None = None  # 4-grams enter the table this many tokens late; None = W with a penalty, else 0
    budget: int | None = None  # |B| of the partial cache; None = min(prompt length, 4096), at least 64
    sinks: int = 16  # |S|: initial tokens always kept in the partial cache
    ignore_eos: bool = False  # keep decoding past EOS (fixed-length runs as in the paper)
    ban_eos: bool = False  # never sample end-of-text, so a long draft reaches its target (KoboldCpp's EOS ban)
    stop: tuple[str, ...] = field(default_factory=tuple)  # stop strings
    prompt_format: str = "continue"  # how the prompt text becomes ids (tokenswift.text.prompting)
    drafter: str = "auto"  # how TokenSwift proposes candidates; never changes the text
    # Context shifting (tokenswift.text.context_window): what the model sees of a draft longer than its context.
    context_shift: bool | None = None  # None: on (it acts only when a draft outgrows the window); False: refuse
    context_window: int | None = None  # tokens in one window; None = the model's trained context (the ceiling)
    shift_step: int | None = None  # story tokens dropped per shift; None = a quarter of the window
    note_depth: int = 256  # the Author's Note goes this many tokens before the end of the window
    # DRY and XTC (dry_xtc.py): writers' repetition and cliché controls, off by default.
    dry_multiplier: float = 0.0  # 0 = off; 0.8 is the usual setting
    dry_base: float = 1.75
    dry_allowed_length: int = 2  # repeats up to this many tokens go unpenalised
    dry_range: int = 320  # how far back repeats are looked for, in tokens
    dry_breakers: tuple[str, ...] = ("\n", ":", '"', "*")  # a repeat never runs across one of these
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0  # 0 = off
    # Banned phrases (banned.py): the text rewinds where one would complete and goes on another way. Exact.
    ban: tuple[str, ...] = ()
    no_repeat_ngram: int = 0  # no run of this many tokens already in the recent text is written again (0 = off)
    top_n_sigma: float = 0.0  # keep tokens within n standard deviations of the top logit (sampler.py); 0 = off
    # Adaptive-P (adaptive_p.py): steer the chosen tokens' probability toward a target; negative = off (llama.cpp's).
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9  # how slowly the history forgets: it spans about 1/(1 - decay) tokens

    def __post_init__(self) -> None:
        # Values may come from JSON (lists, ints for floats): normalise before checking.
        object.__setattr__(self, "tree", tuple(int(x) for x in self.tree))
        object.__setattr__(self, "stop", tuple(str(s) for s in self.stop))
        object.__setattr__(self, "dry_breakers", tuple(str(s) for s in self.dry_breakers))
        # A string stays one so that _check refuses it (as a sequence it would be banned letter by letter).
        object.__setattr__(self, "ban", self.ban if isinstance(self.ban, str) else tuple(self.ban))
        self._check()
        object.__setattr__(self, "ban", merged(self.ban))  # stripped; case-insensitive duplicates merged

    def _check(self) -> None:
        def need(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise SettingsError(name, message)

        need(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        need(isinstance(self.seed, int) and 0 <= self.seed <= INT64_MAX, "seed", "must be an integer in 0..2**63-1")
        need(1 <= self.max_new_tokens <= INT64_MAX, "max_new_tokens", "must be in 1..2**63-1")
        need(finite(self.temperature) and self.temperature >= 0, "temperature", "must be a finite number >= 0")
        need(self.top_k >= 0, "top_k", "must be >= 0")
        need(finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(finite(self.min_p) and 0 <= self.min_p < 1, "min_p", "must be in [0, 1)")
        need(finite(self.eta) and 0 <= self.eta < 1, "eta", "must be in [0, 1)")
        need(self.min_keep >= 1, "min_keep", "must be >= 1")
        need(finite(self.penalty) and self.penalty >= 1, "penalty", "theta must be a finite number >= 1")
        need(0 <= self.penalty_length <= MAX_WINDOW, "penalty_length", f"W must be in 0..{MAX_WINDOW}")
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
        need(all(self.stop), "stop", "stop strings must not be empty")
        need(self.drafter in DRAFTERS, "drafter", f"must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        need(self.context_shift in (None, True, False), "context_shift", "must be true, false or null")
        need(self.context_window is None or self.context_window >= 16, "context_window", "must be >= 16 tokens")
        need(self.shift_step is None or self.shift_step >= 1, "shift_step", "must be >= 1")
        need(0 <= self.note_depth <= 100_000, "note_depth", "must be in 0..100000")
        need(finite(self.dry_multiplier) and 0 <= self.dry_multiplier <= 100, "dry_multiplier", "must be in 0..100")
        need(finite(self.dry_base) and 1 < self.dry_base <= 10, "dry_base", "must be in (1, 10]")
        need(isinstance(self.dry_allowed_length, int) and 1 <= self.dry_allowed_length <= 100,
             "dry_allowed_length", "must be in 1..100")
        need(isinstance(self.dry_range, int) and 2 <= self.dry_range <= 4096, "dry_range", "must be in 2..4096")
        need(len(self.dry_breakers) <= 32 and all(0 < len(b) <= 16 for b in self.dry_breakers), "dry_breakers",
             "at most 32 breakers of 1 to 16 characters")
        need(finite(self.xtc_threshold) and 0 <= self.xtc_threshold <= 0.5, "xtc_threshold", "must be in 0..0.5")
        need(finite(self.xtc_probability) and 0 <= self.xtc_probability <= 1, "xtc_probability",
             "must be in 0..1")
        need(not isinstance(self.ban, str), "ban", "must be a list of phrases, not one string")
        need(isinstance(self.no_repeat_ngram, int) and (self.no_repeat_ngram == 0 or 4 <= self.no_repeat_ngram <= 64),
             "no_repeat_ngram", "must be 0 (off) or in 4..64 tokens")
        need(finite(self.top_n_sigma) and 0 <= self.top_n_sigma <= 100, "top_n_sigma", "must be in 0..100 (0 = off)")
        need(finite(self.adaptive_target) and self.adaptive_target <= 1, "adaptive_target",
             "must be in 0..1 (negative = off)")
        need(finite(self.adaptive_decay) and 0 <= self.adaptive_decay <= 0.99, "adaptive_decay", "must be in 0..0.99")
        for name in ("stop", "dry_breakers", "ban"):
            at = next((i for i in map(lone_surrogate, map(str, getattr(self, name))) if i is not None), None)
            need(at is None, name, f"is not valid Unicode: a lone surrogate at character {at}")
        need((problem := phrase_problem(self.ban)) is None, "ban", problem or "")
        need(self.prompt_format in PROMPT_FORMATS, "prompt_format",
             f"must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")

    @property
    def lag(self) -> int:
        """The published code adds a 4-gram only once it has left the penalty window, where the penalty no
        longer works against repeating it. Without a penalty nothing works against it: every 4-gram counts
        at once (a greedy tiny model that loops repeats the text of a few tokens ago)."""
        if self.ngram_lag is not None:
            return self.ngram_lag
        return self.penalty_length if self.penalty != 1.0 else 0

    @property
    def history_length(self) -> int:
        """Tokens of a position's history its sampling reads: the penalty's window, DRY's range and the no-repeat
        rule's (0: none)."""
        penalty = self.penalty_length if self.penalty != 1.0 else 0
        dry = self.dry_range if self.dry_multiplier > 0 else 0
        return max(penalty, dry, REPEAT_RANGE if self.no_repeat_ngram else 0)

    def window(self, model_context: int) -> tuple[int, int]:
        """The context window's size and shift step on a model with this context. A window larger than the
        model's trained context is refused: no RoPE scaling is applied behind the writer's back."""
        size = self.context_window or model_context
        if size > model_context:
            raise SettingsError("context_window", f"{size} exceeds the model's context of {model_context} tokens "
                                                  "(no RoPE scaling is applied)")
        step = self.shift_step or max(1, size // 4)
        if step >= size:
            raise SettingsError("shift_step", f"must be smaller than the window ({size} tokens)")
        return size, step

    def replace(self, **changes) -> Settings:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise SettingsError(sorted(unknown)[0], "unknown setting")
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict) -> Settings:
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(sorted(unknown)[0], "unknown setting")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        """Settings as the store kept them. A row written before a limit existed is brought within it without
        changing its text: a window past the limit looks back over the same tokens in any draft shorter than
        it, and the candidate batch (the n-gram count, then the tree) is speed only."""
        values = json.loads(text)
        if isinstance(window := values.get("penalty_length"), int):
            values["penalty_length"] = min(window, MAX_WINDOW)
        try:
            return cls.from_dict(values)
        except SettingsError as error:
            if error.field != "tree":  # the candidate-row limit; other tree errors were refused before a row was kept
                raise
            return cls.from_dict({**values, "tree": cls.tree, "ngram_topk": cls.ngram_topk})


# What a writer gets without choosing anything: the app's Write tab, the API's unset fields and the command
# line's flags all start from these (Settings' own defaults are the neutral sampler the algorithm is described
# with). Chosen by measurement on the default model: scripts/prose_quality.py, the README's table.
# End of text: the one rule for the app, the API and the command line, whatever the length: a draft is written
# to the length asked for (the model's end-of-text token is banned), unless the writer chooses to stop there.
WRITING_DEFAULTS = {"temperature": 0.9, "top_p": 1.0, "min_p": 0.1, "penalty": 1.1, "penalty_length": 256,
                    "dry_multiplier": 0.8, "ban_eos": True, "no_repeat_ngram": 10}


def concrete_drafter(drafter: str, has_layer: bool, device_type: str, has_model: bool = False) -> str:
    """The drafter `auto` stands for: the draft model where one was given (the writer chose it for this model);
    the draft layer on a CPU where the model has one (there, a verify pass costs nearly its rows in compute, so only
    drafts the model agrees with pay: the layer's are right about three times as often as the heads'), else the
    fused drafter (on a GPU a wide tree verifies nearly free)."""
    if drafter != "auto":
        return drafter
    if has_model:
        return "model"
    return "layer" if has_layer and device_type == "cpu" else "fused"


def writing_settings(**changes) -> Settings:
    """The writing defaults, with `changes` on top."""
    return Settings(**{**WRITING_DEFAULTS, **changes})
