"""Export a draft as the files writers take away: TXT, Markdown, EPUB 3 and DOCX.

EPUB is assembled by hand with the stdlib ``zipfile`` because the usual library (EbookLib) is AGPL; DOCX
uses python-docx (MIT). Every format is built from the same chapter split, so the TOC a writer sees in an
e-reader matches the headings in Word and in the Markdown backup.
"""

from __future__ import annotations

import hashlib
import html
import io
import re
import unicodedata
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docx.opc.coreprops import CoreProperties

FORMATS = ("txt", "md", "epub", "docx")

MEDIA_TYPES = {
    "txt": "text/plain; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
    "epub": "application/epub+zip",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}

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


# --------------------------------------------------------------------------------------------------
# Chapter detection
# --------------------------------------------------------------------------------------------------

_CARDINALS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
    "seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred"
)
_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|last"
)
_WORD_NUMBER = rf"(?:{_CARDINALS})(?:[ -](?:{_CARDINALS}))*"  # "Twenty-One", "One Hundred"
_ORDINAL = rf"(?:the\s+)?(?:{_ORDINALS})"  # "Chapter the First" (Dickens, Thackeray)
# A strict roman numeral, so that words such as "Did" or "Mild" never pass for one; the lookbehind stops
# the all-optional pattern from matching nothing (which would make "Chapter Did" a heading).
_ROMAN = r"m{0,4}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})(?<=[ivxlcdm])"
_NUMBERED_HEADING = re.compile(
    rf"(?:chapter|book|part|volume)\s+(?:\d{{1,4}}|{_ROMAN}|{_WORD_NUMBER}|{_ORDINAL})\b(?P<rest>.*)",
    re.IGNORECASE,
)
_NAMED_HEADING = re.compile(r"(?:prologue|epilogue|interlude|afterword|foreword|preface)\b(?P<rest>.*)", re.I)
_MARKDOWN_HEADING = re.compile(r"#{1,2}[ \t]+(?P<text>.+?)(?:[ \t]+#+)?[ \t]*")
_EMPHASIS_WRAP = re.compile(r"(\*\*|__|\*|_)(?P<inner>.+)\1")
_MAX_HEADING_CHARS = 100
_TITLE_SEPARATORS = ".:—–-"  # "CHAPTER XII. THE STORM", "Chapter 3: Ashes", "PART I — THE SEA"
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*$")

# Break kinds between two words, best first: the word-count splitter prefers the strongest nearby break.
_PARAGRAPH_BREAK, _LINE_BREAK, _SENTENCE_BREAK, _NO_BREAK = 3, 2, 1, 0


def _heading_of(line: str) -> str | None:
    """The chapter heading a line stands for, or None when the line is ordinary prose."""
    stripped = line.strip()
    if not stripped or len(stripped) > _MAX_HEADING_CHARS:
        return None
    md = _MARKDOWN_HEADING.fullmatch(stripped)
    if md:
        return md.group("text").strip()
    # LLM drafts often bold their headings ("**Chapter 2**"); the markers are not part of the heading.
    wrapped = _EMPHASIS_WRAP.fullmatch(stripped)
    candidate = wrapped.group("inner").strip() if wrapped else stripped
    for pattern in (_NUMBERED_HEADING, _NAMED_HEADING):
        match = pattern.fullmatch(candidate)
        if match and _looks_like_title(match.group("rest")):
            return candidate
    return None


def _looks_like_title(rest: str) -> bool:
    """Whether what follows "Chapter 12" is a chapter title rather than the rest of a sentence."""
    rest = rest.strip()
    if not rest or rest[0] in _TITLE_SEPARATORS:
        return True
    # "Part Two The Return" is a heading; "Book one of them lay open." is prose.
    return rest[0].isupper() and not _SENTENCE_END.search(rest) and rest[-1] not in ",;"


def _find_headings(text: str) -> list[tuple[int, int, str]]:
    """(line start, line end, heading) for each heading line, in order."""
    found = []
    offset = 0
    for line in text.split("\n"):
        end = offset + len(line)
        heading = _heading_of(line)
        if heading:
            found.append((offset, end, heading))
        offset = end + 1
    return found


