"""Table rows. Only the shape of the data lives here; the verbs that read and write it are in repo.py.

Schema changes go through an Alembic revision in storage/migrations/versions (never create_all).
Times are naive UTC (SQLite keeps no time zone); token ids are packed int32 (see records.pack_ids).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints let Alembic's batch mode (SQLite's copy-and-move ALTER) drop and recreate them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

FINISHED = ("done", "cancelled", "failed")
# A session is a writer's book, or the Compare tab's runs of one comparison (kept out of the Library).
BOOK, COMPARISON = "book", "comparison"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class SessionRow(Base):
    """A book: the generations written for it hang below."""

    __tablename__ = "sessions"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(500))
    author: Mapped[str] = mapped_column(String(500), default="")
    kind: Mapped[str] = mapped_column(String(20), default=BOOK, server_default=BOOK)
    premise: Mapped[str] = mapped_column(Text, default="", server_default="")  # its plan's (storage/plans.py)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class CharacterRow(Base):
    """One of a book's characters: its chapter drafts get it as a World Info entry (ui/drafts/plan_drafts.py)."""

    __tablename__ = "characters"
    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text)
    keys: Mapped[str] = mapped_column(Text)  # JSON list of the key words that bring it into view, besides its name


class ChapterRow(Base):
    """One chapter of a book's plan, in the book's order (position); its text is its draft's."""

    __tablename__ = "chapters"
    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(500))
    beats: Mapped[str] = mapped_column(Text)  # JSON list of what happens in it, in order
    # The draft that is the chapter's text: the one written for it, or an edit or continuation of it, or one the
    # writer chose; None: not written (or its draft was deleted).
    draft_id: Mapped[int | None] = mapped_column(ForeignKey("generations.id", ondelete="SET NULL"), index=True)


class GenerationRow(Base):
    """One generation job. The worker writes status/owner/progress; the UI writes only `control`."""

    __tablename__ = "generations"
    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("generations.id", ondelete="SET NULL"))
    # How it came from its parent: "continue" (the parent's text, longer) or "edit" (the writer's revision
    # of the parent's text, which stays as it was), "branch"; for a new draft "chapter" (written for a chapter of the
    # book's plan) or None.
    origin: Mapped[str | None] = mapped_column(String(20))
    prompt_text: Mapped[str] = mapped_column(Text)
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary)  # None until the worker tokenizes
    # prompt_ids[resume_from:] were written before this draft (by its parent's run, or kept by an edit): the worker
    # resumes the family's run after them, as the run that wrote them would have gone on. None: all prompt.
    resume_from: Mapped[int | None] = mapped_column(Integer)
    # Who wrote which part of prompt_text: JSON [[source, chars], ...] (storage/provenance.py); None: it is
    # all the writer's opening.
    prompt_sources: Mapped[str | None] = mapped_column(Text)
    # The draft's Memory (pinned at the top of the model's context) and Author's Note (inserted near its end):
    # the writer edits them between runs; the worker reads them when it (re)starts the draft.
    memory: Mapped[str] = mapped_column(Text, default="", server_default="")
    authors_note: Mapped[str] = mapped_column(Text, default="", server_default="")
    # Its World Info (tokenswift/text/world_info.py) as JSON, '' for none: edited and read back like the Memory.
    world_info: Mapped[str] = mapped_column(Text, default="", server_default="")
    model: Mapped[str | None] = mapped_column(String(1000))  # None: the worker's model, fixed at claim
    heads: Mapped[str | None] = mapped_column(String(1000))
    # The precision its runs load the model in (LoadedModel.precision: q4, float32, bfloat16, ...) and the kind of
    # device they ran on (cpu, cuda): fixed at the first run like the model, so a resume, a continuation or a branch
    # is computed as the run that wrote the text was, whatever the worker that takes it was started with (on another
    # kind of device the text differs anyway: the worker's own precision then). None: not run yet (its family's).
    dtype: Mapped[str | None] = mapped_column(String(50))
    device: Mapped[str | None] = mapped_column(String(50))
    # The KV cache its runs keep keys and values in (LoadedModel.kv_cache: float32, bf16, q8): the text depends on it
    # as on the weights' precision, so it is fixed at the first run (a continuation takes its parent's) and a resume
    # keeps it whatever a later version or another worker defaults to. None: not run yet, or run before it was kept.
    kv_cache: Mapped[str | None] = mapped_column(String(20))
    mode: Mapped[str] = mapped_column(String(20))
    seed: Mapped[int] = mapped_column(Integer)
    settings_json: Mapped[str] = mapped_column(Text)  # tokenswift.settings.DraftSettings.to_json(): one flat object
    target_tokens: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="queued")
    finish_reason: Mapped[str | None] = mapped_column(String(20))  # "length" | "eos" | "stop"
    produced_tokens: Mapped[int] = mapped_column(Integer, default=0)
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)  # next chunk seq, checked on append
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    elapsed_s: Mapped[float] = mapped_column(Float, default=0.0)  # decoding time summed over runs
    error: Mapped[str | None] = mapped_column(Text)
    control: Mapped[str | None] = mapped_column(String(20))  # requested by the UI: "pause" | "cancel"
    owner: Mapped[str | None] = mapped_column(String(200))  # token of the worker process holding it
    owner_host: Mapped[str | None] = mapped_column(String(200))
    owner_pid: Mapped[int | None] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)

    # The claim query: the oldest queued job.
    __table_args__ = (Index("ix_generations_status_id", "status", "id"),)

    def written_from(self) -> int:
        """Where the text its family wrote starts in its prompt ids (it has run): a child resumes the run from here."""
        return self.resume_from if self.resume_from is not None else len(self.prompt_ids or b"") // 4  # packed int32


