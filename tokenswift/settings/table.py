"""The settings table's row type: what each front door needs to know of a setting that shapes the text.

Settings (settings.py) declares every such field with `knob(...)`, so its class body is the table: the name, type
and default are the field's own; the row adds the range, the writing default, a one-line help for a novelist, the
command-line flag, the names the REST API, the presets and the OpenAI-compatible endpoint take, and the Write
form's label and box. The REST API's model (ui/api/api_input.py), the OpenAI names (ui/api/openai_input.py), the
command line's flags (cli/flags.py, cli/common.py), the presets' keys (text/writing_presets.py), the Write form's
boxes (ui/forms/boxes.py: the samplers panel, temperature, the penalty and its window, the sampler's value), its error
labels (ui/forms/forms.py, ui/write/presets.py) and Compare's columns are all made from it: a new sampler is a row in
Settings and its code in sampling/.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

SAME = object()  # a row's writing default when it is the field's own (Settings' defaults are the neutral sampler)
KINDS = {"float": "number", "int": "integer", "bool": "boolean", "tuple[str, ...]": "strings"}  # JSON's kinds


@dataclass(frozen=True)
class Range:
    """The values a field takes: low..high, either end open or absent; `off`, a value outside it that turns the
    sampler off. `says` replaces the generated "must be ..." where the field's error has its own words."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    off: float | None = None
    says: str = ""

    def holds(self, value: Any, kind: str) -> bool:
        if kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
            return False
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        if self.off is not None and value == self.off:
            return True
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def problem(self) -> str:
        if self.says:
            return self.says
        if self.high is None:
            return f"must be >= {self.low:g}"
        if self.open_low or self.open_high:
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            return f"must be in {left}{self.low:g}, {self.high:g}{right}"
        return f"must be in {self.low:g}..{self.high:g}"


@dataclass(frozen=True)
class Knob:
    label: str  # the Write form's name for it, also in its error messages ("DRY growth: must be in (1, 10]")
    help: str  # one line for a novelist: the command line's help and the Write form's hint
    range: Range | None = None  # None: checked in Settings._check (lists of text)
    writing: Any = SAME  # what a writer gets without choosing (WRITING_DEFAULTS)
    flag: bool = True  # a command-line flag, --name-with-dashes
    metavar: str | None = None
    api: bool = True  # in the REST API's settings and in a preset, by the field's name
    openai: tuple[str, ...] = ()  # the names the OpenAI-compatible endpoint takes (OpenAI's, KoboldCpp's, webui's)
    openai_kind: str | None = None  # how that endpoint reads it, where not as its JSON kind (ui/api/openai_input.py)
    panel: bool = False  # a box of the Write form's samplers panel (and each Compare column's); else its own box
    hint: str = ""  # after the label on that box: "0 = off", "tokens"
    step: float | None = None  # that box's step; None: whole numbers
    slider: float | None = None  # that box is a slider from the range's low end up to this (the range may go on)
    family: str = ""  # the boxes of one family share a row; the flags of a family a help group (cli/flags.py)


@dataclass(frozen=True)
class Row:
    """One row of the table: a Settings field and its knob."""

    name: str
    kind: str  # "number", "integer", "boolean" or "strings", as JSON holds it
    default: Any  # Settings' own
    writing: Any  # the writing default
    knob: Knob

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def knob(default: Any, **row: Any) -> Any:
    """A Settings field with its row of the table."""
    return dataclasses.field(default=default, metadata={"knob": Knob(**row)})


def rows_of(cls: type) -> tuple[Row, ...]:
    """The table: the rows of `cls`'s knob fields, in its order."""
    return tuple(Row(f.name, KINDS[f.type], f.default, f.default if f.metadata["knob"].writing is SAME
                     else f.metadata["knob"].writing, f.metadata["knob"])
                 for f in dataclasses.fields(cls) if "knob" in f.metadata)
