"""The book being exported: its record, and the normal form every format reads (title, newlines, identifier)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from dataclasses import dataclass, replace

DEFAULT_TITLE = "Untitled"
DEFAULT_LANGUAGE = "en"


@dataclass(frozen=True)
class Book:
    title: str
    author: str
    text: str  # the whole draft (prompt + generated, as the caller decides)
    language: str = DEFAULT_LANGUAGE
    # A stable unique id such as "urn:uuid:...". E-readers treat a new id as a new book, so callers that
    # re-export a revised draft should pass the id they stored; the fallback changes whenever the text does.
    identifier: str | None = None
    # True: the text may be hard-wrapped (a Gutenberg opening), so single line breaks are reflowed. False: the
    # model wrote it all (an instruction draft), and each line break it wrote ends a paragraph.
    wrapped: bool = True
    # The book's own chapters as (title, text), in order (a plan's, storage/plans.py): exported as they are, each
    # under its title, instead of the chapters found in `text` (which is then ignored).
    chapters: tuple[tuple[str, str], ...] = ()


def slugify(title: str) -> str:
    """A file-name-safe slug: "Café Noir: A Novel" -> "cafe-noir-a-novel"; non-Latin letters are kept."""
    decomposed = unicodedata.normalize("NFKD", title)
    without_marks = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    slug = re.sub(r"[\W_]+", "-", without_marks.lower()).strip("-")
    return slug[:80].rstrip("-") or DEFAULT_TITLE.lower()


def normalized(book: Book) -> Book:
    title = " ".join(book.title.split()) or DEFAULT_TITLE
    author = " ".join(book.author.split())
    text = _body(book.text, book.wrapped)
    chapters = tuple((" ".join(heading.split()), _body(body, book.wrapped)) for heading, body in book.chapters)
    whole = text + "".join(heading + body for heading, body in chapters)
    identifier = (book.identifier or "").strip() or _default_identifier(title, author, whole)
    language = book.language.strip() or DEFAULT_LANGUAGE
    return replace(book, title=title, author=author, text=text, identifier=identifier, language=language,
                   chapters=chapters)


def _body(text: str, wrapped: bool) -> str:
    text = _normalize_newlines(text)
    if not wrapped:  # every line a paragraph, one blank line between them, as every format reads it
        text = "\n\n".join(line.strip() for line in text.split("\n") if line.strip())
    return text


def _default_identifier(title: str, author: str, text: str) -> str:
    digest = hashlib.sha256("\0".join((title, author, text)).encode("utf-8")).hexdigest()
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'tokenswift-studio:book:{digest}')}"


def _normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")
