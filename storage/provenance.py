"""Who wrote which part of a draft: spans of (source, characters) over its text, in order.

Sources: "opening" (what the writer started with), "ai" (the model's text; every chunk the worker
appends) and "edit" (what the writer changed). A draft's prompt carries its spans in
GenerationRow.prompt_sources; its chunks are "ai". An edit keeps the sources of every character it did
not touch, so a writer can always see what the model wrote and what they did.
"""

from __future__ import annotations

import difflib
import json
import re

OPENING, MODEL, EDIT = "opening", "ai", "edit"
Spans = list[tuple[str, int]]
# Words, spaces and each punctuation mark apart: a word changed is marked alone, never with the comma after it
# or the words around it.
WORD = re.compile(r"\s+|\w+|[^\w\s]")


def parse(stored: str | None, prompt_text: str) -> Spans:
    """The spans of a prompt (None stored: all of it is the writer's opening)."""
    if stored is None:
        return [(OPENING, len(prompt_text))] if prompt_text else []
    return [(source, int(n)) for source, n in json.loads(stored)]


def dump(spans: Spans) -> str:
    return json.dumps([[source, n] for source, n in spans])


def append(spans: Spans, source: str, chars: int) -> Spans:
    """spans + chars of source, merged into the last span when it has the same source."""
    if chars <= 0:
        return list(spans)
    if spans and spans[-1][0] == source:
        return [*spans[:-1], (source, spans[-1][1] + chars)]
    return [*spans, (source, chars)]


def pieces(text: str, spans: Spans) -> list[tuple[str, str]]:
    """(source, text) for each span; text beyond the spans (should there be any) counts as the model's."""
    out, at = [], 0
    for source, n in spans:
        if n > 0 and at < len(text):
            out.append((source, text[at : at + n]))
            at += n
    if at < len(text):
        out.append((MODEL, text[at:]))
    return out


def after_edit(old_text: str, old_spans: Spans, new_text: str) -> Spans:
    """The spans of new_text: characters kept from old_text keep their source, the rest are the writer's.
    Lines are matched first (fast on a 400 KB book), then words inside each changed run of lines."""
    old_sources = [source for source, text in pieces(old_text, old_spans) for _ in text]
    old_lines, new_lines = old_text.splitlines(keepends=True), new_text.splitlines(keepends=True)
    old_at, new_at = _offsets(old_lines), _offsets(new_lines)
    spans: Spans = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        old_part, new_part = old_text[old_at[i1] : old_at[i2]], new_text[new_at[j1] : new_at[j2]]
        kept = old_sources[old_at[i1] : old_at[i2]]
        if tag == "equal":
            for source in kept:
                spans = append(spans, source, 1)
        elif tag != "delete":
            spans = _changed(spans, old_part, kept, new_part)
    return spans


def _changed(spans: Spans, old: str, old_sources: list[str], new: str) -> Spans:
    """A changed run of lines, matched word by word: words kept keep their sources, the rest are the writer's."""
    old_words, new_words = WORD.findall(old), WORD.findall(new)
    old_at = _offsets(old_words)
    matcher = difflib.SequenceMatcher(None, old_words, new_words, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for source in old_sources[old_at[i1] : old_at[i2]]:
                spans = append(spans, source, 1)
        elif tag != "delete":
            spans = append(spans, EDIT, sum(len(w) for w in new_words[j1:j2]))
    return spans


def _offsets(lines: list[str]) -> list[int]:
    out = [0]
    for line in lines:
        out.append(out[-1] + len(line))
    return out
