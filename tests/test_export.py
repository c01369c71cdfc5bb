"""Tests for bookexport: chapter detection, no text lost, and every export format."""

from __future__ import annotations

import gc
import io
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
import zipfile
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import docx
import pytest

from bookexport import FORMATS, Book, export_book, slugify, split_chapters

FIXED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
OPF_NS = {"opf": "http://www.idpf.org/2007/opf", "dc": "http://purl.org/dc/elements/1.1/"}
XHTML_NS = {"x": "http://www.w3.org/1999/xhtml", "epub": "http://www.idpf.org/2007/ops"}
NCX_NS = {"n": "http://www.daisy.org/z3986/2005/ncx/"}

GUTENBERG = """\
THE STORM AT SEA

A Novel

CHAPTER I. THE HARBOUR

The morning came grey over the harbour. Part of me wanted to stay ashore,
and the captain, who had seen forty winters, said nothing of it.

Book one of the ship's logs lay open on the table.

CHAPTER II.

Chapter 12 of the regulations forbade lamps below deck after dark.

CHAPTER XII. THE STORM

The wind rose at noon.
"""

NESTED = """\
Prologue

Before the beginning there was the sea.

BOOK II

PART ONE

Chapter Twelve

The twelfth chapter begins in the middle.

**Chapter 13**

Bold headings come from chat-tuned models.

Chapter Twenty-One: Homecoming

Home at last.

Epilogue

It ended quietly.
"""

MARKDOWN = """\
# The Lighthouse

## Chapter 1

The keeper climbed the stairs.

### A scene marker stays in the body

## Chapter 2 ##

The lamp went out.
"""

TRICKY = (
    "She wrote \"5 < 6 & 7 > 3\" and signed it 'Zoë'.\n"
    "Café—naïve “quotes” ‘too’ 東京 😀 <b>not bold</b> &amp; stays literal.\n"
)


def words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text)


def chapter_words(chapters: list[tuple[str, str]], with_headings: bool = True) -> list[str]:
    out: list[str] = []
    for heading, body in chapters:
        added = re.search(r" \(\d+\)$", heading)  # a long chapter's later parts repeat its heading
        out += (words(heading) if with_headings and not added else []) + words(body)
    return out


def prose(paragraphs: int, seed: int = 0, words_each: int = 60) -> str:
    """Deterministic filler prose: numbered words make any loss or reordering visible."""
    return "\n\n".join(
        " ".join(f"w{seed}x{p}x{i}" for i in range(words_each)) + "." for p in range(paragraphs)
    )


def make_book(
    text: str = "",
    title: str = "The Storm",
    author: str = "Ann Writer",
    language: str = "en",
    identifier: str | None = None,
) -> Book:
    return Book(title=title, author=author, text=text, language=language, identifier=identifier)


# --------------------------------------------------------------------------------------------------
# Chapter detection
# --------------------------------------------------------------------------------------------------


def test_public_domain_headings_and_front_matter() -> None:
    chapters = split_chapters(GUTENBERG, opening_heading="The Storm at Sea")
    assert [h for h, _ in chapters] == [
        "The Storm at Sea",
        "CHAPTER I. THE HARBOUR",
        "CHAPTER II.",
        "CHAPTER XII. THE STORM",
    ]
    assert chapters[0][1] == "THE STORM AT SEA\n\nA Novel"
    # Prose that starts like a heading ("Part of me", "Book one of", "Chapter 12 of") stays prose.
    assert "Part of me wanted" in chapters[1][1] and "Book one of the ship" in chapters[1][1]
    assert chapters[2][1].startswith("Chapter 12 of the regulations")


def test_books_parts_word_numbers_and_bold_headings() -> None:
    chapters = split_chapters(NESTED)
    assert [h for h, _ in chapters] == [
        "Prologue",
        "BOOK II",
        "PART ONE",
        "Chapter Twelve",
        "Chapter 13",
        "Chapter Twenty-One: Homecoming",
        "Epilogue",
    ]
    assert chapters[1] == ("BOOK II", "")  # a part divider with no text of its own is kept, not dropped
    assert chapters[-1] == ("Epilogue", "It ended quietly.")