def split_chapters(
    text: str, words_per_chapter: int = 3000, *, opening_heading: str = "Opening"
) -> list[tuple[str, str]]:
    """Split a draft into (heading, body) pairs without losing or reordering any text.

    Heading lines ("CHAPTER XII. THE STORM", "Part One", "Prologue", "## The Sea") start chapters; text
    before the first one becomes a chapter called ``opening_heading``. A draft without headings is cut
    about every ``words_per_chapter`` words at the nearest paragraph break into "Part 1", "Part 2", ...
    (one chunk only: ``opening_heading``). Bodies are whitespace-trimmed slices of the input, so the
    headings taken from the input plus the bodies hold every word of it, in order.
    """
    if words_per_chapter < 1:
        raise ValueError(f"words_per_chapter must be at least 1, got {words_per_chapter}")
    text = _normalize_newlines(text)
    headings = _find_headings(text)
    if not headings:
        return _split_by_words(text, words_per_chapter, opening_heading)
    chapters = []
    preamble = text[: headings[0][0]].strip()
    if preamble:
        chapters.append((opening_heading, preamble))
    for index, (_, line_end, heading) in enumerate(headings):
        body_end = headings[index + 1][0] if index + 1 < len(headings) else len(text)
        chapters.append((heading, text[line_end:body_end].strip()))
    return chapters


def _split_by_words(text: str, words_per_chapter: int, single_heading: str) -> list[tuple[str, str]]:
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    if not words:
        return []
    kinds = _break_kinds(text, words)
    cuts = [0]  # word indices where chunks start
    # Leave the remainder whole when it is under 1.5 chunks, so the last chapter is never a stub.
    while len(words) - cuts[-1] > words_per_chapter * 3 // 2:
        cuts.append(_best_cut(kinds, cuts[-1], words_per_chapter))
    if len(cuts) == 1:
        return [(single_heading, text.strip())]
    bounds = [words[i][0] for i in cuts] + [len(text)]
    return [(f"Part {n}", text[bounds[n - 1] : bounds[n]].strip()) for n in range(1, len(bounds))]


def _break_kinds(text: str, words: list[tuple[int, int]]) -> list[int]:
    """kinds[i]: how strong a break lies just before word i (paragraph > line > sentence > none)."""
    kinds = [_NO_BREAK] * len(words)
    for i in range(1, len(words)):
        gap = text[words[i - 1][1] : words[i][0]]
        newlines = gap.count("\n")
        if newlines >= 2:
            kinds[i] = _PARAGRAPH_BREAK
        elif newlines == 1:
            kinds[i] = _LINE_BREAK
        elif _SENTENCE_END.search(text[words[i - 1][0] : words[i - 1][1]]):
            kinds[i] = _SENTENCE_BREAK
    return kinds


