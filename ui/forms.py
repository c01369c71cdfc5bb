"""Form values -> tokenswift Settings, with messages a writer can read (no stack traces, UI labels).

The UI names the settings in words a writer knows ("Repetition penalty", the paper's θ in its help text); Settings
keeps the paper's names (penalty, penalty_length, ngram_topk). A bad value raises FormError whose text names the
field as the form labels it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from tokenswift.cli.flags import escaped_arg
from tokenswift.settings import DRAFTERS, WRITING_DEFAULTS, Settings, SettingsError, writing_settings
from tokenswift.settings.phrases import read_phrases
from ui.limits import target_problem

MODES = {"TokenSwift": "tokenswift", "AR": "ar"}
# Sampler choice -> (Settings field, default value, value label).
SAMPLERS = {
    "top-p": ("top_p", 0.9, "p (top-p, 1 = off)"),
    "min-p": ("min_p", WRITING_DEFAULTS["min_p"] or 0.05, "min-p (0 = off)"),
    "η": ("eta", 0.0009, "η (eta-sampling ε, 0 = off)"),
}
PROMPT_FORMATS = {"Continue my text": "continue", "Follow my instruction": "instruction"}
# At the model's end-of-text token: ban it (the draft reaches its length) or stop (tokenswift/settings' one rule).
PAST_EOS = {"Keep writing": True, "Stop there": False}
# Past the model's context: shift it (drop the oldest text, keep the Memory), or refuse such targets.
CONTEXT_SHIFT = {"Shift": None, "Refuse": False}
TARGET_LABEL = "Target length (new tokens)"  # one name wherever a draft's length is asked for (Write, Library)
QUICK_LENGTHS = {"1K": 1_000, "5K": 5_000, "10K": 10_000, "25K": 25_000, "50K": 50_000, "100K": 100_000}
LABELS = {
    "max_new_tokens": "Target length", "mode": "Mode", "seed": "Seed", "temperature": "Temperature",
    "top_p": "top-p", "min_p": "min-p", "eta": "η", "penalty": "Repetition penalty",
    "penalty_length": "Penalty window", "ngram_topk": "Phrase guesses", "budget": "Guessing context",
    "sinks": "Sinks", "drafter": "Drafter",
    "dry_multiplier": "DRY strength", "dry_base": "DRY growth", "dry_allowed_length": "DRY free repeats",
    "dry_range": "DRY look-back", "dry_breakers": "DRY breakers", "xtc_threshold": "XTC threshold",
    "xtc_probability": "XTC probability", "no_repeat_ngram": "No copied runs longer than", "ban": "Banned phrases",
    "top_n_sigma": "Top-nσ", "adaptive_target": "Adaptive-P target", "adaptive_decay": "Adaptive-P memory",
}
# The panel's first values: the writing defaults (tokenswift.settings), shown as the panel shows them.
DEFAULTS = {"theta": WRITING_DEFAULTS["penalty"], "window": WRITING_DEFAULTS["penalty_length"], "k": 20,
            "sampler": "min-p" if WRITING_DEFAULTS["min_p"] else "top-p",
            "temperature": WRITING_DEFAULTS["temperature"], "seed": 0, "budget": 0}
_WRITING = writing_settings()


def shown_breakers(breakers: Sequence[str]) -> tuple[str, ...]:
    """DRY's breakers as the panel lists them: a newline as \\n, as on the command line."""
    return tuple(b.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for b in breakers)


def breakers_from(shown: Sequence[str] | None) -> tuple[str, ...]:
    """The panel's list -> breakers, its escapes read as the command line reads them (an emptied list: none)."""
    return tuple(escaped_arg(b) for b in shown or ())


class FormError(ValueError):
    """A message for the status line: '<field label>: <what is wrong>'."""