def test_markdown_headings() -> None:
    chapters = split_chapters(MARKDOWN)
    assert [h for h, _ in chapters] == ["The Lighthouse", "Chapter 1", "Chapter 2"]
    assert "### A scene marker stays in the body" in chapters[1][1]


def test_roman_numerals_and_crlf() -> None:
    text = "\r\n\r\n".join(f"CHAPTER {r}\r\n\r\nText {r}." for r in ("I", "IV", "IX", "XIV", "XL", "MCMXCIX"))
    assert [h for h, _ in split_chapters(text)] == [
        f"CHAPTER {r}" for r in ("I", "IV", "IX", "XIV", "XL", "MCMXCIX")
    ]
    assert split_chapters("Chapter Did\n\nnot a numeral") == [("Opening", "Chapter Did\n\nnot a numeral")]


def test_no_headings_split_at_paragraph_breaks() -> None:
    text = prose(100, words_each=60)  # 6000 words, 100 paragraphs
    paragraphs = text.split("\n\n")
    chapters = split_chapters(text, words_per_chapter=1000)
    assert [h for h, _ in chapters] == [f"Part {n}" for n in range(1, len(chapters) + 1)]
    assert len(chapters) == 6
    for _, body in chapters:
        assert 500 <= len(words(body)) <= 1500
        assert all(p in paragraphs for p in body.split("\n\n"))  # cut only between paragraphs


def test_no_blank_lines_still_splits_at_sentences() -> None:
    text = " ".join(f"Sentence {i} runs on and on." for i in range(550))  # 3300 words, one paragraph
    chapters = split_chapters(text, words_per_chapter=1000)
    assert len(chapters) == 3
    assert all(body.endswith(".") for _, body in chapters)
    assert words(" ".join(body for _, body in chapters)) == words(text)


def test_short_draft_without_headings_is_one_chapter() -> None:
    assert split_chapters("Just a few words.", opening_heading="My Story") == [
        ("My Story", "Just a few words.")
    ]
    assert split_chapters("  \n\n ") == []


@pytest.mark.parametrize(
    ("text", "with_headings"),
    [
        (GUTENBERG, True),
        (NESTED, True),
        (MARKDOWN, True),
        (TRICKY + "\n\nCHAPTER I\n\n" + TRICKY, True),
        ("Opening words.\r\nCHAPTER 1\r\nBody\rmore\n\n\n\nCHAPTER 2\n" + prose(20, 1), True),
        (prose(130, 2, words_each=47), False),
        (" ".join(f"Sentence {i} runs on." for i in range(900)), False),
    ],
)
def test_no_text_lost_or_reordered(text: str, with_headings: bool) -> None:
    # An empty opening heading adds no words, so the detected chapters must give back exactly the input's.
    chapters = split_chapters(text, words_per_chapter=500, opening_heading="")
    assert chapter_words(chapters, with_headings) == words(text)


def test_bad_words_per_chapter() -> None:
    with pytest.raises(ValueError):
        split_chapters("text", words_per_chapter=0)


# --------------------------------------------------------------------------------------------------
# TXT and Markdown
# --------------------------------------------------------------------------------------------------


def test_txt_export() -> None:
    data, media_type, name = export_book(make_book(GUTENBERG), "txt")
    text = data.decode("utf-8")
    assert media_type.startswith("text/plain") and name == "the-storm.txt"
    assert text.startswith("The Storm\nby Ann Writer\n\n")
    assert "\nCHAPTER XII. THE STORM\n\nThe wind rose at noon.\n" in text
    assert words(text) == words("The Storm by Ann Writer") + words(GUTENBERG)  # the opening: no second title