def _best_cut(kinds: list[int], start: int, size: int) -> int:
    """The word index to start the next chunk: the strongest break within half a chunk of the target,
    the nearest one on ties, so a draft with no blank lines still splits at lines or sentences."""
    target = start + size
    low, high = start + max(1, size // 2), min(len(kinds) - 1, start + size + size // 2)
    best, best_key = target, (_NO_BREAK, 0)
    for i in range(low, high + 1):
        key = (kinds[i], -abs(i - target))
        if key > best_key:
            best, best_key = i, key
    return min(best, len(kinds) - 1)


# --------------------------------------------------------------------------------------------------
# Paragraph structure shared by the rendered formats (MD, EPUB, DOCX)
# --------------------------------------------------------------------------------------------------

_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_HARD_WRAP_MIN, _HARD_WRAP_MAX = 45, 80
_LONG_LINE = 100


def _paragraphs(body: str) -> list[list[str]]:
    """Paragraphs split at blank lines, each a list of lines to show with line breaks between them."""
    paragraphs: list[list[str]] = []
    for block in _BLANK_LINE.split(body):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if _is_hard_wrapped(lines):
            # PG-19-style text (what TokenSwift is benchmarked on) wraps at ~70 columns; reflow it.
            paragraphs.append([" ".join(lines)])
        elif max(len(line) for line in lines) > _LONG_LINE:
            # Prose with one newline between paragraphs: every line is a paragraph of its own.
            paragraphs.extend([line] for line in lines)
        else:
            paragraphs.append(lines)  # verse, letters, addresses: keep the line breaks
    return paragraphs


def _is_hard_wrapped(lines: list[str]) -> bool:
    return len(lines) > 1 and all(_HARD_WRAP_MIN <= len(line) <= _HARD_WRAP_MAX for line in lines[:-1])


# --------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------


def export_book(
    book: Book, fmt: str, words_per_chapter: int = 3000, *, modified: datetime | None = None
) -> tuple[bytes, str, str]:
    """Render ``book`` as ``fmt`` and return (data, media type, suggested file name).

    ``modified`` stamps EPUB ``dcterms:modified`` and the DOCX core properties (naive means UTC; default:
    now). With it fixed, the EPUB bytes are identical for identical input.
    """
    key = fmt.strip().lower().lstrip(".")
    renderers: dict[str, Callable[[Book, list[tuple[str, str]], datetime], bytes]] = {
        "txt": _render_txt,
        "md": _render_md,
        "epub": _render_epub,
        "docx": _render_docx,
    }
    if key not in renderers:
        raise ValueError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    book = _normalized(book)
    chapters = split_chapters(book.text, words_per_chapter, opening_heading=book.title)
    stamp = _utc_seconds(modified)
    data = renderers[key](book, chapters, stamp)
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


# Characters XML 1.0 forbids (and python-docx rejects); tokenizers occasionally emit them.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _XML_INVALID.sub("", text)


# --------------------------------------------------------------------------------------------------
# TXT and Markdown
# --------------------------------------------------------------------------------------------------


def _render_txt(book: Book, chapters: list[tuple[str, str]], _: datetime) -> bytes:
    # Plain text is the backup format: bodies go out verbatim, never reflowed.
    parts = [book.title]
    if book.author:
        parts.append(f"by {book.author}")
    out = "\n".join(parts) + "\n\n"
    out += "".join(f"\n{heading}\n\n{body}\n\n" for heading, body in chapters)
    return out.rstrip("\n").encode("utf-8") + b"\n"


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


def _render_md(book: Book, chapters: list[tuple[str, str]], _: datetime) -> bytes:
    blocks = [f"# {_md_inline(book.title)}"]
    if book.author:
        blocks.append(f"*by {_md_inline(book.author)}*")
    for heading, body in chapters:
        blocks.append(f"## {_md_inline(heading)}")
        # Two trailing spaces are Markdown's hard line break, kept for verse and letters.
        blocks.extend("  \n".join(_md_line(line) for line in lines) for lines in _paragraphs(body))
    return ("\n\n".join(blocks) + "\n").encode("utf-8")


# --------------------------------------------------------------------------------------------------
# EPUB 3 (with an NCX for EPUB 2 readers)
# --------------------------------------------------------------------------------------------------

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times keep the archive byte-for-byte reproducible
_XHTML_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n'
    '<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" '
    'xml:lang="{lang}" lang="{lang}">\n<head>\n<title>{title}</title>\n'
    '<link rel="stylesheet" type="text/css" href="style.css"/>\n</head>\n'
)
_CSS = """\
body { margin: 0 5%; line-height: 1.5; }
h1, h2 { text-align: center; font-weight: normal; margin: 2em 0 1.5em; }
p { margin: 0; text-indent: 1.5em; }
h2 + p { text-indent: 0; }
.titlepage { text-align: center; margin-top: 30%; }
.titlepage p { text-indent: 0; font-style: italic; }
nav ol { list-style: none; padding: 0; }
"""
_CONTAINER_XML = """\
<?xml version="1.0" encoding="UTF-8"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles>
    <rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>
  </rootfiles>
</container>
"""


def _x(text: str) -> str:
    """XML-escape text or an attribute value (quotes included), dropping characters XML cannot hold."""
    return html.escape(_xml_safe(text), quote=True)


def _xhtml(book: Book, title: str, body: str) -> str:
    lang = _x(book.language)
    return _XHTML_HEAD.format(lang=lang, title=_x(title)) + f"<body>\n{body}\n</body>\n</html>\n"


def _chapter_files(count: int) -> list[str]:
    width = max(3, len(str(count)))
    return [f"chapter-{n:0{width}d}.xhtml" for n in range(1, count + 1)]


def _render_epub(book: Book, chapters: list[tuple[str, str]], modified: datetime) -> bytes:
    # A book always has at least one chapter file, so the spine and the TOC are never empty.
    chapters = [(heading or f"Chapter {n}", body) for n, (heading, body) in enumerate(chapters, 1)]
    chapters = chapters or [(book.title, "")]
    files = _chapter_files(len(chapters))
    entries = [
        ("META-INF/container.xml", _CONTAINER_XML),
        ("OEBPS/content.opf", _opf(book, files, modified)),
        ("OEBPS/nav.xhtml", _nav(book, chapters, files)),
        ("OEBPS/toc.ncx", _ncx(book, chapters, files)),
        ("OEBPS/style.css", _CSS),
        ("OEBPS/title.xhtml", _title_page(book)),
    ]
    entries += [(f"OEBPS/{name}", _chapter_xhtml(book, ch)) for name, ch in zip(files, chapters, strict=True)]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        # The OCF spec requires "mimetype" first, uncompressed, so readers can sniff the type at offset 38.
        _write_entry(archive, "mimetype", "application/epub+zip", zipfile.ZIP_STORED)
        for name, content in entries:
            _write_entry(archive, name, content, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def _write_entry(archive: zipfile.ZipFile, name: str, content: str, compression: int) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
    info.compress_type = compression
    info.create_system = 3  # the default depends on the OS building the file; pin it for reproducibility
    info.external_attr = 0o644 << 16
    archive.writestr(info, content.encode("utf-8"))


def _opf(book: Book, files: list[str], modified: datetime) -> str:
    creator = f'    <dc:creator id="creator">{_x(book.author)}</dc:creator>\n' if book.author else ""
    items = "".join(
        f'    <item id="{name[:-6]}" href="{name}" media-type="application/xhtml+xml"/>\n' for name in files
    )
    itemrefs = "".join(f'    <itemref idref="{name[:-6]}"/>\n' for name in files)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="book-id" '
        f'xml:lang="{_x(book.language)}">\n'
        '  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">\n'
        f'    <dc:identifier id="book-id">{_x(book.identifier or "")}</dc:identifier>\n'
        f"    <dc:title>{_x(book.title)}</dc:title>\n"
        f"{creator}"
        f"    <dc:language>{_x(book.language)}</dc:language>\n"
        f'    <meta property="dcterms:modified">{modified.strftime("%Y-%m-%dT%H:%M:%SZ")}</meta>\n'
        "  </metadata>\n"
        "  <manifest>\n"
        '    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>\n'
        '    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>\n'
        '    <item id="css" href="style.css" media-type="text/css"/>\n'
        '    <item id="title-page" href="title.xhtml" media-type="application/xhtml+xml"/>\n'
        f"{items}"
        "  </manifest>\n"
        '  <spine toc="ncx">\n'
        '    <itemref idref="title-page"/>\n'
        f"{itemrefs}"
        "  </spine>\n"
        "</package>\n"
    )