@dataclass(frozen=True)
class SettingsForm:
    """The settings panel's raw values (gr.Number gives None when a box is emptied)."""

    mode: str = "TokenSwift"
    target: float | None = 1000
    theta: float | None = DEFAULTS["theta"]
    window: float | None = DEFAULTS["window"]
    k: float | None = DEFAULTS["k"]
    sampler: str = DEFAULTS["sampler"]
    sampler_value: float | None = SAMPLERS[DEFAULTS["sampler"]][1]
    temperature: float | None = DEFAULTS["temperature"]
    seed: float | None = DEFAULTS["seed"]
    budget: float | None = DEFAULTS["budget"]
    prompt_format: str = "Continue my text"
    past_eos: str = next(label for label, ban in PAST_EOS.items() if ban == WRITING_DEFAULTS["ban_eos"])
    shift: str = "Shift"
    dry_multiplier: float | None = _WRITING.dry_multiplier
    dry_base: float | None = _WRITING.dry_base
    dry_allowed_length: float | None = _WRITING.dry_allowed_length
    dry_range: float | None = _WRITING.dry_range
    dry_breakers: Sequence[str] | None = shown_breakers(_WRITING.dry_breakers)  # as the panel lists them
    xtc_threshold: float | None = _WRITING.xtc_threshold
    xtc_probability: float | None = _WRITING.xtc_probability
    no_repeat_ngram: float | None = _WRITING.no_repeat_ngram
    top_n_sigma: float | None = _WRITING.top_n_sigma
    adaptive_target: float | None = _WRITING.adaptive_target
    adaptive_decay: float | None = _WRITING.adaptive_decay
    ban: str | None = "\n".join(_WRITING.ban)  # one phrase a line (the Write tab offers STARTER_BANS: write_parts)
    drafter: str = Settings.drafter  # not in the Write tab's panel (which passes the fields above in order)

    def panel(self) -> list:
        """The Write tab's panel values, in its order (every field but the drafter)."""
        return [getattr(self, f.name) for f in fields(self) if f.name != "drafter"]

    def text_settings(self) -> dict:
        """The Settings values that shape the text (what a preset holds): the sampler, θ and W, DRY, XTC, the
        banned phrases, top-nσ, Adaptive-P and the end-of-text choice. The filters not chosen stay off."""
        if self.sampler not in SAMPLERS:
            raise FormError(f"Sampler: choose one of {', '.join(SAMPLERS)}")
        if self.past_eos not in PAST_EOS:
            raise FormError(f"When the model wants to end the text: choose one of {', '.join(PAST_EOS)}")
        field_name = SAMPLERS[self.sampler][0]
        return {
            "temperature": _number(self.temperature, "temperature"),
            "penalty": _number(self.theta, "penalty"),
            "penalty_length": _whole(self.window, "penalty_length"),
            field_name: _number(self.sampler_value, field_name),
            "dry_multiplier": _number(self.dry_multiplier, "dry_multiplier"),
            "dry_base": _number(self.dry_base, "dry_base"),
            "dry_allowed_length": _whole(self.dry_allowed_length, "dry_allowed_length"),
            "dry_range": _whole(self.dry_range, "dry_range"),
            "dry_breakers": breakers_from(self.dry_breakers),
            "xtc_threshold": _number(self.xtc_threshold, "xtc_threshold"),
            "xtc_probability": _number(self.xtc_probability, "xtc_probability"),
            "no_repeat_ngram": _whole(self.no_repeat_ngram, "no_repeat_ngram"),
            "top_n_sigma": _number(self.top_n_sigma, "top_n_sigma"),
            "adaptive_target": _number(self.adaptive_target, "adaptive_target"),
            "adaptive_decay": _number(self.adaptive_decay, "adaptive_decay"),
            "ban_eos": PAST_EOS[self.past_eos],
            "ban": tuple(read_phrases(self.ban or "")),
        }

    def to_settings(self, *, limit: int | None = None, prompt_tokens: int = 0,
                    prompt_label: str = "prompt") -> Settings:
        """limit: the model's context, checked against prompt_tokens (as counted by the model's tokenizer; 0
        when unknown) + the target; prompt_label names those tokens in the message."""
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
        if values["context_shift"] is False and limit and prompt_tokens + values["max_new_tokens"] > limit:
            new = f"max_new_tokens ({values['max_new_tokens']:,})"
            if not prompt_tokens:
                raise FormError(f"Target length: {new} exceeds the model's context of {limit:,} tokens")
            raise FormError(f"Target length: {prompt_label} ({prompt_tokens:,} tokens) + {new} exceed the model's "
                            f"context of {limit:,} tokens")
        return settings_from(values)


def settings_from(values: dict) -> Settings:
    if problem := target_problem(values.get("max_new_tokens", 0)):
        raise FormError(f"Target length: {problem}")
    try:
        return Settings.from_dict(values)
    except SettingsError as error:
        raise FormError(f"{LABELS.get(error.field, error.field)}: {str(error).split(': ', 1)[-1]}") from None


def ar_twin(settings: Settings) -> Settings:
    """The AR run whose text a lossless TokenSwift run must equal: same seed, sampler, θ and W; the
    drafting-only knobs (k, budget, drafter) are reset so runs that differ only there share one twin."""
    return settings.replace(mode="ar", ngram_topk=Settings.ngram_topk, budget=None, drafter=Settings.drafter)


def form_from_settings(settings: Settings) -> SettingsForm:
    """The panel values that reproduce `settings` (opening a stored generation)."""
    sampler = next((name for name, (f, _, _) in SAMPLERS.items() if getattr(settings, f) != getattr(Settings, f)),
                   "top-p")
    mode = next(label for label, value in MODES.items() if value == settings.mode)
    return SettingsForm(
        mode=mode, target=settings.max_new_tokens, theta=settings.penalty, window=settings.penalty_length,
        k=settings.ngram_topk, sampler=sampler, sampler_value=getattr(settings, SAMPLERS[sampler][0]),
        temperature=settings.temperature, seed=settings.seed, budget=settings.budget or 0, drafter=settings.drafter,
        prompt_format=next(label for label, value in PROMPT_FORMATS.items() if value == settings.prompt_format),
        past_eos=next(label for label, ban in PAST_EOS.items() if ban == settings.ban_eos),
        shift="Refuse" if settings.context_shift is False else "Shift", dry_multiplier=settings.dry_multiplier,
        dry_base=settings.dry_base, dry_allowed_length=settings.dry_allowed_length, dry_range=settings.dry_range,
        dry_breakers=shown_breakers(settings.dry_breakers), xtc_threshold=settings.xtc_threshold,
        xtc_probability=settings.xtc_probability, no_repeat_ngram=settings.no_repeat_ngram, ban="\n".join(settings.ban),
        top_n_sigma=settings.top_n_sigma, adaptive_target=settings.adaptive_target,
        adaptive_decay=settings.adaptive_decay,
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
