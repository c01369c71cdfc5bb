"""EPUB 3 (with an NCX for EPUB 2 readers), assembled with the stdlib ``zipfile``: the usual library
(EbookLib) is AGPL."""

from __future__ import annotations

import html
import io
import zipfile
from datetime import datetime

from bookexport.book import Book
from bookexport.reflow import SCENE_BREAK, paragraphs
from bookexport.xmltext import xml_safe

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
h2 + p, .scene + p { text-indent: 0; }
p.scene { text-indent: 0; text-align: center; margin: 1em 0; }
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
    return html.escape(xml_safe(text), quote=True)


def _xhtml(book: Book, title: str, body: str) -> str:
    lang = _x(book.language)
    return _XHTML_HEAD.format(lang=lang, title=_x(title)) + f"<body>\n{body}\n</body>\n</html>\n"


def _chapter_files(count: int) -> list[str]:
    width = max(3, len(str(count)))
    return [f"chapter-{n:0{width}d}.xhtml" for n in range(1, count + 1)]


def render(book: Book, chapters: list[tuple[str, str]], modified: datetime) -> bytes:
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
    paras = "".join(f'<p class="scene">{SCENE_BREAK}</p>\n' if p.scene_break else
                    "<p>" + "<br/>\n".join(_x(line) for line in p.lines) + "</p>\n" for p in paragraphs(body))
    section = f'<section epub:type="chapter">\n<h2>{_x(heading)}</h2>\n{paras}</section>'
    return _xhtml(book, heading, section)
