"""Plain text (the backup: bodies verbatim, never reflowed) and Markdown (reflowed paragraphs)."""

from __future__ import annotations

import re
from datetime import datetime

from bookexport.book import Book
from bookexport.reflow import SCENE_BREAK, paragraphs


def render_txt(book: Book, chapters: list[tuple[str, str]], _: datetime) -> bytes:
    # Plain text is the backup format: bodies go out verbatim, never reflowed.
    parts = [book.title]
    if book.author:
        parts.append(f"by {book.author}")
    out = "\n".join(parts) + "\n\n"
    out += "".join(f"\n{heading}\n\n{body}\n\n" if heading else f"\n{body}\n\n"
                   for heading, body in headed(book, chapters))
    return out.rstrip("\n").encode("utf-8") + b"\n"


def headed(book: Book, chapters: list[tuple[str, str]]) -> list[tuple[str | None, str]]:
    """The chapters as a text format or a DOCX heads them: the opening, which chapters.py names after the book,
    follows the book's own title line without repeating it (an e-book's contents still list it by that name)."""
    return [(None if i == 0 and heading == book.title else heading, body) for i, (heading, body) in enumerate(chapters)]


_MD_ORDERED_LIST = re.compile(r"(\d{1,9})([.)])(?=\s|$)")
_MD_INLINE_SPECIAL = re.compile(r"([\\`*_\[\]<>])")


def _md_line(line: str) -> str:
    """Escape what would turn a prose line into Markdown structure (heading, quote, list, rule, fence,
    HTML, table). CommonMark lets a backslash escape any ASCII punctuation, so this never shows."""
    line = line.lstrip()  # four leading spaces would make a code block
    if line and line[0] in "#>+-*=_~`|<[":
        return "\\" + line
    return _MD_ORDERED_LIST.sub(r"\1\\\2", line, count=1) if _MD_ORDERED_LIST.match(line) else line


def _md_inline(text: str) -> str:
    """Escape a title, author or heading placed inside Markdown syntax (`# ...`, `*by ...*`)."""
    escaped = _MD_INLINE_SPECIAL.sub(r"\\\1", text)
    return re.sub(r"(#+)$", lambda m: "\\#" * len(m.group(1)), escaped)  # a closing "#" run is dropped


def render_md(book: Book, chapters: list[tuple[str, str]], _: datetime) -> bytes:
    blocks = [f"# {_md_inline(book.title)}"]
    if book.author:
        blocks.append(f"*by {_md_inline(book.author)}*")
    for heading, body in headed(book, chapters):
        if heading:
            blocks.append(f"## {_md_inline(heading)}")
        # Two trailing spaces are Markdown's hard line break, kept for verse and letters.
        blocks.extend("  \n".join(_md_line(line) for line in p.lines) or SCENE_BREAK for p in paragraphs(body))
    return ("\n\n".join(blocks) + "\n").encode("utf-8")