def _nav(book: Book, chapters: list[tuple[str, str]], files: list[str]) -> str:
    links = "".join(
        f'<li><a href="{name}">{_x(heading)}</a></li>\n'
        for name, (heading, _) in zip(files, chapters, strict=True)
    )
    body = f'<nav epub:type="toc" id="toc">\n<h1>Contents</h1>\n<ol>\n{links}</ol>\n</nav>'
    return _xhtml(book, "Contents", body)


def _ncx(book: Book, chapters: list[tuple[str, str]], files: list[str]) -> str:
    points = "".join(
        f'    <navPoint id="nav-{n}" playOrder="{n}"><navLabel><text>{_x(heading)}</text></navLabel>'
        f'<content src="{name}"/></navPoint>\n'
        for n, (name, (heading, _)) in enumerate(zip(files, chapters, strict=True), 1)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1" '
        f'xml:lang="{_x(book.language)}">\n'
        "  <head>\n"
        # EPUB 2 readers match the NCX to the book by this uid, so it must equal dc:identifier.
        f'    <meta name="dtb:uid" content="{_x(book.identifier or "")}"/>\n'
        '    <meta name="dtb:depth" content="1"/>\n'
        '    <meta name="dtb:totalPageCount" content="0"/>\n'
        '    <meta name="dtb:maxPageNumber" content="0"/>\n'
        "  </head>\n"
        f"  <docTitle><text>{_x(book.title)}</text></docTitle>\n"
        f"  <navMap>\n{points}  </navMap>\n"
        "</ncx>\n"
    )


def _title_page(book: Book) -> str:
    author = f"\n<p>by {_x(book.author)}</p>" if book.author else ""
    body = f'<section class="titlepage" epub:type="titlepage">\n<h1>{_x(book.title)}</h1>{author}\n</section>'
    return _xhtml(book, book.title, body)


def _chapter_xhtml(book: Book, chapter: tuple[str, str]) -> str:
    heading, body = chapter
    paragraphs = "".join(
        "<p>" + "<br/>\n".join(_x(line) for line in lines) + "</p>\n" for lines in _paragraphs(body)
    )
    section = f'<section epub:type="chapter">\n<h2>{_x(heading)}</h2>\n{paragraphs}</section>'
    return _xhtml(book, heading, section)


# --------------------------------------------------------------------------------------------------
# DOCX
# --------------------------------------------------------------------------------------------------


def _render_docx(book: Book, chapters: list[tuple[str, str]], modified: datetime) -> bytes:
    import docx  # imported here so TXT/MD/EPUB export works even where python-docx is missing
    from docx.enum.text import WD_BREAK

    document = docx.Document()
    _set_core_properties(document.core_properties, book, modified)
    document.add_heading(_xml_safe(book.title), level=0)
    if book.author:
        document.add_paragraph(f"by {_xml_safe(book.author)}", style="Subtitle")
    for heading, body in chapters:
        # page_break_before keeps chapter openings on a new page without empty break paragraphs.
        document.add_heading(_xml_safe(heading), level=1).paragraph_format.page_break_before = True
        for lines in _paragraphs(body):
            paragraph = document.add_paragraph()
            for index, line in enumerate(lines):
                run = paragraph.add_run(_xml_safe(line))
                if index + 1 < len(lines):
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
        setattr(props, name, _xml_safe(value) if isinstance(value, str) else value)
