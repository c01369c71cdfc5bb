"""A Gradio box for a row of the settings table (tokenswift/settings/table.py): its label and hint, its help line,
its step, and a slider's ends where the row asks for one, all the table's. The samplers panel's boxes (in the Write
tab and each Compare column) and the Write tab's own (temperature, the repetition penalty and its window, the sampler's
value) are built here, so a field's words and range are written once, in its row."""

from __future__ import annotations

import gradio as gr

from tokenswift.settings.table import Row
from ui.forms.forms import box_label, shown_breakers

# Offered in a list of texts (DRY's breakers) besides the current ones; any other text can be typed in.
BREAKER_CHOICES = shown_breakers(("\n", ":", '"', "*", ".", "!", "?", ",", ";", "“", "”", "—"))


def box(row: Row, value, elem_id: str, *, helped: bool = True, hinted: bool = True) -> gr.components.Component:
    """`row`'s box showing `value`. helped: with the row's help under the label (else the label alone says what 0
    means: narrow columns). hinted: the hint after the label (without, the plain label that Compare's tooltips
    name, ui/compare/compare.TIPS)."""
    knob = row.knob
    label, info = box_label(row) if hinted else knob.label, knob.help[0].upper() + knob.help[1:] + "."
    if row.kind == "strings":
        return gr.Dropdown(list(dict.fromkeys([*BREAKER_CHOICES, *(value or ())])), value=list(value or ()),
                           multiselect=True, allow_custom_value=True, label=label, elem_id=elem_id,
                           info=info + " Type one and press Enter to add it, × to remove one." if helped else None)
    if knob.slider is not None:
        return gr.Slider(knob.range.low, knob.slider, value=value, step=knob.step, label=label, elem_id=elem_id,
                         info=info if helped else None)
    step = {"step": knob.step} if knob.step is not None else {"precision": 0}
    return gr.Number(value, label=label, elem_id=elem_id, info=info if helped else None, **step)


def texts_update(shown) -> gr.Dropdown:
    """A list of texts showing `shown`, whatever texts it holds (a loaded draft's or preset's)."""
    shown = list(shown or ())
    return gr.Dropdown(choices=list(dict.fromkeys([*BREAKER_CHOICES, *shown])), value=shown)
