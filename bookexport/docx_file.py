"""DOCX through python-docx (MIT): a title page, one Heading 1 per chapter on a new page, real paragraphs."""

from __future__ import annotations

import io
from datetime import datetime
from typing import TYPE_CHECKING

from bookexport.book import Book
from bookexport.reflow import SCENE_BREAK, paragraphs
from bookexport.text_formats import headed
from bookexport.xmltext import xml_safe

if TYPE_CHECKING:
    from docx.opc.coreprops import CoreProperties


def render(book: Book, chapters: list[tuple[str, str]], modified: datetime) -> bytes:
    import docx  # imported here so TXT/MD/EPUB export works even where python-docx is missing
    from docx.enum.text import WD_ALIGN_PARAGRAPH, WD_BREAK

    document = docx.Document()
    _set_core_properties(document.core_properties, book, modified)
    document.add_heading(xml_safe(book.title), level=0)
    if book.author:
        document.add_paragraph(f"by {xml_safe(book.author)}", style="Subtitle")
    for heading, body in headed(book, chapters):
        # page_break_before keeps chapter openings on a new page without empty break paragraphs; an opening named
        # after the book has no heading (the title page above has the title) and starts the page with its text.
        if heading is not None:
            document.add_heading(xml_safe(heading), level=1).paragraph_format.page_break_before = True
        for index, p in enumerate(paragraphs(body)):
            paragraph = document.add_paragraph()
            paragraph.paragraph_format.page_break_before = heading is None and index == 0
            if p.scene_break:
                paragraph.add_run(SCENE_BREAK)
                paragraph.alignment = WD_ALIGN_PARAGRAPH.CENTER
            for index, line in enumerate(p.lines):
                run = paragraph.add_run(xml_safe(line))
                if index + 1 < len(p.lines):
                    run.add_break(WD_BREAK.LINE)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def _set_core_properties(props: CoreProperties, book: Book, modified: datetime) -> None:
    # python-docx's template ships its own author and comments ("python-docx"); replace them all.
    values = {
        "title": book.title,
        "author": book.author,
        "last_modified_by": book.author,
        "language": book.language,
        "identifier": book.identifier or "",
        "comments": "",
        "subject": "",
        "keywords": "",
        "revision": 1,
        "created": modified.replace(tzinfo=None),
        "modified": modified.replace(tzinfo=None),
    }
    for name, value in values.items():
        setattr(props, name, xml_safe(value) if isinstance(value, str) else value)
