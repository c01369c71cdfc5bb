"""A book's plan: its premise, its characters and its ordered chapters (a title and beats each), and which draft is
each chapter's text. How a chapter's draft is asked for (what the model sees) is ui/drafts/plan_drafts.py's; queueing it
is Store.enqueue_generation(chapter_id=); a chapter follows its draft's edits and continuations
(storage/chapter_links.py).

Chapters are numbered by position, 1..n without gaps: adding, moving and deleting renumber the rest.

Mixed into storage.repo.Store (it provides _read/_write), like storage.drafts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from storage.drafts import instruction_of
from storage.errors import NotFound
from storage.models import BOOK, ChapterRow, CharacterRow, ChunkRow, GenerationRow, SessionRow
from storage.records import SessionRecord, from_row, in_sql_range, utcnow


@dataclass(frozen=True)
class Character:
    name: str
    description: str
    keys: tuple[str, ...] = ()  # key words besides its name that bring it into the model's view


@dataclass(frozen=True)
class Chapter:
    id: int
    position: int  # its number in the book, from 1
    title: str
    beats: tuple[str, ...]
    draft_id: int | None  # the draft that is its text; None: not written
    status: str | None = None  # its draft's ("queued", "running", "paused", "done", ...); None: not written
    story: str = ""  # its draft's whole text (an instruction draft's story alone)


@dataclass(frozen=True)
class Plan:
    book: SessionRecord
    premise: str
    characters: tuple[Character, ...]
    chapters: tuple[Chapter, ...]


class PlanVerbs:
    def plan(self, session_id: int) -> Plan:
        """The book's plan, each chapter with its draft's status and story."""
        with self._read() as s:
            book = _book(s, session_id)
            rows = s.scalars(select(CharacterRow).where(CharacterRow.session_id == session_id)
                             .order_by(CharacterRow.position))
            characters = tuple(Character(r.name, r.description, tuple(json.loads(r.keys))) for r in rows)
            chapters = tuple(_chapter(s, r) for r in _chapter_rows(s, session_id))
            return Plan(from_row(SessionRecord, book), book.premise, characters, chapters)

    def set_premise(self, session_id: int, premise: str) -> None:
        with self._write() as s:
            book = _book(s, session_id)
            book.premise, book.updated_at = premise, utcnow()

    def set_characters(self, session_id: int, characters: Sequence[Character]) -> None:
        """Replace the book's characters with `characters`, in that order."""
        with self._write() as s:
            _book(s, session_id).updated_at = utcnow()
            s.execute(delete(CharacterRow).where(CharacterRow.session_id == session_id))
            s.add_all(CharacterRow(session_id=session_id, position=n, name=c.name, description=c.description,
                                   keys=json.dumps(list(c.keys), ensure_ascii=False))
                      for n, c in enumerate(characters, 1))

    def add_chapter(self, session_id: int, title: str, beats: Sequence[str] = (),
                    position: int | None = None) -> Chapter:
        """A new chapter at `position` (1: first; None or past the end: last); those from there move down one."""
        with self._write() as s:
            _book(s, session_id).updated_at = utcnow()
            rows = _chapter_rows(s, session_id)
            at = len(rows) if position is None else min(max(position, 1) - 1, len(rows))
            row = ChapterRow(session_id=session_id, position=0, title=title,
                             beats=json.dumps(list(beats), ensure_ascii=False), draft_id=None)
            s.add(row)
            _renumber(rows[:at] + [row] + rows[at:])
            s.flush()
            return _chapter(s, row)

    def edit_chapter(self, chapter_id: int, title: str | None = None,
                     beats: Sequence[str] | None = None) -> Chapter:
        """Its title and beats (None: left as they are); its draft stays its text until it is written again."""
        with self._write() as s:
            row = _chapter_row(s, chapter_id)
            row.title = row.title if title is None else title
            row.beats = row.beats if beats is None else json.dumps(list(beats), ensure_ascii=False)
            s.flush()
            return _chapter(s, row)

    def move_chapter(self, chapter_id: int, position: int) -> Chapter:
        """Move the chapter to `position` (clamped to 1..n); the others keep their order around it."""
        with self._write() as s:
            row = _chapter_row(s, chapter_id)
            rows = [r for r in _chapter_rows(s, row.session_id) if r.id != row.id]
            at = min(max(position, 1) - 1, len(rows))
            _renumber(rows[:at] + [row] + rows[at:])
            s.flush()
            return _chapter(s, row)

    def delete_chapter(self, chapter_id: int) -> None:
        """The chapter leaves the plan; its drafts stay in the book (the Library lists them)."""
        with self._write() as s:
            row = _chapter_row(s, chapter_id)
            session_id = row.session_id
            s.delete(row)
            s.flush()
            _renumber(_chapter_rows(s, session_id))

    def choose_chapter_draft(self, chapter_id: int, gen_id: int | None) -> Chapter:
        """Make draft `gen_id` (one of the book's) the chapter's text; None: the chapter is not written."""
        with self._write() as s:
            row = _chapter_row(s, chapter_id)
            if gen_id is not None:
                draft = s.get(GenerationRow, gen_id) if in_sql_range(gen_id) else None
                if draft is None or draft.session_id != row.session_id:
                    raise NotFound("draft of this book", gen_id)
            row.draft_id = gen_id
            s.flush()
            return _chapter(s, row)

    def chapter(self, chapter_id: int) -> tuple[int, Chapter]:
        """(its book's id, the chapter)."""
        with self._read() as s:
            row = _chapter_row(s, chapter_id)
            return row.session_id, _chapter(s, row)


def _book(s: Session, session_id: int) -> SessionRow:
    row = s.get(SessionRow, session_id) if in_sql_range(session_id) else None
    if row is None or row.kind != BOOK:
        raise NotFound("book", session_id)
    return row


def _chapter_row(s: Session, chapter_id: int) -> ChapterRow:
    row = s.get(ChapterRow, chapter_id, with_for_update=True) if in_sql_range(chapter_id) else None
    if row is None:
        raise NotFound("chapter", chapter_id)
    return row


def _chapter_rows(s: Session, session_id: int) -> list[ChapterRow]:
    query = select(ChapterRow).where(ChapterRow.session_id == session_id)
    return list(s.scalars(query.order_by(ChapterRow.position, ChapterRow.id)))


def _renumber(rows: list[ChapterRow]) -> None:
    for n, row in enumerate(rows, 1):
        row.position = n


def _chapter(s: Session, row: ChapterRow) -> Chapter:
    draft = s.get(GenerationRow, row.draft_id) if row.draft_id is not None else None
    status, story = None, ""
    if draft is not None:
        status, story = draft.status, _story(s, draft)
    return Chapter(row.id, row.position, row.title, tuple(json.loads(row.beats)), row.draft_id, status, story)


def _story(s: Session, draft: GenerationRow) -> str:
    query = select(ChunkRow.text).where(ChunkRow.generation_id == draft.id).order_by(ChunkRow.seq)
    whole = draft.prompt_text + "".join(s.scalars(query))
    return whole[len(instruction_of(draft) or ""):]
