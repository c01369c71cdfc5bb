"""Form values -> tokenswift's DraftSettings (Settings and the speed options), with messages a writer can read (no
stack traces, UI labels).

The UI names the settings in words a writer knows ("Repetition penalty", the paper's θ in its help text): the
settings table's labels (tokenswift/settings/table.py), on the boxes built from its rows (ui/forms/boxes.py). A bad
value raises FormError whose text names the field as the form labels it. The samplers panel's boxes are the table's
panel rows (PANEL): SettingsForm has one field each; the sampler choices are its rows top-p, min-p and η (SAMPLERS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

from tokenswift.cli.flags import escaped_arg
from tokenswift.settings import (
    DRAFTERS,
    PLAIN,
    TEXT_FIELDS,
    WRITING_DEFAULTS,
    DraftSettings,
    Settings,
    SettingsError,
    Speculation,
    writing_settings,
)
from tokenswift.settings.phrases import read_phrases
from tokenswift.settings.table import Row
from ui.drafts.limits import target_problem

MODES = {"TokenSwift": "tokenswift", "AR": "ar"}
ROWS = {row.name: row for row in TEXT_FIELDS}  # the settings table's rows by field name


def box_label(row: Row) -> str:
    """A box's label: the table's label, then its hint ("Repetition penalty (1 = off)")."""
    return f"{row.knob.label} ({row.knob.hint})" if row.knob.hint else row.knob.label


# Sampler choice (the row's label) -> (Settings field, the value its box takes when chosen, the box's label).
SAMPLERS = {ROWS[name].knob.label: (name, first, box_label(ROWS[name]))
            for name, first in (("top_p", 0.9), ("min_p", WRITING_DEFAULTS["min_p"] or 0.05), ("eta", 0.0009))}
PROMPT_FORMATS = {"Continue my text": "continue", "Follow my instruction": "instruction"}
# At the model's end-of-text token: ban it (the draft reaches its length) or stop (tokenswift/settings' one rule).
PAST_EOS = {"Keep writing": True, "Stop there": False}
# Past the model's context: shift it (drop the oldest text, keep the Memory), or refuse such targets.
CONTEXT_SHIFT = {"Shift": None, "Refuse": False}
TARGET_LABEL = "Target length (new tokens)"  # one name wherever a draft's length is asked for (Write, Library)
QUICK_LENGTHS = {"1K": 1_000, "5K": 5_000, "10K": 10_000, "25K": 25_000, "50K": 50_000, "100K": 100_000}
# Error messages name a field as its box is labelled: the table's labels, and the boxes of the draft's own.
LABELS = {"max_new_tokens": "Target length", "mode": "Mode", "seed": "Seed", "ngram_topk": "Phrase guesses",
          "budget": "Guessing context", "sinks": "Sinks", "drafter": "Drafter", "prompt": "Prompt", "memory": "Memory",
          "authors_note": "Author's Note",
          **{row.name: row.knob.label for row in TEXT_FIELDS}}
PANEL = tuple(row for row in TEXT_FIELDS if row.knob.panel)  # the samplers panel's boxes, in the table's order
# The panel's first values: the writing defaults (tokenswift.settings), shown as the panel shows them.
DEFAULTS = {"penalty": WRITING_DEFAULTS["penalty"], "penalty_window": WRITING_DEFAULTS["penalty_window"], "k": 20,
            "sampler": "min-p" if WRITING_DEFAULTS["min_p"] else "top-p",
            "temperature": WRITING_DEFAULTS["temperature"], "seed": 0, "budget": 0}


def shown_breakers(breakers: Sequence[str]) -> tuple[str, ...]:
    """DRY's breakers as the panel lists them: a newline as \\n, as on the command line."""
    return tuple(b.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for b in breakers)


def breakers_from(shown: Sequence[str] | None) -> tuple[str, ...]:
    """The panel's list -> breakers, its escapes read as the command line reads them (an emptied list: none)."""
    return tuple(escaped_arg(b) for b in shown or ())


class FormError(ValueError):
    """A message for the status line: '<field label>: <what is wrong>'."""


def shown(row: Row, value: Any) -> Any:
    """A Settings value as the panel's box shows it."""
    return shown_breakers(value) if row.kind == "strings" else value


def read(row: Row, value: Any) -> Any:
    """A panel box's value as Settings takes it, or FormError naming the box."""
    if row.kind == "strings":
        return breakers_from(value)
    return _whole(value, row.name) if row.kind == "integer" else _number(value, row.name)


