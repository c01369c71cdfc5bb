"""The one entry point: export_book(book, fmt) -> (bytes, media type, file name).

Every format is built from the same chapter split (bookexport.chapters) and, except plain text, the same
paragraphs (bookexport.reflow), so the TOC a writer sees in an e-reader matches the headings in Word and
in the Markdown copy.
"""

from __future__ import annotations

from datetime import UTC, datetime

from bookexport import docx_file, epub, text_formats
from bookexport.book import Book, normalized, slugify
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


def export_book(
    book: Book, fmt: str, words_per_chapter: int = WORDS_PER_CHAPTER, *, modified: datetime | None = None
) -> tuple[bytes, str, str]:
    """Render ``book`` as ``fmt`` and return (data, media type, suggested file name). A book with chapters of its
    own (Book.chapters) exports them, each under its title; else chapters are found in its text.

    ``modified`` stamps EPUB ``dcterms:modified`` and the DOCX core properties (naive means UTC; default:
    now). With it fixed, the EPUB bytes are identical for identical input.
    """
    key = fmt.strip().lower().lstrip(".")
    if key not in RENDERERS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    book = normalized(book)
    chapters = list(book.chapters) or split_chapters(book.text, words_per_chapter, opening_heading=book.title)
    data = RENDERERS[key](book, chapters, _utc_seconds(modified))
    return data, MEDIA_TYPES[key], f"{slugify(book.title)}.{key}"


def _utc_seconds(moment: datetime | None) -> datetime:
    moment = moment or datetime.now(UTC)
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.replace(microsecond=0)
