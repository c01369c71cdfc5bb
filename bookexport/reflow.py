"""Paragraphs from text as it arrives: hard-wrapped Gutenberg prose, a model's ragged lines, clean paragraphs.

A line break is kept as a paragraph break only when something says the writer meant it: a blank line, an
indented next line, a line that ends a sentence when the next word would still have fitted on it (a
greedy wrap never leaves that room), a sentence end before a line of dialogue, or a sentence end on a
line too long to be a wrap. Every other break is a wrap and becomes a space, so a sentence is never cut
in two. Blocks of only short lines (verse, a letter's address, a list) keep their line breaks.

Two or more blank lines between paragraphs are a scene break (a manuscript's convention, and what the app writes
where an instruction draft's answer ends and the story goes on): an empty Paragraph there, which the formats show
as SCENE_BREAK.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BLANK_LINE = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)*")
SCENE_BREAK = "* * *"
SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]*_]*$")
DIALOGUE = ('"', "“", "‘", "'", "—", "«", "–")
SHORT_LINES = 45  # a block whose lines all stay below this is verse or a list: its lines are kept
LONG_LINE = 100  # no one hard-wraps wider: such a line is a whole paragraph
# Between blank lines, up to this many lines are one wrapped paragraph (Gutenberg's seldom are longer); a
# longer block is text without blank lines (a model's draft) and is split by the signals above.
PARAGRAPH_LINES = 40
SHORT_LAST_LINE = 0.8  # in such a block, a sentence ending before 80% of the width ends a paragraph


@dataclass(frozen=True)
class Paragraph:
    start: int  # offsets into the text, so chapters can cut between paragraphs without losing a character
    end: int
    lines: tuple[str, ...]  # one line for prose; several for verse, shown with line breaks; none: a scene break

    @property
    def scene_break(self) -> bool:
        return not self.lines


def paragraphs(text: str) -> list[Paragraph]:
    """The paragraphs of `text` (newlines normalised to \\n by the caller), in order."""
    found: list[Paragraph] = []
    start = 0
    for gap in [*BLANK_LINE.finditer(text), None]:
        end = gap.start() if gap else len(text)
        found.extend(_block(text[start:end], start))
        start = gap.end() if gap else end
        if gap and gap.group().count("\n") > 2 and found and not found[-1].scene_break and text[start:].strip():
            found.append(Paragraph(gap.start(), gap.start(), ()))
    return found


def reflow_text(text: str) -> str:
    """The text with its paragraphs rejoined, one blank line between them (the app's reading view)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n\n".join("\n".join(p.lines) or SCENE_BREAK for p in paragraphs(text))


def _block(block: str, start: int) -> list[Paragraph]:
    lines, at = [], start
    for raw in block.split("\n"):
        if raw.strip():
            lines.append((at, raw))
        at += len(raw) + 1
    if not lines:
        return []
    if len(lines) > 1 and max(len(raw.strip()) for _, raw in lines) < SHORT_LINES:
        return [Paragraph(_start(lines[0]), _end(lines[-1]), tuple(raw.strip() for _, raw in lines))]
    width = _width([raw for _, raw in lines])
    indent = min(_indent(raw) for _, raw in lines)
    spaced = len(lines) <= PARAGRAPH_LINES
    out, first = [], 0
    for i in range(1, len(lines)):
        if _deliberate(lines[i - 1][1], lines[i][1], width, indent, spaced):
            out.append(_joined(lines[first:i]))
            first = i
    out.append(_joined(lines[first:]))
    return out


def _deliberate(line: str, following: str, width: int, indent: int, spaced: bool) -> bool:
    """Whether the break between these two lines of one block is a paragraph break (module docstring).
    spaced: blank lines mark this text's paragraphs, so inside a block only indentation, an unwrapped line or
    a clearly short line after a sentence adds one."""
    if _indent(following) > indent:
        return True
    text = line.strip()
    if not SENTENCE_END.search(text):
        return False
    nxt = following.strip()
    if len(text) > LONG_LINE:
        return True
    if spaced:  # the last line of a paragraph run together with the next: clearly short, not just ragged
        return len(text) < SHORT_LAST_LINE * width
    return nxt.startswith(DIALOGUE) or len(text) + 1 + len(nxt.split()[0]) <= width


def _width(lines: list[str]) -> int:
    """The wrap width: the longest line that could be a wrap (a stray long line says nothing about it)."""
    wraps = [len(line.strip()) for line in lines if len(line.strip()) <= LONG_LINE]
    return max(wraps) if wraps else LONG_LINE


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _start(line: tuple[int, str]) -> int:
    return line[0] + _indent(line[1])


def _end(line: tuple[int, str]) -> int:
    return line[0] + len(line[1])


def _joined(lines: list[tuple[int, str]]) -> Paragraph:
    return Paragraph(_start(lines[0]), _end(lines[-1]), (" ".join(raw.strip() for _, raw in lines),))