@dataclass(frozen=True)
class DraftBoxes:
    """The settings panel's boxes of its own (gr.Number gives None when a box is emptied); SettingsForm adds the
    samplers panel's (PANEL), the banned phrases and the drafter after them, in the Write tab's order."""

    mode: str = "TokenSwift"
    target: float | None = 1000
    penalty: float | None = DEFAULTS["penalty"]
    penalty_window: float | None = DEFAULTS["penalty_window"]
    k: float | None = DEFAULTS["k"]
    sampler: str = DEFAULTS["sampler"]
    sampler_value: float | None = SAMPLERS[DEFAULTS["sampler"]][1]
    temperature: float | None = DEFAULTS["temperature"]
    seed: float | None = DEFAULTS["seed"]
    budget: float | None = DEFAULTS["budget"]
    prompt_format: str = "Continue my text"
    past_eos: str = next(label for label, ban in PAST_EOS.items() if ban == WRITING_DEFAULTS["ban_eos"])
    shift: str = "Shift"

    def panel(self) -> list:
        """The Write tab's panel values, in its order (every field but the drafter)."""
        return [getattr(self, f.name) for f in fields(self) if f.name != "drafter"]

    def text_settings(self) -> dict:
        """The Settings values that shape the text (what a preset holds): the sampler, θ and its window, the
        samplers panel, the banned phrases and the end-of-text choice. The filters not chosen stay off."""
        if self.sampler not in SAMPLERS:
            raise FormError(f"Sampler: choose one of {', '.join(SAMPLERS)}")
        if self.past_eos not in PAST_EOS:
            raise FormError(f"When the model wants to end the text: choose one of {', '.join(PAST_EOS)}")
        field_name = SAMPLERS[self.sampler][0]
        return {
            **{name: read(ROWS[name], getattr(self, name)) for name in ("temperature", "penalty", "penalty_window")},
            field_name: read(ROWS[field_name], self.sampler_value),
            **{row.name: read(row, getattr(self, row.name)) for row in PANEL},
            "ban_eos": PAST_EOS[self.past_eos],
            "ban": tuple(read_phrases(self.ban or "")),
        }

    def to_settings(self) -> DraftSettings:
        """The boxes' settings, the text's and the speed's (whether the target fits the model's context: the drafts
        service, ui/drafts/drafts.py)."""
        if self.mode not in MODES:
            raise FormError(f"Mode: choose one of {', '.join(MODES)}")
        values = {
            **self.text_settings(),
            "mode": MODES[self.mode],
            "max_new_tokens": _whole(self.target, "max_new_tokens"),
            "seed": _whole(self.seed, "seed"),
            "ngram_topk": _whole(self.k, "ngram_topk"),
        }
        budget = _whole(self.budget, "budget")
        values["budget"] = budget or None  # 0 = automatic
        if self.prompt_format not in PROMPT_FORMATS:
            raise FormError(f"Prompt: choose one of {', '.join(PROMPT_FORMATS)}")
        if self.drafter not in DRAFTERS:
            raise FormError(f"Drafter: choose one of {', '.join(DRAFTERS)}")
        values["drafter"] = self.drafter
        values["prompt_format"] = PROMPT_FORMATS[self.prompt_format]
        if self.shift not in CONTEXT_SHIFT:
            raise FormError(f"Past the context: choose one of {', '.join(CONTEXT_SHIFT)}")
        values["context_shift"] = CONTEXT_SHIFT[self.shift]
        return settings_from(values)


# The panel's boxes: DraftBoxes', one per panel row of the settings table, the banned phrases (one a line; the Write
# tab offers STARTER_BANS: write_parts) and the drafter (not in the Write tab's panel, which passes the rest in order).
SettingsForm = make_dataclass("SettingsForm", [
    *[(row.name, Any, field(default=shown(row, row.writing))) for row in PANEL],
    ("ban", str | None, field(default="\n".join(writing_settings().ban))),
    ("drafter", str, field(default=Speculation.drafter)),
], bases=(DraftBoxes,), frozen=True)


def settings_from(values: dict) -> DraftSettings:
    """One flat set of values, the text's and the speed's (a stored draft's JSON), or FormError naming the box."""
    if "max_new_tokens" in values and (problem := target_problem(values["max_new_tokens"])):
        raise FormError(f"Target length: {problem}")
    try:
        return DraftSettings.from_dict(values)
    except SettingsError as error:
        raise FormError(labelled(error)) from None


def labelled(error: SettingsError) -> str:
    """A refusal (of Settings or the drafts service, ui/drafts/drafts.py) naming its field as the form labels it."""
    return f"{LABELS.get(error.field, error.field)}: {error.reason}"


def ar_twin(asked: DraftSettings) -> DraftSettings:
    """The AR run whose text a lossless TokenSwift run must equal: the same Settings (seed, sampler, penalty and
    window), plain decoding for speed, so runs that differ only in how they draft (k, budget, drafter) share one
    twin."""
    return DraftSettings(asked.settings, PLAIN)


def form_from_settings(settings: Settings, speed: Speculation | None = None) -> SettingsForm:
    """The panel values that reproduce `settings` and `speed` (None: the defaults; a preset's, which has none)."""
    speed = speed or Speculation()
    sampler = next((name for name, (f, _, _) in SAMPLERS.items() if getattr(settings, f) != getattr(Settings, f)),
                   "top-p")
    mode = next(label for label, value in MODES.items() if value == speed.mode)
    return SettingsForm(
        mode=mode, target=settings.max_new_tokens, penalty=settings.penalty, penalty_window=settings.penalty_window,
        k=speed.ngram_topk, sampler=sampler, sampler_value=getattr(settings, SAMPLERS[sampler][0]),
        temperature=settings.temperature, seed=settings.seed, budget=speed.budget or 0, drafter=speed.drafter,
        prompt_format=next(label for label, value in PROMPT_FORMATS.items() if value == settings.prompt_format),
        past_eos=next(label for label, ban in PAST_EOS.items() if ban == settings.ban_eos),
        shift="Refuse" if settings.context_shift is False else "Shift", ban="\n".join(settings.ban),
        **{row.name: shown(row, getattr(settings, row.name)) for row in PANEL},
    )


def parse_target(text: str | float | None) -> int | None:
    """Quick-pick labels ('25K') or plain numbers."""
    if text is None:
        return None
    if isinstance(text, str):
        return QUICK_LENGTHS.get(text.strip().upper())
    return int(text)


def _number(value: float | None, name: str) -> float:
    if value is None:
        raise FormError(f"{LABELS.get(name, name)}: enter a number")
    return float(value)


def _whole(value: float | None, name: str) -> int:
    number = _number(value, name)
    if number != int(number):
        raise FormError(f"{LABELS.get(name, name)}: must be a whole number, got {number:g}")
    return int(number)
