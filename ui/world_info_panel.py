"""The Write tab's World Info (lorebook): a JSON editor box beside the Memory, a file imported into it, its
content exported as a file.

Parsing and checking are the engine's (tokenswift/text/world_info.py), so a file the app accepts is one the command
line (`--world-info`) and the API accept too. The box's JSON goes with the draft when it starts, continues or
when Memory and Note are saved (ui/write.py); a refused file or box changes nothing but the status line, which
names the entry and the field at fault in plain words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from tokenswift.decode.settings import SettingsError
from tokenswift.text.world_info import WorldInfo
from ui import views
from ui.exports import Exports
from ui.forms import FormError

FILENAME = "world-info.json"
MAX_FILE_BYTES = 2 * 2**20  # 256 entries of 2,000 characters with their keys fit well inside
EXAMPLE = {"depth": 1024, "entries": [
    {"keys": ["Lily"], "secondary_keys": [], "content": "Lily is Tom's younger sister; she is afraid of the sea.",
     "constant": False, "enabled": True}]}
HELP = ("Entries whose text joins what the model sees (after the Memory) while one of their keys appears in the "
        "story's last `depth` tokens, or always when `constant`. Keys are plain words or phrases, found whole and "
        "ignoring case; with `secondary_keys` one of those must appear too. An entry comes in within 64 tokens of "
        "its key being written. At most a quarter of the window goes to World Info: constant entries first, then "
        "in list order.")


@dataclass
class WorldInfoParts:
    editor: gr.Code  # the draft's World Info as JSON ('' for none)
    upload: gr.UploadButton
    export: gr.Button
    file: gr.File  # the exported file, to download


def build() -> WorldInfoParts:
    with gr.Accordion("World Info (lorebook)", open=False, elem_id="write-world"):
        gr.Markdown(HELP)
        editor = gr.Code("", language="json", label="World Info (JSON)", interactive=True, lines=6, max_lines=20,
                         elem_id="write-world-info")
        with gr.Row():
            upload = gr.UploadButton("Import JSON…", file_types=[".json"], size="sm", elem_id="write-world-import")
            export = gr.Button("Export JSON", size="sm", elem_id="write-world-export")
        file = gr.File(label="Exported World Info", interactive=False, visible=False, elem_id="write-world-file")
        gr.Markdown(f"Example:\n```json\n{json.dumps(EXAMPLE, indent=2)}\n```")
    return WorldInfoParts(editor, upload, export, file)


def stored(text: str | None) -> str:
    """The box's JSON as the store keeps it ('' for none), or FormError naming the entry and field plainly."""
    try:
        return WorldInfo.from_json(text).to_json()
    except SettingsError as error:
        raise FormError(f"World Info: {plain(error)}") from None


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

    parts.upload.upload(load, parts.upload, [parts.editor, status], api_name="write_world_import", **fast)
    parts.export.click(export, parts.editor, [parts.file, status], api_name="write_world_export", **fast)
