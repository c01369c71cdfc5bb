"""The store's verbs. Each one runs one short transaction and returns plain records (storage/records.py).

Who writes what: the UI/API create books and jobs, delete stopped ones and set `control` (pause/cancel
requests); the worker owns a running job (status, chunks, metrics, heartbeat). Every worker write checks
that it still owns the job, so a worker that lost its claim (lease expired, job deleted) can never append a
duplicate. Reads that check-then-write lock the row (FOR UPDATE on servers; SQLite's BEGIN IMMEDIATE already
serialises writers), so a pause request and a claim cannot interleave. The worker's side of a run (claim,
progress, end, requeue) is storage/runs.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from storage import provenance
from storage.branches import BranchVerbs, generated_ids, refuse_with_branches
from storage.chapter_links import chapter_to_write, follow_chapter
from storage.drafts import DraftVerbs, parents_format
from storage.errors import Conflict, NotFound, StoreError
from storage.models import BOOK, ChunkRow, GenerationRow, MetricRow, SessionRow
from storage.overview import OverviewVerbs
from storage.plans import PlanVerbs
from storage.records import (
    ChunkRecord,
    GenerationRecord,
    JobSettings,
    MetricPoint,
    SessionRecord,
    Snapshot,
    TextChunk,
    Tokens,
    from_row,
    in_sql_range,
    pack_ids,
    unpack_ids,
    utcnow,
)
from storage.runs import RunVerbs
from storage.workers import WorkerVerbs


class Store(DraftVerbs, OverviewVerbs, PlanVerbs, BranchVerbs, RunVerbs, WorkerVerbs):
    def __init__(self, engine: Engine, writer: Engine | None = None):
        self.engine = engine
        self._writer = writer or engine  # same pool; its transactions begin with BEGIN IMMEDIATE
        self.fault: str | None = None  # why this process's last write failed; None once one succeeds

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Session]:
        try:
            with Session(self.engine) as session:
                yield session
        except OperationalError as exc:
            raise StoreError(f"could not read the store ({exc.orig})") from exc

    @contextmanager
    def _write(self) -> Iterator[Session]:
        try:
            with Session(self._writer) as session, session.begin():
                yield session
        except OperationalError as exc:
            self.fault = str(exc.orig)
            raise StoreError(
                f"could not write to the store ({exc.orig}); that change was rolled back and everything "
                "saved before it is intact"
            ) from exc
        self.fault = None

    def checkpoint(self) -> None:
        """Copy the WAL into the database file now (PASSIVE: never waits for readers). SQLite also does it
        every wal_autocheckpoint pages (storage/db.py); the worker calls this when a job stops."""
        if self.engine.dialect.name == "sqlite":
            with self._read() as s:
                s.connection().exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    # --- books ---------------------------------------------------------------------------------------

    def create_session(self, title: str = "Untitled", author: str = "", kind: str = BOOK) -> SessionRecord:
        with self._write() as s:
            row = SessionRow(title=title, author=author, kind=kind, created_at=utcnow(), updated_at=utcnow())
            s.add(row)
            s.flush()
            return from_row(SessionRecord, row)

    def rename_session(
        self, session_id: int, title: str | None = None, author: str | None = None
    ) -> SessionRecord:
        with self._write() as s:
            row = _get(s, SessionRow, session_id, "session")
            row.title = row.title if title is None else title
            row.author = row.author if author is None else author
            row.updated_at = utcnow()
            return from_row(SessionRecord, row)

    def delete_session(self, session_id: int) -> None:
        """Deletes the book with its generations; a worker running one of them stops at its next write."""
        with self._write() as s:
            s.delete(_get(s, SessionRow, session_id, "session"))

    def get_session(self, session_id: int) -> SessionRecord:
        with self._read() as s:
            return from_row(SessionRecord, _get(s, SessionRow, session_id, "session"))

    def list_sessions(self, kind: str = BOOK) -> list[SessionRecord]:
        query = select(SessionRow).where(SessionRow.kind == kind)
        with self._read() as s:
            rows = s.scalars(query.order_by(SessionRow.updated_at.desc(), SessionRow.id.desc()))
            return [from_row(SessionRecord, r) for r in rows]

    def draft_counts(self) -> dict[int, int]:
        """Drafts per book (books without any are absent), in one query."""
        query = select(GenerationRow.session_id, func.count()).group_by(GenerationRow.session_id)
        with self._read() as s:
            return dict(s.execute(query).all())

    # --- queueing ------------------------------------------------------------------------------------

    def enqueue_generation(
        self,
        prompt: str,
        settings: JobSettings,
        *,
        session_id: int | None = None,
        model: str | None = None,
        heads: str | None = None,
        memory: str = "",
        authors_note: str = "",
        world_info: str = "",
        prompt_ids: list[int] | None = None,
        chapter_id: int | None = None,
    ) -> GenerationRecord:
        """Queue a job. Without a session a new book is made; without a model the worker's is used.
        world_info: the draft's World Info as JSON (tokenswift.text.world_info; checked by the caller).
        prompt_ids: the prompt as the model's ids (a chat its template rendered, ui/api/openai_api.py); None: the
        worker tokenizes `prompt`. chapter_id: a chapter of the book's plan (storage/plans.py) this draft is
        written for (origin "chapter"): the chapter's text is this draft from now on."""
        with self._write() as s:
            book = _book(s, session_id)
            chapter = None if chapter_id is None else chapter_to_write(s, chapter_id, book.id)
            row = _new_generation(book, prompt, settings, model=model, heads=heads, memory=memory,
                                  authors_note=authors_note, world_info=world_info,
                                  prompt_ids=None if prompt_ids is None else pack_ids(prompt_ids))
            s.add(row)
            s.flush()
            if chapter is not None:
                row.origin, chapter.draft_id = "chapter", row.id
            return from_row(GenerationRecord, row)

    def continue_generation(
        self, parent_id: int, settings: JobSettings, *, session_id: int | None = None
    ) -> GenerationRecord:
        """A new job whose prompt is the parent's prompt + generated ids (same model, same book). A writer's
        edit that never ran has no ids yet: its text is tokenized by the worker, as a new prompt is."""
        with self._write() as s:
            parent = _get(s, GenerationRow, parent_id, "generation")
            if parent.status in ("queued", "running"):
                raise Conflict(f"generation {parent_id} is still {parent.status}; pause or finish it first")
            if parent.prompt_ids is None and parent.origin != "edit":
                raise Conflict(f"generation {parent_id} never ran ({parent.status}): nothing to continue")
            generated = _text(s, parent_id)
            text = parent.prompt_text + generated
            book = _book(s, session_id or parent.session_id)
            # A continuation keeps the draft's Memory, Author's Note and World Info: they belong to the story.
            row = _new_generation(book, text, settings, model=parent.model, heads=parent.heads,
                                  memory=parent.memory, authors_note=parent.authors_note,
                                  world_info=parent.world_info)
            spans = provenance.parse(parent.prompt_sources, parent.prompt_text)
            row.prompt_sources = provenance.dump(provenance.append(spans, provenance.MODEL, len(generated)))
            row.parent_id, row.origin = parent_id, "continue"
            row.settings_json = parents_format(parent, row.settings_json)  # its text's format, not the request's
            if parent.prompt_ids is not None:  # the worker goes on with the run that wrote them
                row.prompt_ids = pack_ids(unpack_ids(parent.prompt_ids) + generated_ids(s, parent_id))
                row.resume_from = parent.written_from()
            s.add(row)
            s.flush()
            follow_chapter(s, parent_id, row.id)  # a chapter's text is its draft, continued
            return from_row(GenerationRecord, row)

    def set_context_text(self, gen_id: int, memory: str, authors_note: str,
                         world_info: str | None = None) -> GenerationRecord:
        """Edit a draft's Memory and Author's Note (and World Info, as JSON, unless None: left as it is). Any
        time: a running draft's worker reads them at its next context shift or resume, and the change applies
        from there."""
        with self._write() as s:
            row = _get(s, GenerationRow, gen_id, "generation")
            row.memory, row.authors_note = memory, authors_note
            if world_info is not None:
                row.world_info = world_info
            s.flush()
            return from_row(GenerationRecord, row)

    def context_text(self, gen_id: int) -> tuple[str, str, str]:
        """(Memory, Author's Note, World Info JSON) of a draft as they are now: the worker reads them at each
        context shift."""
        with self._read() as s:
            row = _get(s, GenerationRow, gen_id, "generation")
            return row.memory, row.authors_note, row.world_info

    def queue_length(self) -> int:
        with self._read() as s:
            query = select(func.count()).where(GenerationRow.status == "queued")
            return s.scalar(query.select_from(GenerationRow)) or 0

    # --- reading -------------------------------------------------------------------------------------

    def get_generation(self, gen_id: int, *, with_text: bool = True) -> GenerationRecord:
        with self._read() as s:
            row = _get(s, GenerationRow, gen_id, "generation")
            return from_row(GenerationRecord, row, text=_text(s, gen_id) if with_text else None)

    def list_generations(
        self, session_id: int | None = None, statuses: tuple[str, ...] | None = None
    ) -> list[GenerationRecord]:
        """Newest first, without text (use get_generation or chunks for that)."""
        query = select(GenerationRow).order_by(GenerationRow.id.desc())
        if session_id is not None:
            query = query.where(GenerationRow.session_id == session_id)
        if statuses:
            query = query.where(GenerationRow.status.in_(statuses))
        with self._read() as s:
            return [from_row(GenerationRecord, r) for r in s.scalars(query)]

    def progress_since(self, gen_id: int, after_seq: int = -1, after_tokens: int | None = None) -> Snapshot:
        """One read transaction for a poller: the row, the texts of the chunks after `after_seq`, and the
        metric points after `after_tokens` (None: just the latest one). Costs what is new, not the draft."""
        with self._read() as s:
            row = _get(s, GenerationRow, gen_id, "generation")
            record = from_row(GenerationRecord, row)
            query = select(ChunkRow.seq, ChunkRow.text).where(ChunkRow.generation_id == gen_id,
                                                              ChunkRow.seq > after_seq)
            chunks = [TextChunk(seq, text) for seq, text in s.execute(query.order_by(ChunkRow.seq))]
            points = select(MetricRow).where(MetricRow.generation_id == gen_id)
            if after_tokens is None:
                points = points.order_by(MetricRow.id.desc()).limit(1)
            else:
                points = points.where(MetricRow.tokens > after_tokens).order_by(MetricRow.id)
            return Snapshot(record, chunks, [from_row(MetricPoint, r) for r in s.scalars(points)])

    def get_tokens(self, gen_id: int) -> Tokens:
        with self._read() as s:
            row = _get(s, GenerationRow, gen_id, "generation")
            return Tokens(unpack_ids(row.prompt_ids), generated_ids(s, gen_id))

    def chunks(self, gen_id: int, after_seq: int = -1) -> list[ChunkRecord]:
        """Chunks in order; a UI polling a running job passes the last seq it has seen."""
        query = select(ChunkRow).where(ChunkRow.generation_id == gen_id, ChunkRow.seq > after_seq)
        with self._read() as s:
            rows = s.scalars(query.order_by(ChunkRow.seq))
            return [from_row(ChunkRecord, r, token_ids=unpack_ids(r.token_ids)) for r in rows]

    def latest_metric(self, gen_id: int) -> MetricPoint | None:
        query = select(MetricRow).where(MetricRow.generation_id == gen_id).order_by(MetricRow.id.desc())
        with self._read() as s:
            row = s.scalars(query.limit(1)).first()
            return from_row(MetricPoint, row) if row else None

    def delete_generation(self, gen_id: int) -> None:
        """Delete one draft with its chunks and metric points (the foreign keys cascade). Drafts continued
        from it stay: their prompt already holds its text, and the foreign key sets their parent_id to NULL.
        A queued or running draft is refused: cancel it first, so no worker is left writing to it. So is an
        original with branches (storage/branches.py)."""
        with self._write() as s:
            row = _get(s, GenerationRow, gen_id, "generation", lock=True)
            if row.status in ("queued", "running"):
                raise Conflict(f"cannot delete generation {gen_id}: it is {row.status}; stop (cancel) it first "
                               "and delete it once it has stopped")
            refuse_with_branches(s, row)
            book = s.get(SessionRow, row.session_id)
            book.updated_at = utcnow()
            s.delete(row)

    # --- control (UI side) ---------------------------------------------------------------------------

    def request_pause(self, gen_id: int) -> GenerationRecord:
        """Queued jobs pause at once; a running one when its worker next looks (one iteration)."""
        return self._control(gen_id, "pause", {"queued": {"status": "paused", "control": None},
                                               "running": {"control": "pause"}, "paused": {}})

    def request_resume(self, gen_id: int) -> GenerationRecord:
        """Back to the queue, in its old place (FIFO is by id); the worker re-prefills from the stored ids
        and continues the same stream."""
        return self._control(gen_id, "resume", {"paused": {"status": "queued", "error": None}, "queued": {},
                                                "running": {"control": None}})

    def request_cancel(self, gen_id: int) -> GenerationRecord:
        finished = {"status": "cancelled", "control": None, "finished_at": utcnow()}
        return self._control(gen_id, "cancel", {"queued": finished, "paused": finished,
                                                "running": {"control": "cancel"}, "cancelled": {}})

    def _control(self, gen_id: int, verb: str, by_status: dict[str, dict]) -> GenerationRecord:
        with self._write() as s:
            row = _get(s, GenerationRow, gen_id, "generation", lock=True)
            if row.status not in by_status:
                raise Conflict(f"cannot {verb} generation {gen_id}: it is {row.status}")
            for name, value in by_status[row.status].items():
                setattr(row, name, value)
            s.flush()
            return from_row(GenerationRecord, row)

