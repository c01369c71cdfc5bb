"""The book being exported, and the one entry point: export_book(book, fmt) -> (bytes, media type, file name).

Every format is built from the same chapter split (bookexport.chapters) and, except plain text, the same
paragraphs (bookexport.reflow), so the TOC a writer sees in an e-reader matches the headings in Word and
in the Markdown copy.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from bookexport import docx_file, epub, text_formats
from bookexport.chapters import WORDS_PER_CHAPTER, split_chapters

FORMATS = ("txt", "md", "epub", "docx")

MEDIA_TYPES = {
    "txt": "text/plain; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
    "epub": "application/epub+zip",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
RENDERERS = {"txt": text_formats.render_txt, "md": text_formats.render_md, "epub": epub.render,
             "docx": docx_file.render}

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


def export_book(
    book: Book, fmt: str, words_per_chapter: int = WORDS_PER_CHAPTER, *, modified: datetime | None = None
) -> tuple[bytes, str, str]:
    """Render ``book`` as ``fmt`` and return (data, media type, suggested file name).

    ``modified`` stamps EPUB ``dcterms:modified`` and the DOCX core properties (naive means UTC; default:
    now). With it fixed, the EPUB bytes are identical for identical input.
    """
    key = fmt.strip().lower().lstrip(".")
    if key not in RENDERERS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    book = _normalized(book)
    chapters = split_chapters(book.text, words_per_chapter, opening_heading=book.title)
    data = RENDERERS[key](book, chapters, _utc_seconds(modified))
    return data, MEDIA_TYPES[key], f"{slugify(book.title)}.{key}"


def slugify(title: str) -> str:
    """A file-name-safe slug: "Café Noir: A Novel" -> "cafe-noir-a-novel"; non-Latin letters are kept."""
    decomposed = unicodedata.normalize("NFKD", title)
    without_marks = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    slug = re.sub(r"[\W_]+", "-", without_marks.lower()).strip("-")
    return slug[:80].rstrip("-") or DEFAULT_TITLE.lower()


def _normalized(book: Book) -> Book:
    title = " ".join(book.title.split()) or DEFAULT_TITLE
    author = " ".join(book.author.split())
    text = _normalize_newlines(book.text)
    if not book.wrapped:  # every line a paragraph, one blank line between them, as every format reads it
        text = "\n\n".join(line.strip() for line in text.split("\n") if line.strip())
    identifier = (book.identifier or "").strip() or _default_identifier(title, author, text)
    language = book.language.strip() or DEFAULT_LANGUAGE
    return replace(book, title=title, author=author, text=text, identifier=identifier, language=language)


def _default_identifier(title: str, author: str, text: str) -> str:
    digest = hashlib.sha256("\0".join((title, author, text)).encode("utf-8")).hexdigest()
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'tokenswift-studio:book:{digest}')}"


def _normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _utc_seconds(moment: datetime | None) -> datetime:
    moment = moment or datetime.now(UTC)
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.replace(microsecond=0)
