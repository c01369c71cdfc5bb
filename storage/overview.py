"""What the Library shows of each draft of a book: its kind, its length in words and tokens, and its own first words.

Drafts of one book share their start (a continuation holds its parent's text, a branch and an edit most of it), so
a draft is told apart by what it adds: a new draft, a continuation and a branch by the first words they wrote, an
edit by the first words of the writer's change (after the text it kept as its parent had it). A draft that has
written nothing yet says so rather than repeat the text it starts from.

Mixed into storage.repo.Store (it provides _read), like storage.drafts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.drafts import instruction_of
from storage.models import ChunkRow, GenerationRow
from storage.records import GenerationRecord, from_row

KINDS = {None: "new", "continue": "continuation", "edit": "edit", "branch": "branch", "chapter": "chapter"}
LEAD_WORDS = 8


@dataclass(frozen=True)
class DraftSummary:
    record: GenerationRecord
    kind: str  # "new", "continuation", "edit", "branch" or "chapter" (KINDS)
    words: int  # of its whole text; an instruction draft's story alone
    tokens: int | None  # its prompt's ids and those it wrote; None: an edit that never ran (not tokenized yet)
    own_words: str  # its first words of its own (see the module docstring); "" when it has none yet


class OverviewVerbs:
    def overview(self, session_id: int) -> list[DraftSummary]:
        """The drafts of a book, newest first, as the Library lists them."""
        query = select(GenerationRow).where(GenerationRow.session_id == session_id).order_by(GenerationRow.id.desc())
        with self._read() as s:
            rows = list(s.scalars(query))
            texts = _generated_texts(s, [r.id for r in rows])
            whole = {r.id: r.prompt_text + texts.get(r.id, "") for r in rows}
            out = []
            for row in rows:
                story = whole[row.id][len(instruction_of(row) or ""):]
                tokens = None if row.prompt_ids is None else len(row.prompt_ids) // 4 + row.produced_tokens  # int32
                own = _own_words(row, texts.get(row.id, ""), _parent_text(s, row, whole))
                out.append(DraftSummary(from_row(GenerationRecord, row), KINDS.get(row.origin, row.origin or "new"),
                                        len(story.split()), tokens, own))
            return out


def _generated_texts(s: Session, ids: list[int]) -> dict[int, str]:
    texts: dict[int, str] = {}
    query = select(ChunkRow.generation_id, ChunkRow.text).where(ChunkRow.generation_id.in_(ids))
    for gen_id, text in s.execute(query.order_by(ChunkRow.generation_id, ChunkRow.seq)):
        texts[gen_id] = texts.get(gen_id, "") + text
    return texts


def _parent_text(s: Session, row: GenerationRow, whole: dict[int, str]) -> str | None:
    """An edit's parent's whole text (None for other drafts, or when the parent was deleted)."""
    if row.origin != "edit" or row.parent_id is None:
        return None
    if row.parent_id in whole:
        return whole[row.parent_id]
    parent = s.get(GenerationRow, row.parent_id)
    return None if parent is None else parent.prompt_text + _generated_texts(s, [parent.id]).get(parent.id, "")


def _own_words(row: GenerationRow, generated: str, parent_text: str | None) -> str:
    if row.origin != "edit":  # what it wrote, after any story its prompt holds (an instruction is no story)
        return lead(generated, len(row.prompt_text) > len(instruction_of(row) or ""))
    if parent_text is None:  # the parent is gone: the edit's story is all that is left to tell it by
        return lead(row.prompt_text[len(instruction_of(row) or ""):], False)
    text = row.prompt_text + generated
    same = len(os.path.commonprefix([text, parent_text]))
    if same >= len(text):  # only cut at the end: its last words are its own
        return "…ends “" + " ".join(text.split()[-LEAD_WORDS:]) + "”"
    start = max(text.rfind(" ", 0, same), text.rfind("\n", 0, same)) + 1  # the changed word's start
    return lead(text[start:], start > 0)


def lead(text: str, after: bool) -> str:
    """The first LEAD_WORDS words of `text` ("" for none), with "…" before them when `after` a text they follow
    and after them when more follow."""
    words = text.split()
    if not words:
        return ""
    head = " ".join(words[:LEAD_WORDS]) + ("…" if len(words) > LEAD_WORDS else "")
    return f"…{head}" if after else head
