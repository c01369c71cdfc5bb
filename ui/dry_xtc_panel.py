"""The DRY and XTC controls (tokenswift/sampling/dry_xtc.py), no copied runs, top-nσ and Adaptive-P in a novelist's
words: built alike in the Write tab's settings panel and in each Compare column, whose values both go through
ui.forms.SettingsForm."""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from ui.forms import SettingsForm, shown_breakers

# Offered in the breakers list besides the current ones; any other text can be typed in.
BREAKER_CHOICES = shown_breakers(("\n", ":", '"', "*", ".", "!", "?", ",", ";", "“", "”", "—"))
HELP = ("**DRY** (don't repeat yourself) pushes against copying a passage of the draft word for word, and **no "
        "copied runs** forbids it outright past a few words. **XTC** "
        "(exclude top choices) now and then sets the likeliest words aside for a less obvious one that is still "
        "likely: fresher phrasing, fewer stock phrases. **Top-nσ** writes only words nearly as likely as the best; "
        "**Adaptive-P** keeps the words about as expected as you ask, on average.")


@dataclass
class DryXtcParts:
    dry_multiplier: gr.Number
    dry_base: gr.Number
    dry_allowed_length: gr.Number
    dry_range: gr.Number
    dry_breakers: gr.Dropdown
    xtc_threshold: gr.Number
    xtc_probability: gr.Number
    no_repeat_ngram: gr.Number
    top_n_sigma: gr.Number
    adaptive_target: gr.Number
    adaptive_decay: gr.Number

    @property
    def fields(self) -> list:
        """In SettingsForm's field order (NAMES)."""
        return [getattr(self, name) for name in NAMES]


NAMES = tuple(f.name for f in fields(DryXtcParts))  # SettingsForm's names for the eleven, in its order


def build(d: SettingsForm, prefix: str, *, helped: bool = True) -> DryXtcParts:
    """The eleven controls, with ids `{prefix}-dry-multiplier` and so on. helped: with the help lines (the Write
    tab); without, for the narrow Compare columns (the labels still say what 0 means)."""

    def info(text: str) -> str | None:
        return text if helped else None

    if helped:
        gr.Markdown(HELP, elem_id=f"{prefix}-dry-xtc-help")
    with gr.Row():
        dry_multiplier = gr.Number(d.dry_multiplier, label="DRY strength (0 = off)", step=0.1,
                                   elem_id=f"{prefix}-dry-multiplier",
                                   info=info("How hard to push against a repeat: 0.8 is usual, higher pushes harder."))
        dry_base = gr.Number(d.dry_base, label="DRY growth", step=0.05, elem_id=f"{prefix}-dry-base",
                             info=info("How much harder the push gets with each further word repeated (1.75)."))
    with gr.Row():
        dry_allowed_length = gr.Number(d.dry_allowed_length, label="DRY free repeats (tokens)", precision=0,
                                       elem_id=f"{prefix}-dry-allowed-length",
                                       info=info("Repeats this short go free: names, \"she said\"."))
        dry_range = gr.Number(d.dry_range, label="DRY look-back (tokens)", precision=0,
                              elem_id=f"{prefix}-dry-range",
                              info=info("How far back repeats are looked for (320 tokens ≈ 240 words)."))
    dry_breakers = gr.Dropdown(list(dict.fromkeys([*BREAKER_CHOICES, *(d.dry_breakers or ())])),
                               value=list(d.dry_breakers or ()), multiselect=True, allow_custom_value=True,
                               label="DRY breakers", elem_id=f"{prefix}-dry-breakers",
                               info=info("A repeat never runs across these (\\n is a new line): type one and "
                                         "press Enter to add it, × to remove one."))
    with gr.Row():
        xtc_probability = gr.Number(d.xtc_probability, label="XTC probability (0 = off)", step=0.05,
                                    elem_id=f"{prefix}-xtc-probability",
                                    info=info("How often the likeliest words are set aside: 0.5 is lively."))
        xtc_threshold = gr.Number(d.xtc_threshold, label="XTC threshold", step=0.01,
                                  elem_id=f"{prefix}-xtc-threshold",
                                  info=info("How likely a word must be to count as a top choice (0.1)."))
    no_repeat_ngram = gr.Number(d.no_repeat_ngram, label="No copied runs longer than (tokens, 0 = off)", precision=0,
                                elem_id=f"{prefix}-no-repeat-ngram",
                                info=info("No run of this many tokens (10 ≈ 7 words) already in the last few pages is "
                                          "written again: a sentence or paragraph is never copied word for word."))
    top_n_sigma = gr.Number(d.top_n_sigma, label="Top-nσ (0 = off)", step=0.1, elem_id=f"{prefix}-top-n-sigma",
                            info=info("Only words nearly as likely as the best one may be written: 1 keeps the "
                                      "sentence on its rails, 2 to 3 leaves room; steady even at a high temperature."))
    with gr.Row():
        adaptive_target = gr.Number(d.adaptive_target, label="Adaptive-P target (-1 = off)", step=0.05,
                                    elem_id=f"{prefix}-adaptive-target",
                                    info=info("How expected the words should be on average: 0.3 surprising, 0.5 "
                                              "balanced, 0.7 close to the obvious. After a run of obvious words it "
                                              "reaches for a fresher one."))
        adaptive_decay = gr.Number(d.adaptive_decay, label="Adaptive-P memory", step=0.01,
                                   elem_id=f"{prefix}-adaptive-decay",
                                   info=info("How far back that average looks: 0.9 is about the last ten words."))
    return DryXtcParts(dry_multiplier, dry_base, dry_allowed_length, dry_range, dry_breakers, xtc_threshold,
                       xtc_probability, no_repeat_ngram, top_n_sigma, adaptive_target, adaptive_decay)


def breakers_update(shown) -> gr.Dropdown:
    """The breakers list showing `shown`, whatever texts it holds (a loaded draft's or preset's)."""
    shown = list(shown or ())
    return gr.Dropdown(choices=list(dict.fromkeys([*BREAKER_CHOICES, *shown])), value=shown)
