"""Writing presets: the settings that shape a draft's text, saved as a JSON file and loaded again.

A preset is a JSON object keyed by Settings' names, which the API's are too, so the same object is a valid
`settings` of POST /api/generations and a `--preset` file of the command line. It holds what changes the words:
the rows of the settings table the API takes (tokenswift/settings/table.py): the sampler, the penalties, DRY, XTC,
the banned phrases and what happens at the end-of-text token.
Never the length, seed or mode of a draft, the speed-only knobs (k, tree, budget, drafter), nor World Info:
those belong to a draft, not to a way of writing. A key left out takes its writing default
(tokenswift.settings.WRITING_DEFAULTS), so a preset means the same in the app, the API and the command line.

Parsing is strict and names the key at fault (SettingsError.field): an unknown key, a value of the wrong JSON
type, a value out of range. Whole-file problems (too large, not JSON, not an object) name "preset".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tokenswift.settings import INT64_MAX, RENAMED, TEXT_FIELDS, Settings, SettingsError, writing_settings

# Preset key -> the JSON kind its value must have ("number", "integer", "boolean" or "strings").
FIELDS = {row.name: row.kind for row in TEXT_FIELDS if row.knob.api}
MAX_BYTES = 64 * 1024  # a full preset is about 500 bytes; anything near this is not one
# The built-in presets, as changes to the writing defaults (every one is exact: TokenSwift == plain decoding).
BUILT_IN = {
    "Writing defaults": {},
    "Greedy (deterministic)": {"temperature": 0.0},  # the likeliest word every time; DRY and θ still break loops
    "Creative (XTC)": {"temperature": 1.0, "min_p": 0.05, "xtc_threshold": 0.1, "xtc_probability": 0.5},
    "Penalty only (DRY off)": {"dry_multiplier": 0.0},
}
_KINDS = {"number": "a number", "integer": "a whole number", "boolean": "true or false",
          "strings": "a list of texts"}


def preset_of(settings: Settings) -> dict:
    """The preset of `settings`: every preset key, as JSON would hold it."""
    return {key: _plain(getattr(settings, key)) for key in FIELDS}


def built_in() -> dict[str, dict]:
    """Name -> complete preset, in menu order. A built-in leaves the writer's banned phrases alone: it holds no
    `ban` (a way of writing, not a list of someone's clichés)."""
    return {name: {key: value for key, value in preset_of(writing_settings(**changes)).items() if key != "ban"}
            for name, changes in BUILT_IN.items()}


def apply(settings: Settings, preset: dict) -> Settings:
    """`settings` with the preset's values (keys as parse_preset returns them) in place of its own."""
    return settings.replace(**preset)


def to_settings(preset: dict) -> Settings:
    """The writing defaults with the preset on top."""
    return apply(writing_settings(), preset)


def parse_preset(text: str | bytes) -> dict:
    """A preset's JSON -> {key: value} with only the keys it gives, every value checked (SettingsError)."""
    if len(text.encode() if isinstance(text, str) else text) > MAX_BYTES:
        raise SettingsError("preset", f"is larger than {MAX_BYTES // 1024} KB: a preset is a short JSON object")
    try:
        values = json.loads(text)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise SettingsError("preset", f"is not valid JSON ({error})") from None
    if not isinstance(values, dict):
        raise SettingsError("preset", "must be a JSON object of settings, such as {\"temperature\": 0.9}")
    for key, value in values.items():
        _check_type(key, value)
    to_settings(values)  # the ranges, as every entry point checks them
    return values


def read_preset(path: str | Path) -> dict:
    """parse_preset of a file, its size checked before it is read."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise SettingsError("preset", f"{path.name} is larger than {MAX_BYTES // 1024} KB: a preset is a "
                                          "short JSON object")
        return parse_preset(path.read_bytes())
    except OSError as error:
        raise SettingsError("preset", f"cannot read {path}: {error.strerror or error}") from None


def preset_json(preset: dict) -> str:
    return json.dumps(preset, indent=2, ensure_ascii=False) + "\n"


def _check_type(key: str, value) -> None:
    if key not in FIELDS:
        raise SettingsError(key, _unknown(key))
    kind = FIELDS[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"number": number and abs(value) <= 1e300,  # a huge integer cannot become a float
          "integer": number and isinstance(value, int) and abs(value) <= INT64_MAX,  # what the store holds
          "boolean": isinstance(value, bool),
          "strings": isinstance(value, list) and all(isinstance(s, str) for s in value)}[kind]
    if not ok:
        raise SettingsError(key, f"must be {_KINDS[kind]}, got {json.dumps(value)[:40]}")


def _unknown(key: str) -> str:
    if key in RENAMED:
        return f"write it as {RENAMED[key]}"
    if key in {f.name for f in dataclasses.fields(Settings)}:
        return f"is not part of a preset (it holds only what shapes the text: {', '.join(FIELDS)})"
    return "unknown setting"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value

