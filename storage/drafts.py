"""Store verbs for the writer's side: editing a draft (as a new revision), who wrote what, and finding the
draft and book a writer was last working on from any browser.

Mixed into storage.repo.Store (it provides _read/_write), like storage.workers.
"""

from __future__ import annotations

import json

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import provenance
from storage.branches import generated_ids
from storage.chapter_links import follow_chapter
from storage.errors import Conflict, NotFound
from storage.models import BOOK, ChunkRow, GenerationRow, SessionRow
from storage.records import EditBase, GenerationRecord, from_row, unpack_ids, utcnow

UNFINISHED = ("running", "queued", "paused")


class DraftVerbs:
    def save_edit(self, gen_id: int, text: str) -> GenerationRecord:
        """The writer's version of a stopped draft, saved as a new draft (origin "edit", parent gen_id);
        the parent is never changed, so the model's text can always be restored. A paused parent gives a
        paused revision with the tokens it had left (Resume writes on from the edited text); any other
        gives a finished one that Continue extends. Either way the worker tokenizes the edited text afresh.
        An instruction draft's `text` is its story: the instruction stays as it was, and the model writes on
        inside its answer to it (tokenswift.text.prompting)."""
        if not text.strip():
            raise ValueError("the edited draft is empty; write something, or keep the draft as it was")
        with self._write() as s:
            parent = _get(s, gen_id, lock=True)
            if parent.status in ("queued", "running"):
                raise Conflict(f"draft {gen_id} is still {parent.status}; pause it before editing")
            instruction = instruction_of(parent) or ""
            old_text = parent.prompt_text + _text(s, gen_id)
            if instruction + text == old_text:
                raise ValueError("nothing was changed; the draft stays as it is")
            old_spans = provenance.append(provenance.parse(parent.prompt_sources, parent.prompt_text),
                                          provenance.MODEL, len(old_text) - len(parent.prompt_text))
            spans = provenance.after_edit(old_text[len(instruction):], old_spans[1:] if instruction else old_spans,
                                          text)
            if instruction:  # the story's spans are the model's and the writer's, never the opening's
                spans = [(provenance.OPENING, len(instruction)), *spans]
            row = _revision(parent, instruction + text, spans)
            s.add(row)
            s.get(SessionRow, parent.session_id).updated_at = utcnow()
            s.flush()
            follow_chapter(s, gen_id, row.id)  # a chapter's text is the writer's edit of it
            return from_row(GenerationRecord, row)

    def edit_base(self, gen_id: int) -> EditBase | None:
        """For a draft that has not run yet (an edit, or a continuation of one): its nearest ancestor that ran, whose
        ids the worker keeps for the start of the text that the edit left as it was (worker/edits.py)."""
        with self._read() as s:
            row = _get(s, gen_id)
            while row.parent_id is not None:
                row = _get(s, row.parent_id)
                if row.prompt_ids is not None:
                    return EditBase(row.prompt_text, unpack_ids(row.prompt_ids), generated_ids(s, row.id),
                                    row.written_from())
        return None

    def instruction(self, gen_id: int) -> str | None:
        """An instruction draft's instruction (its text starts with it; the story follows); None for an opening."""
        with self._read() as s:
            return instruction_of(_get(s, gen_id))

    def text_sources(self, gen_id: int) -> list[tuple[str, str]]:
        """The draft's whole text as (source, text) pieces: "opening", "ai" or "edit" (storage.provenance)."""
        with self._read() as s:
            row = _get(s, gen_id)
            spans = provenance.parse(row.prompt_sources, row.prompt_text)
            pieces = provenance.pieces(row.prompt_text, spans)
            query = select(ChunkRow.source, ChunkRow.text).where(ChunkRow.generation_id == gen_id)
            for source, text in s.execute(query.order_by(ChunkRow.seq)):
                if pieces and pieces[-1][0] == source:
                    pieces[-1] = (source, pieces[-1][1] + text)
                elif text:
                    pieces.append((source, text))
            return pieces

    def resumable(self) -> GenerationRecord | None:
        """The draft to offer on any page load: the one being written, else the next queued, else the
        most recently paused; a writer's draft, never a comparison's run."""
        with self._read() as s:
            for status in UNFINISHED:
                query = _in_books(select(GenerationRow).where(GenerationRow.status == status))
                row = s.scalars(query.order_by(GenerationRow.id.desc() if status == "paused"
                                               else GenerationRow.id).limit(1)).first()
                if row is not None:
                    return from_row(GenerationRecord, row)
        return None

    def last_worked_book(self) -> int | None:
        """The book whose draft was started or edited last; else the newest book (an empty one included).
        Comparisons are not books: a comparison run after the writer's last draft does not count."""
        with self._read() as s:
            latest = s.scalar(_in_books(select(func.max(GenerationRow.id))))
            if latest is not None:
                return s.get(GenerationRow, latest).session_id
            query = select(SessionRow.id).where(SessionRow.kind == BOOK)
            return s.scalar(query.order_by(SessionRow.created_at.desc(), SessionRow.id.desc()).limit(1))


