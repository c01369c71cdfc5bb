"""The Write tab's World Info (lorebook): a form that adds an entry (keys, text, always in view), the JSON editor
box it writes into, a file imported into it, its content exported as a file.

Parsing and checking are the engine's (tokenswift/text/world_info.py), so a file the app accepts is one the command
line (`--world-info`) and the API accept too. The box's JSON goes with the draft when it starts, continues or
when Memory and Note are saved (ui/write/write.py); a refused file or box changes nothing but the status line, which
names the entry and the field at fault in plain words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from tokenswift.settings import SettingsError
from tokenswift.text.world_info import WorldInfo
from ui.display import views
from ui.drafts.exports import Exports
from ui.forms.forms import FormError

FILENAME = "world-info.json"
MAX_FILE_BYTES = 2 * 2**20  # 256 entries of 2,000 characters with their keys fit well inside
EXAMPLE = {"depth": 1024, "entries": [
    {"keys": ["Lily"], "secondary_keys": [], "content": "Lily is Tom's younger sister; she is afraid of the sea.",
     "constant": False, "enabled": True}]}
HELP = ("Facts about your characters and places that the model is shown (after the Memory) only while they matter. "
        "**An entry waits for one of its keys to appear in the recent story** (its last `depth` tokens, 1,024 by "
        "default): a name in your opening counts, a name the story has not reached yet does not, so until then the "
        "model does not see the entry. It comes in within 64 tokens of its key being written. Tick *Always in "
        "view* (`constant`) for an entry the model should see from the start. Keys are plain words or phrases, "
        "found whole and ignoring case; with `secondary_keys` one of those must appear too. At most a quarter of "
        "the window goes to World Info: constant entries first, then in list order.")


@dataclass
class WorldInfoParts:
    keys: gr.Textbox  # the form for one new entry: its keys (comma-separated), text and whether always in view
    content: gr.Textbox
    constant: gr.Checkbox
    add: gr.Button
    editor: gr.Code  # the draft's World Info as JSON ('' for none)
    upload: gr.UploadButton
    export: gr.Button
    file: gr.File  # the exported file, to download


def build() -> WorldInfoParts:
    with gr.Accordion("World Info (lorebook)", open=False, elem_id="write-world"):
        gr.Markdown(HELP)
        with gr.Row():
            keys = gr.Textbox(label="Keys (comma-separated)", placeholder="Lily, the girl", max_lines=1, scale=2,
                              elem_id="write-world-keys")
            constant = gr.Checkbox(False, label="Always in view", elem_id="write-world-constant", scale=1)
        content = gr.Textbox(label="What the model should know", lines=2, max_lines=6, elem_id="write-world-content",
                             placeholder="Lily is Tom's younger sister; she is afraid of the sea.")
        add = gr.Button("Add entry", size="sm", elem_id="write-world-add")
        editor = gr.Code("", language="json", label="World Info (JSON)", interactive=True, lines=6, max_lines=20,
                         elem_id="write-world-info")
        with gr.Row():
            upload = gr.UploadButton("Import JSON…", file_types=[".json"], size="sm", elem_id="write-world-import")
            export = gr.Button("Export JSON", size="sm", elem_id="write-world-export")
        file = gr.File(label="Exported World Info", interactive=False, visible=False, elem_id="write-world-file")
        gr.Markdown(f"Example:\n```json\n{json.dumps(EXAMPLE, indent=2)}\n```")
    return WorldInfoParts(keys, content, constant, add, editor, upload, export, file)


def stored(text: str | None) -> str:
    """The box's JSON as the store keeps it ('' for none), or FormError naming the entry and field plainly."""
    try:
        return WorldInfo.from_json(text).to_json()
    except SettingsError as error:
        raise FormError(f"World Info: {plain(error)}") from None


def with_entry(text: str | None, keys: str, content: str, constant: bool) -> str:
    """The box's World Info with one more entry, as the box shows it; FormError naming the form's field or the entry."""
    document = json.loads(stored(text) or "{}")
    names = [key.strip() for key in (keys or "").split(",") if key.strip()]
    if not (content or "").strip():
        raise FormError("World Info: write what the model should know (the entry's text)")
    if not names and not constant:
        raise FormError("World Info: give the entry a key (a name the story mentions), or tick Always in view")
    entry = {"keys": names, "secondary_keys": [], "content": content.strip(), "constant": bool(constant),
             "enabled": True}
    return shown(stored(json.dumps({**document, "entries": [*document.get("entries", []), entry]})))


def shown(text: str) -> str:
    """Stored World Info laid out for the box."""
    return json.dumps(json.loads(text), indent=2, ensure_ascii=False) if text else ""


def plain(error: SettingsError) -> str:
    """'entry 4, keys: ...' for 'world_info.entries[3].keys: ...' (entries counted from 1, as a writer counts)."""
    message = error.reason
    if found := re.fullmatch(r"world_info\.entries\[(\d+)\](?:\.(\w+))?", error.field):
        where = f"entry {int(found.group(1)) + 1}" + (f", {found.group(2).replace('_', ' ')}" if found.group(2) else "")
        return f"{where}: {message}"
    return f"{error.field.removeprefix('world_info').lstrip('.') or 'the document'}: {message}"


def wire(parts: WorldInfoParts, status: gr.Markdown, exports: Exports) -> None:
    """status: the tab's status line. exports: the app's download folder, where an export is written."""
    fast = {"concurrency_limit": None}

    def refused(message: str) -> dict:
        gr.Warning(views.plain(message))
        return {status: f"{views.dot('bad')} {message}"}

    def load(file):
        path = Path(file if isinstance(file, str) else file.name)
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise FormError(f"World Info: larger than {MAX_FILE_BYTES // 2**20} MB")
            text = stored(path.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError:
            return refused(f"Import: {path.name} is not UTF-8 text. The World Info is unchanged.")
        except FormError as error:
            return refused(f"Import: {path.name}: {error}. The World Info is unchanged.")
        count = len(json.loads(text)["entries"]) if text else 0
        return {parts.editor: shown(text),
                status: f"{views.dot('ok')} World Info **{path.name}** imported: {count} entries. They go with the "
                        "draft you start (or save to the open one with Save Memory and Note)."}

    def export(text):
        try:
            kept = stored(text)
        except FormError as error:
            return refused(f"Export: {error}")
        if not kept:
            return refused("Export: the World Info box is empty.")
        path = exports.write(FILENAME, (shown(kept) + "\n").encode())
        return {parts.file: gr.File(str(path), visible=True),
                status: f"{views.dot('ok')} World Info exported: download **{FILENAME}** below the buttons."}

    def add(text, keys, content, constant):
        try:
            kept = with_entry(text, keys, content, constant)
        except FormError as error:
            return refused(f"Add entry: {error}.")
        when = "always" if constant else f"once {', '.join(repr(k.strip()) for k in keys.split(',') if k.strip())} " \
                                         "appears in the recent story"
        return {parts.editor: kept, parts.keys: "", parts.content: "", parts.constant: False,
                status: f"{views.dot('ok')} World Info entry added: the model sees it {when}. It goes with the draft "
                        "you start (or save it to the open one with Save Memory and Note)."}

    parts.add.click(add, [parts.editor, parts.keys, parts.content, parts.constant],
                    [parts.editor, parts.keys, parts.content, parts.constant, status], api_name="write_world_add",
                    **fast)
    parts.upload.upload(load, parts.upload, [parts.editor, status], api_name="write_world_import", **fast)
    parts.export.click(export, parts.editor, [parts.file, status], api_name="write_world_export", **fast)
