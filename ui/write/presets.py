"""The Write tab's presets: a built-in one chosen from the menu, the panel saved as a JSON file, a file loaded
into the panel.

Parsing and checking are the engine's (tokenswift/text/writing_presets.py), so a file the app accepts is one the
command line and the API accept too. This module maps a preset onto the panel's boxes and back. A refused file
changes nothing but the status line, which names the key at fault.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import gradio as gr

from tokenswift.settings import Settings, SettingsError
from tokenswift.text.writing_presets import FIELDS, built_in, preset_json, preset_of, read_preset, to_settings
from ui.display import views
from ui.drafts.exports import Exports
from ui.forms.forms import LABELS, SAMPLERS, FormError, SettingsForm, form_from_settings, settings_from
from ui.forms.samplers_panel import NAMES
from ui.write.write_parts import WriteParts
from ui.write.write_view import problem

# The panel's boxes a preset fills (SettingsForm's names): these, the samplers panel's and the banned phrases; the
# length, seed, mode and speed boxes stay as they are.
FILLED = ("penalty", "penalty_window", "sampler", "sampler_value", "temperature", "past_eos", *NAMES, "ban")
PANEL = [f.name for f in fields(SettingsForm) if f.name != "drafter"]  # WriteParts.form's order
MAX_TEMPERATURE = 2.0  # the panel's slider ends there
FILENAME = "tokenswift-preset.json"


def panel_form(preset: dict) -> SettingsForm:
    """The panel values of a (parsed) preset, or FormError naming the key the panel cannot show: the panel
    draws with one of top-p, min-p and η at a time, and its temperature slider stops at 2."""
    settings = to_settings(preset)
    on = [field for field, _, _ in SAMPLERS.values() if getattr(settings, field) != getattr(Settings, field)]
    if len(on) > 1:  # name the one the file sets (the other may be a writing default it left out)
        key = next((field for field in on if field in preset), on[-1])
        raise FormError(f"{key}: the Write tab draws with one of top_p, min_p and eta at a time, and this preset "
                        f"turns on {' and '.join(on)} (off is top_p 1, min_p 0, eta 0)")
    if settings.temperature > MAX_TEMPERATURE:
        raise FormError(f"temperature: the Write tab's slider goes up to {MAX_TEMPERATURE:g}, and this preset has "
                        f"{settings.temperature:g}")
    return form_from_settings(settings)


def fill(p: WriteParts, form: SettingsForm, preset: dict) -> dict:
    """Updates that show `form`'s preset values in the panel; the banned phrases only if `preset` has some (a
    preset without them, like every built-in, leaves the writer's list as it is)."""
    boxes = dict(zip(PANEL, p.form, strict=True))
    out = {boxes[name]: getattr(form, name) for name in FILLED if name != "ban" or "ban" in preset}
    out[p.sampler_value] = gr.Number(form.sampler_value, label=SAMPLERS[form.sampler][2])
    out.update(p.samplers.show(form))
    return out


def named(error: SettingsError) -> str:
    """'dry_base (DRY growth): must be in (1, 10]': the key as the file spells it, and the box it fills."""
    label = LABELS.get(error.field) if error.field in FIELDS else None
    return f"{error.field} ({label}): {str(error).split(': ', 1)[-1]}" if label else str(error)


def wire(p: WriteParts, exports: Exports) -> None:
    """exports: the app's download folder, where a saved preset is written for the browser to fetch."""
    fast = {"concurrency_limit": None}

    def choose(name):
        presets = built_in()
        if name not in presets:
            return {p.status: gr.skip()}
        return {**fill(p, panel_form(presets[name]), presets[name]),
                p.status: f"{views.dot('ok')} Preset **{name}**: its settings are in the panel."}

    def save(*form):
        try:
            settings = settings_from(SettingsForm(*form).text_settings()).settings
        except FormError as error:
            return problem(p, f"Save preset: {error}")
        path = exports.write(FILENAME, preset_json(preset_of(settings)).encode())
        return {p.preset_file: gr.File(str(path), visible=True),
                p.status: f"{views.dot('ok')} Preset saved: download **{FILENAME}** below the menu."}

    def load(file):
        path = Path(file if isinstance(file, str) else file.name)
        try:
            preset = read_preset(path)
            form = panel_form(preset)
        except SettingsError as error:
            return problem(p, f"Load preset: {path.name}: {named(error)}. The settings are unchanged.")
        except FormError as error:
            return problem(p, f"Load preset: {path.name}: {error}. The settings are unchanged.")
        return {**fill(p, form, preset), p.preset: None,
                p.status: f"{views.dot('ok')} Preset **{path.name}** loaded: its settings are in the panel."}

    panel_out = [*p.form, p.status]
    p.preset.input(choose, p.preset, panel_out, api_name="write_preset", **fast)
    p.save_preset.click(save, p.form, [p.preset_file, p.status], api_name="write_save_preset", **fast)
    p.load_preset.upload(load, p.load_preset, [*panel_out, p.preset], api_name="write_load_preset", **fast)