def _in_books(query):
    """`query` over generations, narrowed to those of the writer's books."""
    return query.join(SessionRow, SessionRow.id == GenerationRow.session_id).where(SessionRow.kind == BOOK)


def _get(s: Session, gen_id: int, *, lock: bool = False) -> GenerationRow:
    row = s.get(GenerationRow, gen_id, with_for_update=lock or None)
    if row is None:
        raise NotFound("generation", gen_id)
    return row


def prompt_parts(prompt_text: str, instruction: str | None) -> tuple[str, str]:
    """(what tokenswift.text.prompting.prompt_ids takes as its text, the story so far it continues inside the
    assistant's turn): an instruction draft's instruction and story; an opening and nothing."""
    return (prompt_text, "") if instruction is None else (instruction, prompt_text[len(instruction):])


def parents_format(parent: GenerationRow, settings_json: str) -> str:
    """A continuation's settings with its parent's prompt_format: the draft's text was made in that format
    (an instruction draft's chat turns), whatever the continuation was asked with."""
    values = json.loads(settings_json)
    values["prompt_format"] = json.loads(parent.settings_json).get("prompt_format", "continue")
    return json.dumps(values, sort_keys=True)


def instruction_of(row: GenerationRow) -> str | None:
    """The writer's opening span an instruction draft's prompt starts with: its instruction. A continuation
    appends the model's spans and an edit keeps it apart (save_edit), so it is never merged with the story."""
    if json.loads(row.settings_json).get("prompt_format") != "instruction":
        return None
    spans = provenance.parse(row.prompt_sources, row.prompt_text)
    return row.prompt_text[:spans[0][1]] if spans and spans[0][0] == provenance.OPENING else ""


def _text(s: Session, gen_id: int) -> str:
    query = select(ChunkRow.text).where(ChunkRow.generation_id == gen_id).order_by(ChunkRow.seq)
    return "".join(s.scalars(query))


def _revision(parent: GenerationRow, text: str, spans: provenance.Spans) -> GenerationRow:
    values = json.loads(parent.settings_json)
    left = parent.target_tokens - parent.produced_tokens
    paused = parent.status == "paused" and left > 0
    if paused:
        values["max_new_tokens"] = left
    now = utcnow()
    return GenerationRow(
        session_id=parent.session_id, parent_id=parent.id, origin="edit", prompt_text=text, prompt_ids=None,
        prompt_sources=provenance.dump(spans), model=parent.model, heads=parent.heads, mode=parent.mode,
        memory=parent.memory, authors_note=parent.authors_note,  # they belong to the story, as on Continue
        world_info=parent.world_info,
        seed=parent.seed, settings_json=json.dumps(values), target_tokens=left if paused else 0,
        status="paused" if paused else "done", finish_reason=None if paused else "edit", produced_tokens=0,
        chunk_count=0, elapsed_s=0.0, created_at=now, finished_at=None if paused else now,
    )