def test_markdown_export_escapes_line_starts() -> None:
    body = (
        "CHAPTER I\n\n### not a heading\n\n> not a quote\n\n- not a list\n\n1. not a list either\n\n"
        "    not code\n\n---\n\n<div>not html</div>\n\nMid-line # and * and 2. stay as they are."
    )
    data, media_type, name = export_book(make_book(body, title="Odd *Title* #"), "md")
    md = data.decode("utf-8")
    assert media_type.startswith("text/markdown") and name == "odd-title.md"
    assert md.startswith("# Odd \\*Title\\* \\#\n\n*by Ann Writer*\n\n## CHAPTER I\n\n")
    for escaped in (
        "\\### not a heading",
        "\\> not a quote",
        "\\- not a list",
        "1\\. not a list either",
        "\nnot code",
        "\\---",
        "\\<div>not html</div>",
    ):
        assert escaped in md
    assert "Mid-line # and * and 2. stay as they are." in md
    assert not re.search(r"^(#(?!#? )|>|-|\d+\.|    )", md.split("## CHAPTER I")[1], re.M)


def test_markdown_reflows_hard_wrapped_text_and_keeps_verse() -> None:
    wrapped = "\n".join(["The morning came grey over the harbour and the gulls cried out loud."] * 3)
    verse = "Roses are red,\nViolets are blue."
    md = export_book(make_book(f"{wrapped}\n\n{verse}"), "md")[0].decode("utf-8")
    assert " ".join(wrapped.split("\n")) in md  # PG-19-style wrapping is joined into one paragraph
    assert "Roses are red,  \nViolets are blue." in md  # short lines keep a hard break


# --------------------------------------------------------------------------------------------------
# EPUB
# --------------------------------------------------------------------------------------------------


def epub_parts(data: bytes) -> tuple[zipfile.ZipFile, ET.Element]:
    archive = zipfile.ZipFile(io.BytesIO(data))
    container = ET.fromstring(archive.read("META-INF/container.xml"))
    rootfile = container.find(".//{urn:oasis:names:tc:opendocument:xmlns:container}rootfile")
    assert rootfile is not None and rootfile.get("full-path") == "OEBPS/content.opf"
    assert rootfile.get("media-type") == "application/oebps-package+xml"
    return archive, ET.fromstring(archive.read("OEBPS/content.opf"))


def test_epub_container_and_mimetype() -> None:
    data, media_type, name = export_book(make_book(GUTENBERG), "epub", modified=FIXED)
    assert media_type == "application/epub+zip" and name == "the-storm.epub"
    archive, _ = epub_parts(data)
    first = archive.infolist()[0]
    assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
    assert archive.read("mimetype") == b"application/epub+zip"
    # Readers sniff the type at a fixed offset, which only works with no extra field on the first entry.
    assert data[30:58] == b"mimetypeapplication/epub+zip"
    assert archive.testzip() is None


