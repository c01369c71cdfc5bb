"""The samplers panel: a box for each panel row of the settings table (tokenswift/settings/table.py): DRY and XTC
(tokenswift/sampling/dry_xtc.py), no copied runs, top-nσ and Adaptive-P, in a novelist's words. Built alike in the
Write tab's settings panel and in each Compare column, whose values both go through ui.forms.forms.SettingsForm."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

import gradio as gr

from ui.forms.boxes import box, texts_update
from ui.forms.forms import PANEL, SettingsForm

HELP = ("**DRY** (don't repeat yourself) pushes against copying a passage of the draft word for word, and **no "
        "copied runs** forbids it outright past a few words. **XTC** "
        "(exclude top choices) now and then sets the likeliest words aside for a less obvious one that is still "
        "likely: fresher phrasing, fewer stock phrases. **Top-nσ** writes only words nearly as likely as the best; "
        "**Adaptive-P** keeps the words about as expected as you ask, on average.")
NAMES = tuple(row.name for row in PANEL)  # SettingsForm's names for the panel's boxes, in its order
PER_ROW = 2  # boxes side by side: Compare's columns are narrow


@dataclass
class SamplerParts:
    boxes: dict[str, gr.components.Component]  # by Settings name, in NAMES' order

    @property
    def fields(self) -> list:
        """In SettingsForm's field order (NAMES)."""
        return [self.boxes[name] for name in NAMES]

    def show(self, form: SettingsForm) -> dict:
        """Updates that show `form`'s values (a list of texts offers them all, whatever it held before)."""
        return {self.boxes[row.name]: texts_update(getattr(form, row.name)) if row.kind == "strings"
                else getattr(form, row.name) for row in PANEL}


def build(d: SettingsForm, prefix: str, *, helped: bool = True) -> SamplerParts:
    """The boxes, with ids `{prefix}-dry-multiplier` and so on; a family's numbers share rows, PER_ROW at a time.
    helped: with the help lines (the Write tab); without, for the narrow Compare columns (the labels still say
    what 0 means)."""
    if helped:
        gr.Markdown(HELP, elem_id=f"{prefix}-dry-xtc-help")
    boxes = {}
    for (_, strings), rows in groupby(PANEL, key=lambda row: (row.knob.family, row.kind == "strings")):
        rows = list(rows)
        for start in range(0, len(rows), 1 if strings else PER_ROW):
            with gr.Row():
                for row in rows[start:start + (1 if strings else PER_ROW)]:
                    boxes[row.name] = box(row, getattr(d, row.name), f"{prefix}-{row.name.replace('_', '-')}",
                                          helped=helped)
    return SamplerParts(boxes)
