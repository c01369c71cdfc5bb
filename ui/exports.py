"""The app's one folder for Library exports: each export in its own subfolder (so the file keeps its plain
name), exports older than an hour removed at the next one, and the whole folder removed at shutdown."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bookexport import Book
from tokenswift.settings import Settings

KEEP_S = 3600.0  # Gradio copies the file into its own cache when it sends it; ours is only the source


class Exports:
    def __init__(self, parent: str | Path | None = None, keep_s: float = KEEP_S):
        self.folder = Path(tempfile.mkdtemp(prefix="tokenswift-exports-", dir=parent))
        self.keep_s = keep_s

    def write(self, filename: str, data: bytes) -> Path:
        self.prune()
        path = Path(tempfile.mkdtemp(dir=self.folder)) / filename
        path.write_bytes(data)
        return path

    def prune(self) -> None:
        cutoff = time.time() - self.keep_s
        for sub in self.folder.iterdir():
            if sub.stat().st_mtime < cutoff:
                shutil.rmtree(sub, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def draft_book(gen, session, title: str, author: str) -> Book:
    """The book a draft exports as. A continuation is the writer's opening and what followed; an instruction
    draft is the story alone (the instruction stays with the draft's details), its line breaks paragraphs.
    One identifier per Library book, so e-readers see a re-export as a new version, not a new book."""
    identifier = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'tokenswift-studio:session:{session.id}')}"
    instruction = Settings.from_json(gen.settings_json).prompt_format == "instruction" if gen.settings_json else False
    if instruction:
        return Book(title, author, (gen.text or "").lstrip(), identifier=identifier, wrapped=False)
    return Book(title, author, gen.prompt_text + (gen.text or ""), identifier=identifier)