class ChunkRow(Base):
    """Append-only slices of the generated stream; the text is their ordered concatenation."""

    __tablename__ = "chunks"
    id: Mapped[int] = mapped_column(primary_key=True)
    generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    token_start: Mapped[int] = mapped_column(Integer)  # index of the first id in the generated stream
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(20), default="ai")  # "ai": the worker writes every chunk
    # Each token's likeliest alternatives (storage/alternatives.py); None: not recorded (chunks before 0007).
    alternatives: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime)

    __table_args__ = (Index("uq_chunks_generation_seq", "generation_id", "seq", unique=True),)


class MetricRow(Base):
    """One point of the live charts, written with each chunk."""

    __tablename__ = "metric_points"
    id: Mapped[int] = mapped_column(primary_key=True)
    generation_id: Mapped[int] = mapped_column(
        ForeignKey("generations.id", ondelete="CASCADE"), index=True
    )
    tokens: Mapped[int] = mapped_column(Integer)  # generated so far, resumed runs included
    elapsed_s: Mapped[float] = mapped_column(Float)
    steps: Mapped[int | None] = mapped_column(Integer)
    alpha: Mapped[float | None] = mapped_column(Float)
    beta: Mapped[float | None] = mapped_column(Float)
    tokens_per_step: Mapped[float | None] = mapped_column(Float)
    ngram_hits: Mapped[int | None] = mapped_column(Integer)  # tokens taken from n-gram candidates (cumulative)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    ar_latency_s: Mapped[float | None] = mapped_column(Float)  # AR seconds per token (estimate)
    plain_share: Mapped[float | None] = mapped_column(Float)  # share of steps the adaptive engine took plain
    context_pinned: Mapped[int | None] = mapped_column(Integer)  # tokens of Memory, World Info and note in view
    context_recent: Mapped[int | None] = mapped_column(Integer)  # story tokens in view (the latest ones)
    shifts: Mapped[int | None] = mapped_column(Integer)  # context shifts of the current run
    shift_s: Mapped[float | None] = mapped_column(Float)  # seconds they took
    time_saved_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class WorkerRow(Base):
    """What a worker reports about itself (the model it should hold is DesiredModelRow, shared by all)."""

    __tablename__ = "workers"
    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime)
    model: Mapped[str | None] = mapped_column(String(1000))
    heads: Mapped[str | None] = mapped_column(String(1000))
    device: Mapped[str | None] = mapped_column(String(50))
    dtype: Mapped[str | None] = mapped_column(String(50))
    load_status: Mapped[str] = mapped_column(String(20), default="idle")  # idle|loading|ready|failed
    load_error: Mapped[str | None] = mapped_column(Text)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_context: Mapped[int | None] = mapped_column(Integer)  # the context the model was trained for
    param_count: Mapped[int | None] = mapped_column(BigInteger)
    heads_info: Mapped[str | None] = mapped_column(String(1000))  # the draft heads loaded; None: none
    drafters: Mapped[str | None] = mapped_column(Text)  # its drafters as JSON (tokenswift.draft.choice.Drafters)
    current_job_id: Mapped[int | None] = mapped_column(Integer)


class DesiredModelRow(Base):
    """The model chosen in the Model tab (or by a worker's --model); every worker loads it between drafts.
    Its own table, not a column of the worker rows, so it can be chosen before any worker has started.
    Exactly one row (id 1), made by the migration: choosing is an UPDATE, never a racing INSERT."""

    __tablename__ = "desired_model"
    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str | None] = mapped_column(String(1000))  # None: nothing chosen yet
    heads: Mapped[str | None] = mapped_column(String(1000))
    device: Mapped[str | None] = mapped_column(String(50))
    dtype: Mapped[str | None] = mapped_column(String(50))
    draft_model: Mapped[str | None] = mapped_column(String(1000))  # None: no draft model
    updated_at: Mapped[datetime | None] = mapped_column(DateTime)

    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)