def test_epub_package_lists_every_chapter() -> None:
    book = make_book(GUTENBERG, language="en-GB", identifier="urn:uuid:0f4ad7a2-0000-4000-8000-000000000001")
    archive, opf = epub_parts(export_book(book, "epub", modified=FIXED)[0])
    chapters = split_chapters(GUTENBERG, opening_heading="The Storm")
    assert opf.get("version") == "3.0"
    identifier = opf.find("opf:metadata/dc:identifier", OPF_NS)
    assert identifier is not None and identifier.get("id") == opf.get("unique-identifier")
    assert identifier.text == book.identifier
    assert opf.findtext("opf:metadata/dc:title", namespaces=OPF_NS) == "The Storm"
    assert opf.findtext("opf:metadata/dc:creator", namespaces=OPF_NS) == "Ann Writer"
    assert opf.findtext("opf:metadata/dc:language", namespaces=OPF_NS) == "en-GB"
    assert opf.findtext("opf:metadata/opf:meta[@property='dcterms:modified']", namespaces=OPF_NS) == (
        "2025-01-02T03:04:05Z"
    )

    manifest = {item.get("id"): item for item in opf.findall("opf:manifest/opf:item", OPF_NS)}
    assert all(f"OEBPS/{item.get('href')}" in archive.namelist() for item in manifest.values())
    assert manifest["nav"].get("properties") == "nav"
    spine = opf.find("opf:spine", OPF_NS)
    assert spine is not None and manifest[spine.get("toc")].get("media-type") == "application/x-dtbncx+xml"
    spine_hrefs = [manifest[ref.get("idref")].get("href") for ref in spine.findall("opf:itemref", OPF_NS)]
    chapter_files = [f"chapter-{n:03d}.xhtml" for n in range(1, len(chapters) + 1)]
    assert spine_hrefs == ["title.xhtml", *chapter_files]

    nav = ET.fromstring(archive.read("OEBPS/nav.xhtml"))
    toc = nav.find(".//x:nav[@epub:type='toc']", XHTML_NS)
    assert toc is not None
    links = [(a.get("href"), a.text) for a in toc.findall(".//x:a", XHTML_NS)]
    assert links == list(zip(chapter_files, [h for h, _ in chapters], strict=True))

    ncx = ET.fromstring(archive.read("OEBPS/toc.ncx"))
    assert ncx.find("n:head/n:meta[@name='dtb:uid']", NCX_NS).get("content") == book.identifier
    assert [c.get("src") for c in ncx.findall(".//n:content", NCX_NS)] == chapter_files


def test_epub_xhtml_is_well_formed_and_escaped() -> None:
    tricky = TRICKY.strip()
    text = f"Before the first heading: {tricky}\n\nCHAPTER I. “Café” & <Co>\n\n{tricky}\n\nline\x0cfeed\x00"
    book = make_book(text, title='The <Storm> & "Co"', author="Zoë “Writer”", language="fr")
    archive, _ = epub_parts(export_book(book, "epub", modified=FIXED)[0])
    pages = [n for n in archive.namelist() if n.endswith(".xhtml")]
    assert len(pages) == 4  # nav, title page, opening, chapter I
    for name in pages:
        raw = archive.read(name).decode("utf-8")
        assert raw.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n')
        root = ET.fromstring(raw)  # raises on anything that is not well-formed XML
        assert root.get("{http://www.w3.org/XML/1998/namespace}lang") == "fr"
    chapter = archive.read("OEBPS/chapter-002.xhtml").decode("utf-8")
    assert "5 &lt; 6 &amp; 7 &gt; 3" in chapter and "&lt;b&gt;not bold&lt;/b&gt; &amp;amp; stays" in chapter
    root = ET.fromstring(chapter)
    assert root.findtext(".//x:h2", namespaces=XHTML_NS) == "CHAPTER I. “Café” & <Co>"
    paragraphs = ["".join(p.itertext()) for p in root.iterfind(".//x:p", XHTML_NS)]
    # TRICKY's first line ends a sentence well short of the second's width: two paragraphs. Control
    # characters are dropped.
    assert paragraphs == [*TRICKY.strip().split("\n"), "linefeed"]
    title_page = ET.fromstring(archive.read("OEBPS/title.xhtml"))
    assert "".join(title_page.itertext()).split() == [
        "The",
        "<Storm>",
        "&",
        '"Co"',
        "The",
        "<Storm>",
        "&",
        '"Co"',
        "by",
        "Zoë",
        "“Writer”",
    ]


def test_epub_paragraphs_split_at_blank_lines() -> None:
    """One blank line (spaces or not) parts paragraphs; two are a scene break (reflow.py)."""
    archive, _ = epub_parts(export_book(make_book("CHAPTER I\n\nOne.\n\n\nTwo.\n  \nThree."), "epub")[0])
    root = ET.fromstring(archive.read("OEBPS/chapter-001.xhtml"))
    assert [p.text for p in root.iterfind(".//x:p", XHTML_NS)] == ["One.", "* * *", "Two.", "Three."]


