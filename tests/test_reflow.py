"""Paragraph reflow and chapters on the text writers actually export: hard-wrapped Gutenberg prose (from
../shared), a model's ragged lines without blank lines, and clean paragraphs, which must stay as they are."""

from __future__ import annotations

import io
import json
import lzma
import random
import re
import zipfile

import docx
import pytest
from conftest import BOOKS, need_shared
from docx.enum.text import WD_ALIGN_PARAGRAPH

from bookexport import Book, export_book, paragraphs, reflow_text, split_chapters
from bookexport.reflow import BLANK_LINE, SENTENCE_END


@pytest.fixture(scope="module")
def gutenberg() -> str:
    """60 KB from the middle of the first eval novel, starting at a paragraph."""
    with lzma.open(need_shared(BOOKS) / "eval.jsonl.xz", "rt", encoding="utf-8") as handle:
        text = json.loads(handle.readline())["text"].replace("\r\n", "\n")
    middle = text[200_000:260_000]
    return middle[middle.index("\n\n") + 2 : middle.rindex("\n\n")]


def truth(text: str) -> list[str]:
    """Gutenberg's own paragraphs: blank-line blocks, their wrapped lines joined."""
    return [" ".join(line.strip() for line in b.split("\n") if line.strip()) for b in BLANK_LINE.split(text)
            if b.strip()]


def joined(text: str) -> list[str]:
    return [" ".join(p.lines) for p in paragraphs(text)]


def test_hard_wrapped_gutenberg_becomes_its_paragraphs(gutenberg):
    expected, got = truth(gutenberg), joined(gutenberg)
    assert len(gutenberg.split("\n")) > 3 * len(expected)  # it really is hard-wrapped
    found = set(got)
    assert sum(p in found for p in expected) >= 0.95 * len(expected)
    assert " ".join(got).split() == gutenberg.split()  # nothing lost, nothing reordered


def test_without_blank_lines_breaks_only_at_sentence_ends(gutenberg):
    flat = "\n".join(line for line in gutenberg.split("\n") if line.strip())
    expected, got = truth(gutenberg), joined(flat)
    assert sum(p in set(got) for p in expected) >= 0.7 * len(expected)  # most paragraphs come back whole
    assert len(got) < len(flat.split("\n")) / 4  # no one-line paragraphs
    ends = [p for p in got if SENTENCE_END.search(p) or p.endswith(("”", "’"))]
    assert len(ends) >= 0.97 * len(got)


def test_ragged_model_lines_join_into_sentences(gutenberg):
    # A model trained on hard-wrapped books wraps, but at widths that wander (the issue's
    # "…For your end is many mist my" / "Tetred tennce call; …"): rewrap at random widths, no blank lines.
    rng, words, lines, line = random.Random(3), " ".join(truth(gutenberg)[:40]).split(), [], []
    width = rng.randint(30, 80)
    for word in words:
        if line and len(" ".join([*line, word])) > width:
            lines.append(" ".join(line))
            line, width = [], rng.randint(30, 80)
        line.append(word)
    ragged = "\n".join([*lines, " ".join(line)])
    got = joined(ragged)
    assert " ".join(got).split() == words
    assert len(got) < len(lines) / 3
    assert all(SENTENCE_END.search(p) or p.endswith(("”", "’")) for p in got[:-1])


@pytest.mark.parametrize("text", [
    "The keeper climbed the stairs, counting each one as he went, and the lamp above him hissed in the dark "
    "as it always did.\nShe waited below. The sea was loud that night, louder than he remembered it ever being.",
    "One paragraph.\n\nAnother paragraph, a little longer than the first.\n\n“A line of dialogue,” she said.",
    "Roses are red,\nViolets are blue,\nSugar is sweet.",
])
def test_clean_paragraphs_are_left_alone(text):
    expected = [p for p in re.split(r"\n\n|\n(?=She)", text)]
    assert ["\n".join(p.lines) for p in paragraphs(text)] == expected
    assert reflow_text(text) == "\n\n".join(expected)


def test_a_long_draft_under_one_heading_is_cut_into_chapters():
    # The 12.8K-word draft landed in one chapter: the model had written one heading at its start.
    sentences = [f"Sentence {i} of the long draft goes on for a while." for i in range(1160)]  # 12,760 words
    body = "\n".join(" ".join(sentences[i : i + 3]) for i in range(0, 1160, 3))
    chapters = split_chapters("CHAPTER I.\n\n" + body)
    assert len(chapters) == 3 and chapters[0][0] == "CHAPTER I." and chapters[1][0] == "CHAPTER I. (2)"
    assert all(3000 <= len(b.split()) <= 5000 for _, b in chapters)
    assert all(b.endswith(".") for _, b in chapters)


def test_docx_of_a_hard_wrapped_draft_has_real_paragraphs(gutenberg):
    data, _, _ = export_book(Book("Armadale", "", gutenberg), "docx")
    body = [p.text for p in docx.Document(io.BytesIO(data)).paragraphs if p.style.name == "Normal"]
    assert len(body) >= 0.95 * len(truth(gutenberg)) and all("\n" not in p for p in body)
    assert sum(p in set(body) for p in truth(gutenberg)) >= 0.95 * len(truth(gutenberg))


def test_a_short_wrapped_block_keeps_its_paragraph_ends():
    # No blank lines, a few paragraphs: a sentence that ends well short of the width ends its paragraph.
    text = ("The harbour lay quiet under a low grey sky, and the fishing boats rocked\n"
            "gently at their moorings while the gulls wheeled and cried above the\n"
            "long stone wall of the quay.\n"
            "Old Tom watched them from the doorway of the inn. He had seen forty\n"
            "winters on this coast and did not trust the calm.\n"
            "“There will be weather before night,” he said to no one in particular.")
    lines = text.split("\n")
    assert joined(text) == [" ".join(lines[:3]), " ".join(lines[3:5]), lines[5]]


def test_two_blank_lines_are_a_scene_break_in_every_format():
    """Where an instruction draft's answer ends the app writes a section break (two blank lines): the reading view
    and every format show it, and a single blank line stays a plain paragraph break."""
    text = ("The lamp went out.\n\nShe climbed down in the dark.\n\n\nMorning came grey over the rocks.\n\n\n\n\n"
            "Nobody spoke of it again.\n\n\n")
    got = paragraphs(text)
    assert [p.scene_break for p in got] == [False, False, True, False, True, False]
    assert reflow_text(text).split("\n\n") == ["The lamp went out.", "She climbed down in the dark.", "* * *",
                                               "Morning came grey over the rocks.", "* * *",
                                               "Nobody spoke of it again."]
    book = Book("The Lamp", "", text)
    markdown = export_book(book, "md")[0].decode()
    assert "dark.\n\n* * *\n\nMorning" in markdown and markdown.count("* * *") == 2
    with zipfile.ZipFile(io.BytesIO(export_book(book, "epub")[0])) as epub:
        pages = "".join(epub.read(n).decode() for n in epub.namelist() if n.endswith(".xhtml"))
    assert pages.count('<p class="scene">* * *</p>') == 2
    document = docx.Document(io.BytesIO(export_book(book, "docx")[0]))
    breaks = [p for p in document.paragraphs if p.text == "* * *"]
    assert len(breaks) == 2 and all(p.alignment == WD_ALIGN_PARAGRAPH.CENTER for p in breaks)