def _get(s: Session, cls: type, ident: int, what: str, *, lock: bool = False):
    if not in_sql_range(ident):  # no row has it, and the driver could not even bind it
        raise NotFound(what, ident)
    row = s.get(cls, ident, with_for_update=lock or None)
    if row is None:
        raise NotFound(what, ident)
    return row


def _book(s: Session, session_id: int | None) -> SessionRow:
    if session_id is None:
        book = SessionRow(title="Untitled", author="", created_at=utcnow(), updated_at=utcnow())
        s.add(book)
        s.flush()
        return book
    book = _get(s, SessionRow, session_id, "session")
    book.updated_at = utcnow()
    return book


def _new_generation(book: SessionRow, prompt: str, settings: JobSettings, **model) -> GenerationRow:
    return GenerationRow(
        session_id=book.id, prompt_text=prompt, mode=settings.mode, seed=settings.seed,
        settings_json=settings.to_json(), target_tokens=settings.max_new_tokens, status="queued",
        produced_tokens=0, chunk_count=0, elapsed_s=0.0, created_at=utcnow(), **model,
    )


def _text(s: Session, gen_id: int) -> str:
    query = select(ChunkRow.text).where(ChunkRow.generation_id == gen_id).order_by(ChunkRow.seq)
    return "".join(s.scalars(query))
