"""Export a draft as the files writers take away: TXT, Markdown, EPUB 3 and DOCX.

reflow (paragraphs from hard-wrapped or ragged lines) · chapters (headings, else every ~4,000 words) ·
book (the record) · export (the entry point) · one module per format: text_formats (TXT, Markdown), epub, docx_file.
"""

from bookexport.book import Book, slugify
from bookexport.chapters import split_chapters
from bookexport.export import FORMATS, MEDIA_TYPES, export_book
from bookexport.reflow import SCENE_BREAK, paragraphs, reflow_text

__all__ = ["FORMATS", "MEDIA_TYPES", "SCENE_BREAK", "Book", "export_book", "paragraphs", "reflow_text", "slugify",
           "split_chapters"]