def test_epub_is_deterministic_and_modified_is_utc() -> None:
    book = make_book(NESTED)
    assert export_book(book, "epub", modified=FIXED) == export_book(book, "epub", modified=FIXED)
    plus_one = datetime(2025, 1, 2, 4, 4, 5, 999, tzinfo=timezone(timedelta(hours=1)))
    assert export_book(book, "epub", modified=plus_one) == export_book(book, "epub", modified=FIXED)
    naive = export_book(book, "epub", modified=FIXED.replace(tzinfo=None))[0]
    assert naive == export_book(book, "epub", modified=FIXED)[0]
    _, opf = epub_parts(export_book(book, "epub")[0])  # default: now, still in the required format
    stamp = opf.findtext("opf:metadata/opf:meta[@property='dcterms:modified']", namespaces=OPF_NS)
    assert stamp and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)


def test_generated_identifier_is_stable_per_content() -> None:
    def identifier(book: Book) -> str | None:
        _, opf = epub_parts(export_book(book, "epub", modified=FIXED)[0])
        return opf.findtext("opf:metadata/dc:identifier", namespaces=OPF_NS)

    first = identifier(make_book("Some text."))
    assert first and re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", first)
    assert identifier(make_book("Some text.")) == first
    assert identifier(make_book("Other text.")) != first


# --------------------------------------------------------------------------------------------------
# DOCX
# --------------------------------------------------------------------------------------------------


def test_docx_structure_and_properties() -> None:
    text = GUTENBERG.strip() + "\n\nRoses are red,\nViolets are blue.\n\n" + TRICKY.strip() + "\n\nnull\x00byte"
    data, media_type, name = export_book(make_book(text, language="en-GB"), "docx", modified=FIXED)
    assert media_type.endswith("wordprocessingml.document") and name == "the-storm.docx"
    document = docx.Document(io.BytesIO(data))
    paragraphs = document.paragraphs
    assert (paragraphs[0].style.name, paragraphs[0].text) == ("Title", "The Storm")
    assert (paragraphs[1].style.name, paragraphs[1].text) == ("Subtitle", "by Ann Writer")
    headings = [p for p in paragraphs if p.style.name == "Heading 1"]
    assert [h.text for h in headings] == [  # the opening follows the title page: the title is not printed again
        "CHAPTER I. THE HARBOUR",
        "CHAPTER II.",
        "CHAPTER XII. THE STORM",
    ]
    assert all(h.paragraph_format.page_break_before for h in headings)
    body = [p.text for p in paragraphs if p.style.name == "Normal"]
    assert len(body) == 2 + 2 + 1 + 5  # opening, chapter I, chapter II, chapter XII (+ verse, tricky x2, null)
    assert "Roses are red,\nViolets are blue." in body  # a line break inside one paragraph
    assert body[-3:] == [*TRICKY.strip().split("\n"), "nullbyte"]
    assert [p.text for p in paragraphs].count("The Storm") == 1
    opening = next(p for p in paragraphs if p.style.name == "Normal")
    assert opening.text.startswith("THE STORM AT SEA") and opening.paragraph_format.page_break_before
    props = document.core_properties
    assert (props.title, props.author, props.language) == ("The Storm", "Ann Writer", "en-GB")
    assert props.modified == FIXED and props.comments == ""


def test_a_short_draft_prints_its_title_once_in_docx() -> None:
    """A draft without chapter headings is one piece named after the book: the DOCX printed the title twice."""
    data, _, _ = export_book(make_book("The lamp was lit at dusk.\n\nThe sea rose."), "docx", modified=FIXED)
    texts = [(p.style.name, p.text) for p in docx.Document(io.BytesIO(data)).paragraphs]
    assert texts == [("Title", "The Storm"), ("Subtitle", "by Ann Writer"), ("Normal", "The lamp was lit at dusk."),
                     ("Normal", "The sea rose.")]


