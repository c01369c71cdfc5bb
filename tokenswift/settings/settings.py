"""Generation settings, what the text is: one frozen dataclass shared by the CLI, the worker and the UI. How fast
it is written (the mode, the drafter, the tree, the n-gram count, the partial cache) is apart: speculation.py.

Field names follow the paper's concepts, one name each, which the command line (--penalty-window), the API, the
presets and the store also use. The fields that shape the text are declared with `knob` (table.py): Settings' class
body is the table every front door is made from. Validation lives in __post_init__ so that every entry point
(command line, REST API, UI form, a job row read back from the store) rejects bad values with the same message; a
row's range is checked from the table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenswift.settings.limits import (
    INT64_MAX,
    MAX_WINDOW,
    PROMPT_FORMATS,
    REPEAT_RANGE,
    SettingsError,
    lone_surrogate,
)
from tokenswift.settings.phrases import merged, phrase_problem
from tokenswift.settings.table import Range, knob, rows_of


@dataclass(frozen=True)
class Settings:
    seed: int = 0  # keys the position-indexed sampling noise (design §3)
    max_new_tokens: int = 1024  # target length of the generated text, in tokens
    prompt_format: str = "continue"  # how the prompt text becomes ids (tokenswift.text.prompting)

    # The table (table.py): what shapes the text, a row each, with what every front door shows of it.
    temperature: float = knob(1.0, label="Temperature", writing=0.9, openai=("temperature",),
                              range=Range(0, None, says="must be a finite number >= 0"), hint="0 = greedy", step=0.05,
                              slider=2.0,
                              help="higher is more surprising, lower safer; 0 always takes the likeliest token")
    top_k: int = knob(0, label="top-k", range=Range(0), flag=False, api=False, openai=("top_k",),
                      help="draw only from this many of the likeliest tokens; 0 = off")
    top_p: float = knob(1.0, label="top-p", range=Range(0, 1, open_low=True), openai=("top_p",), hint="1 = off",
                        step=0.01,
                        help="draw only from the likeliest tokens that together make up this share; 1 = off")
    min_p: float = knob(0.0, label="min-p", range=Range(0, 1, open_high=True), writing=0.1, openai=("min_p",),
                        hint="0 = off", step=0.01,
                        help="drop tokens less likely than this fraction of the likeliest one; 0 = off")
    eta: float = knob(0.0, label="η", range=Range(0, 1, open_high=True), hint="eta sampling ε, 0 = off", step=0.01,
                      help="eta sampling: drop tokens below an entropy-scaled threshold; 0 = off")
    penalty: float = knob(1.0, label="Repetition penalty", writing=1.1, openai=("repetition_penalty", "rep_pen"),
                          range=Range(1, None, says="theta must be a finite number >= 1"), hint="1 = off", step=0.05,
                          help="repetition penalty θ: above 1 discourages repeating recent tokens; 1 = off")
    penalty_window: int = knob(1024, label="Penalty window", range=Range(0, MAX_WINDOW), writing=256, hint="tokens",
                               openai=("repetition_penalty_range", "rep_pen_range"),
                               help="how many recent tokens the repetition penalty looks back over; 0 = off")
    ban_eos: bool = knob(False, label="When the model wants to end the text", writing=True, flag=False,
                         openai=("ignore_eos", "ban_eos_token"),
                         help="never let the model end the text, so a long draft reaches its length (KoboldCpp's "
                              "EOS ban)")
    stop: tuple[str, ...] = knob((), label="Stop strings", flag=False, api=False, openai=("stop",),
                                 help="stop when one of these texts appears")
    # DRY and XTC (dry_xtc.py): writers' repetition and cliché controls.
    dry_multiplier: float = knob(0.0, label="DRY strength", range=Range(0, 100), writing=0.8, step=0.1,
                                 openai=("dry_multiplier",), panel=True, hint="0 = off", family="DRY",
                                 help="DRY: how hard to push against extending a repeat of earlier text; 0 = off, "
                                      "0.8 is usual")
    dry_base: float = knob(1.75, label="DRY growth", range=Range(1, 10, open_low=True), step=0.05,
                           openai=("dry_base",), panel=True, family="DRY",
                           help="DRY: how much harder the push gets with each further word repeated")
    dry_allowed_length: int = knob(2, label="DRY free repeats", range=Range(1, 100), openai=("dry_allowed_length",),
                                   panel=True, hint="tokens", family="DRY",
                                   help="DRY: repeats this short go free: names, \"she said\"")
    dry_range: int = knob(320, label="DRY look-back", range=Range(2, 4096), panel=True, hint="tokens",
                          openai=("dry_range", "dry_penalty_last_n"), family="DRY",
                          help="DRY: how far back repeats are looked for (320 tokens ≈ 240 words)")
    dry_breakers: tuple[str, ...] = knob(("\n", ":", '"', "*"), label="DRY breakers", panel=True, metavar="TEXT",
                                         openai=("dry_sequence_breakers",), openai_kind="breakers", family="DRY",
                                         help="DRY: a repeat never runs across these; \\n for a new line")
    xtc_threshold: float = knob(0.1, label="XTC threshold", range=Range(0, 0.5), step=0.01, openai=("xtc_threshold",),
                                panel=True, family="XTC",
                                help="XTC: how likely a word must be to count as a top choice")
    xtc_probability: float = knob(0.0, label="XTC probability", range=Range(0, 1), step=0.05, panel=True,
                                  openai=("xtc_probability",), hint="0 = off", family="XTC",
                                  help="XTC: how often the likeliest words are set aside for a fresher one that is "
                                       "still likely; 0 = off, 0.5 is lively")
    # Banned phrases (banned.py): the text rewinds where one would complete and goes on another way. Exact.
    ban: tuple[str, ...] = knob((), label="Banned phrases", flag=False, openai=("banned_strings",),
                                help="never write these phrases (any case, across words, anywhere in a word)")
    no_repeat_ngram: int = knob(0, label="No copied runs longer than", writing=10, metavar="N", panel=True,
                                range=Range(4, 64, off=0, says="must be 0 (off) or in 4..64 tokens"),
                                hint="tokens, 0 = off", family="DRY",
                                help="no run of this many tokens (10 ≈ 7 words) already in the last few pages is "
                                     "written again: a sentence is never copied word for word; 0 = off")
    top_n_sigma: float = knob(0.0, label="Top-nσ", range=Range(0, 100, says="must be in 0..100 (0 = off)"),
                              step=0.1, openai=("top_n_sigma", "nsigma"), openai_kind="sigma", panel=True,
                              hint="0 = off", metavar="N",
                              help="only words nearly as likely as the best one may be written: 1 keeps the "
                                   "sentence on its rails, 2 to 3 leaves room, steady even at a high temperature; "
                                   "0 = off")
    # Adaptive-P (adaptive_p.py): steer the chosen tokens' probability toward a target; negative = off (llama.cpp's).
    adaptive_target: float = knob(-1.0, label="Adaptive-P target", step=0.05, panel=True, hint="-1 = off",
                                  range=Range(None, 1, says="must be in 0..1 (negative = off)"), metavar="P",
                                  openai=("adaptive_target",), family="Adaptive-P",
                                  help="how expected the words should be on average: 0.3 surprising, 0.5 balanced, "
                                       "0.7 close to the obvious; negative = off; not on the fast path")
    adaptive_decay: float = knob(0.9, label="Adaptive-P memory", range=Range(0, 0.99), step=0.01, panel=True,
                                 openai=("adaptive_decay",), metavar="D", family="Adaptive-P",
                                 help="how far back that average looks: about 1/(1 - memory) tokens, 0.9 the last "
                                      "ten")

    min_keep: int = 1  # filters never keep fewer tokens (the published code uses 20)
    ignore_eos: bool = False  # keep decoding past EOS (fixed-length runs as in the paper)
    # Context shifting (tokenswift.text.context_window): what the model sees of a draft longer than its context.
    context_shift: bool | None = None  # None: on (it acts only when a draft outgrows the window); False: refuse
    context_window: int | None = None  # tokens in one window; None = the model's trained context (the ceiling)
    shift_step: int | None = None  # story tokens dropped per shift; None = a quarter of the window
    note_depth: int = 256  # the Author's Note goes this many tokens before the end of the window

    def __post_init__(self) -> None:
        # Values may come from JSON (lists, ints for floats): normalise before checking.
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

        need(isinstance(self.seed, int) and 0 <= self.seed <= INT64_MAX, "seed", "must be an integer in 0..2**63-1")
        need(1 <= self.max_new_tokens <= INT64_MAX, "max_new_tokens", "must be in 1..2**63-1")
        for row in TEXT_FIELDS:
            if row.knob.range is not None:
                need(row.knob.range.holds(getattr(self, row.name), row.kind), row.name, row.knob.range.problem())
        need(self.min_keep >= 1, "min_keep", "must be >= 1")
        need(all(self.stop), "stop", "stop strings must not be empty")
        need(self.context_shift in (None, True, False), "context_shift", "must be true, false or null")
        need(self.context_window is None or self.context_window >= 16, "context_window", "must be >= 16 tokens")
        need(self.shift_step is None or self.shift_step >= 1, "shift_step", "must be >= 1")
        need(0 <= self.note_depth <= 100_000, "note_depth", "must be in 0..100000")
        need(len(self.dry_breakers) <= 32 and all(0 < len(b) <= 16 for b in self.dry_breakers), "dry_breakers",
             "at most 32 breakers of 1 to 16 characters")
        need(not isinstance(self.ban, str), "ban", "must be a list of phrases, not one string")
        for name in ("stop", "dry_breakers", "ban"):
            at = next((i for i in map(lone_surrogate, map(str, getattr(self, name))) if i is not None), None)
            need(at is None, name, f"is not valid Unicode: a lone surrogate at character {at}")
        need((problem := phrase_problem(self.ban)) is None, "ban", problem or "")
        need(self.prompt_format in PROMPT_FORMATS, "prompt_format",
             f"must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")

    @property
    def history_length(self) -> int:
        """Tokens of a position's history its sampling reads: the penalty's window, DRY's range and the no-repeat
        rule's (0: none)."""
        penalty = self.penalty_window if self.penalty != 1.0 else 0
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

    def check_fits(self, prompt_tokens: int | None, context: int | None, pinned: int = 0) -> None:
        """With context shifting off, the prompt (None: not counted), the target and the pinned Memory and Author's
        Note must fit `context` (None: unknown, nothing to check). The one rule, in one set of words, that the engine
        and every front door (ui/drafts/drafts.py) apply, so a refusal up front and a failed job read the same."""
        total = (prompt_tokens or 0) + self.max_new_tokens + pinned
        if self.context_shift is not False or not context or total <= context:
            return
        what = f"max_new_tokens ({self.max_new_tokens})"
        if prompt_tokens is not None:
            extra = f" + Memory and Author's Note ({pinned})" if pinned else ""
            what = f"prompt ({prompt_tokens} tokens) + {what}{extra} = {total}"
        raise SettingsError("max_new_tokens", f"{what} exceeds the model's context of {context} tokens (context "
                                              "shifting is off)")

    def replace(self, **changes) -> Settings:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise SettingsError(sorted(unknown)[0], "unknown setting")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict) -> Settings:
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(sorted(unknown)[0], "unknown setting")
        return cls(**values)


TEXT_FIELDS = rows_of(Settings)  # the table, in Settings' order
# What a writer gets without choosing anything: the app's Write tab, the API's unset fields and the command
# line's flags all start from these (Settings' own defaults are the neutral sampler the algorithm is described
# with). Chosen by measurement on the default model: scripts/prose_quality.py, the README's table.
# End of text: the one rule for the app, the API and the command line, whatever the length: a draft is written
# to the length asked for (the model's end-of-text token is banned), unless the writer chooses to stop there.
WRITING_DEFAULTS = {row.name: row.writing for row in TEXT_FIELDS if row.writing != row.default}
# Names the store's settings JSON used before a concept had one name everywhere: drafts saved by earlier versions.
RENAMED = {"penalty_length": "penalty_window"}


def writing_settings(**changes) -> Settings:
    """The writing defaults, with `changes` on top."""
    return Settings(**{**WRITING_DEFAULTS, **changes})
