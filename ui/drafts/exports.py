"""The app's one folder for Library exports: each export in its own subfolder (so the file keeps its plain
name), exports older than an hour removed at the next one, and the whole folder removed at shutdown."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bookexport import Book
from storage.drafts import prompt_parts

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


def draft_book(gen, session, title: str, author: str, instruction: str | None) -> Book:
    """The book a draft exports as. A continuation is the writer's opening and what followed; an instruction
    draft (instruction: Store.instruction) is its whole story, every run and edit of it, without the instruction
    (it stays with the draft's details), its line breaks paragraphs. gen.text is only the last run's text: an
    edit's is empty and a continuation's its new part, the story before it is in its prompt.
    """
    identifier = book_identifier(session.id)
    text, story = prompt_parts(gen.prompt_text, instruction)
    if instruction is not None:
        return Book(title, author, (story + (gen.text or "")).lstrip(), identifier=identifier, wrapped=False)
    return Book(title, author, text + (gen.text or ""), identifier=identifier)


def book_identifier(session_id: int) -> str:
    """One identifier per Library book, so e-readers see a re-export (a draft's, or its plan's) as a new version of
    the book, not a new book."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'tokenswift-studio:session:{session_id}')}"
