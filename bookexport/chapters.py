"""Chapters: from headings the draft already has, else (and inside any overlong chapter) about every
`words_per_chapter` words, cut between paragraphs as bookexport.reflow finds them.

No text is lost or reordered: bodies are whitespace-trimmed slices of the input, so the headings taken from
it plus the bodies hold every word, in order.
"""

from __future__ import annotations

import re

from bookexport.reflow import SENTENCE_END, paragraphs

WORDS_PER_CHAPTER = 4000  # a chapter runs 3,000-5,000 words: cuts fall within a quarter of the target

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

# Break kinds before a word, best first: the splitter takes the strongest break near its target.
_PARAGRAPH_BREAK, _SENTENCE_BREAK, _NO_BREAK = 2, 1, 0


def split_chapters(
    text: str, words_per_chapter: int = WORDS_PER_CHAPTER, *, opening_heading: str = "Opening"
) -> list[tuple[str, str]]:
    """(heading, body) pairs. Heading lines ("CHAPTER XII. THE STORM", "Part One", "Prologue", "## The Sea")
    start chapters; text before the first one is called `opening_heading`. A draft without headings is
    cut into "Part 1", "Part 2", ... (one piece only: `opening_heading`); a headed chapter over 1.25x the
    length is cut the same way into "<heading> (2)", "(3)", ... so no chapter swallows the whole book."""
    if words_per_chapter < 1:
        raise ValueError(f"words_per_chapter must be at least 1, got {words_per_chapter}")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    headings = _find_headings(text)
    if not headings:
        pieces = _split_by_words(text, words_per_chapter)
        if len(pieces) == 1:
            return [(opening_heading, pieces[0])]
        return [(f"Part {n}", body) for n, body in enumerate(pieces, 1)]
    chapters = []
    preamble = text[: headings[0][0]].strip()
    if preamble:
        chapters.append((opening_heading, preamble))
    for index, (_, line_end, heading) in enumerate(headings):
        body_end = headings[index + 1][0] if index + 1 < len(headings) else len(text)
        pieces = _split_by_words(text[line_end:body_end], words_per_chapter)
        chapters.append((heading, pieces[0] if pieces else ""))
        chapters.extend((f"{heading} ({n})", body) for n, body in enumerate(pieces[1:], 2))
    return chapters


def heading_of(line: str) -> str | None:
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
    return rest[0].isupper() and not SENTENCE_END.search(rest) and rest[-1] not in ",;"


def _find_headings(text: str) -> list[tuple[int, int, str]]:
    """(line start, line end, heading) for each heading line, in order."""
    found, offset = [], 0
    for line in text.split("\n"):
        end = offset + len(line)
        heading = heading_of(line)
        if heading:
            found.append((offset, end, heading))
        offset = end + 1
    return found


def _split_by_words(text: str, size: int) -> list[str]:
    """The text in pieces of about `size` words (the last one up to 1.5x, so it is never a stub)."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    if not words:
        return []
    kinds = _break_kinds(text, words)
    cuts = [0]  # word indices where pieces start
    while len(words) - cuts[-1] > size * 3 // 2:
        cuts.append(_best_cut(kinds, cuts[-1], size))
    bounds = [words[i][0] for i in cuts] + [len(text)]
    return [text[bounds[n] : bounds[n + 1]].strip() for n in range(len(cuts))]


def _break_kinds(text: str, words: list[tuple[int, int]]) -> list[int]:
    """kinds[i]: how strong a break lies just before word i (paragraph > sentence > none)."""
    kinds = [_NO_BREAK] * len(words)
    starts = {p.start for p in paragraphs(text)}
    for i in range(1, len(words)):
        if words[i][0] in starts:
            kinds[i] = _PARAGRAPH_BREAK
        elif SENTENCE_END.search(text[words[i - 1][0] : words[i - 1][1]]):
            kinds[i] = _SENTENCE_BREAK
    return kinds


def _best_cut(kinds: list[int], start: int, size: int) -> int:
    """Where the next piece starts: the strongest break within a quarter of a piece of the target, the
    nearest on ties, so a draft with no paragraph breaks still splits between sentences."""
    target = start + size
    low, high = start + max(1, size * 3 // 4), min(len(kinds) - 1, start + size + size // 4)
    best, best_key = target, (_NO_BREAK, 0)
    for i in range(low, high + 1):
        key = (kinds[i], -abs(i - target))
        if key > best_key:
            best, best_key = i, key
    return min(best, len(kinds) - 1)