# --------------------------------------------------------------------------------------------------
# Formats, defaults and size
# --------------------------------------------------------------------------------------------------


def test_unknown_format_names_the_formats() -> None:
    with pytest.raises(ValueError, match="txt, md, epub, docx"):
        export_book(make_book("x"), "pdf")
    assert export_book(make_book("x"), ".EPUB")[2] == "the-storm.epub"


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_title_and_text_get_defaults(fmt: str) -> None:
    data, _, name = export_book(Book(title="  ", author="", text=""), fmt, modified=FIXED)
    assert name == f"untitled.{fmt}"
    if fmt == "epub":
        archive, opf = epub_parts(data)
        assert opf.findtext("opf:metadata/dc:title", namespaces=OPF_NS) == "Untitled"
        assert opf.find("opf:metadata/dc:creator", OPF_NS) is None  # no author: no empty creator
        assert "OEBPS/chapter-001.xhtml" in archive.namelist()  # spine and TOC are never empty
    elif fmt == "docx":
        assert docx.Document(io.BytesIO(data)).paragraphs[0].text == "Untitled"
    else:
        assert data.decode("utf-8").lstrip("# ").startswith("Untitled\n")


def test_slugify() -> None:
    assert slugify("Café Noir: A Novel") == "cafe-noir-a-novel"
    assert slugify("東京 Story") == "東京-story"
    assert slugify("***") == "untitled"


def cpu_seconds(book: Book, fmt: str) -> float:
    """This process's CPU time for one export, the best of two, without garbage collections: other processes
    on the machine and a collection that happens to land here do not count."""
    gc.collect()
    gc.disable()
    try:
        times = []
        for _ in range(2):
            start = time.process_time()
            assert export_book(book, fmt, modified=FIXED)[0]
            times.append(time.process_time() - start)
        return min(times)
    finally:
        gc.enable()


@pytest.mark.slow
def test_novel_length_export_takes_time_linear_in_the_text() -> None:
    # ~100K tokens is ~400 KB; writers click "export" and wait. Four times the text may take four times as long,
    # not sixteen (a quadratic step would be minutes at novel length); a ratio, so the machine's speed cancels.
    quarter, novel = (make_book(prose(n, 3, words_each=55)) for n in (325, 1300))  # ~780 KB: ~71K long words
    ratios = {fmt: cpu_seconds(novel, fmt) / cpu_seconds(quarter, fmt) for fmt in FORMATS}
    assert all(ratio < 8 for ratio in ratios.values()), ratios


# --------------------------------------------------------------------------------------------------
# epubcheck (Debian/Ubuntu package "epubcheck"; needs Java)
# --------------------------------------------------------------------------------------------------


def epubcheck_command() -> list[str] | None:
    path = shutil.which("epubcheck")
    if path is None:
        return None
    with open(path, "rb") as handle:
        is_jar = handle.read(2) == b"PK"
    if not is_jar:
        return [path]
    # Debian installs the jar itself as /usr/bin/epubcheck and relies on binfmt (jarwrapper), which
    # containers usually lack; run it through java, with a quick-start JIT since the check is short.
    java = shutil.which("java")
    return [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-jar", path] if java else None


@pytest.mark.slow
def test_epubcheck_reports_no_errors(tmp_path: Path) -> None:
    command = epubcheck_command()
    if command is None:
        pytest.skip("epubcheck not installed (Debian/Ubuntu: apt-get install epubcheck)")
    text = f"{TRICKY}\n\n{GUTENBERG}\n\n{NESTED}\n\n{MARKDOWN}\n\nRoses are red,\nViolets are blue."
    book = make_book(text, title='The <Storm> & "Co"', author="Zoë “Writer”", language="fr")
    path = tmp_path / "book.epub"
    path.write_bytes(export_book(book, "epub", modified=FIXED)[0])
    result = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(r"0 fatals / 0 errors", output), output
