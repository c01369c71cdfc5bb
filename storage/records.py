"""Plain records that the store's verbs return and take: no ORM object ever leaves a session."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from storage.alternatives import Recorded

SQL_INT_MAX = 2**63 - 1  # SQLite INTEGER (and BIGINT elsewhere) is a signed 64-bit number


def in_sql_range(n: int) -> bool:
    return -SQL_INT_MAX - 1 <= n <= SQL_INT_MAX


def utcnow() -> datetime:
    """Naive UTC: SQLite stores no zone, so every time in the store is naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def pack_ids(ids: list[int]) -> bytes:
    """Token ids as little-endian int32: 4 bytes a token, a quarter of JSON's size for 100K-token books."""
    packed = array("i", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(data: bytes | None) -> list[int]:
    packed = array("i")
    packed.frombytes(data or b"")
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()


def from_row(cls: type, row: Any, **extra: Any):
    """Build the dataclass `cls` from the same-named attributes of an ORM row (extra wins; fields with a
    default that the row lacks keep it)."""
    values = dict(extra)
    for f in dataclasses.fields(cls):
        if f.name not in values and (hasattr(row, f.name) or f.default is dataclasses.MISSING):
            values[f.name] = getattr(row, f.name)
    return cls(**values)


class JobSettings(Protocol):
    """What the store needs of tokenswift.settings.DraftSettings (storage does not import the engine)."""

    mode: str
    seed: int
    max_new_tokens: int

    def to_json(self) -> str: ...


@dataclass(frozen=True)
class SessionRecord:
    id: int
    title: str
    author: str
    created_at: datetime
    updated_at: datetime
    kind: str = "book"  # storage.models.BOOK or COMPARISON


@dataclass(frozen=True)
class GenerationRecord:
    id: int
    session_id: int
    parent_id: int | None
    prompt_text: str
    model: str | None
    heads: str | None
    mode: str
    seed: int
    settings_json: str
    target_tokens: int
    status: str
    finish_reason: str | None
    produced_tokens: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    elapsed_s: float
    error: str | None
    control: str | None
    owner: str | None
    heartbeat_at: datetime | None
    origin: str | None = None  # "continue", "edit" (a writer's revision of the parent), "branch", "chapter" (written
    # for a chapter of the plan) or None (new)
    text: str | None = None  # generated text, assembled from the chunks when asked for
    chunk_count: int = 0  # the next chunk's seq: a poller asks for the text since the count it last saw
    memory: str = ""  # pinned at the top of the model's context (tokenswift.text.context_window)
    authors_note: str = ""  # inserted a few hundred tokens before the end of the context
    world_info: str = ""  # JSON (tokenswift.text.world_info); '' for none
    resume_from: int | None = None  # prompt ids from here on were written before it (storage.models)


@dataclass(frozen=True)
class Job:
    """What a worker needs to run (or resume) a claimed generation."""

    id: int
    prompt_text: str
    prompt_ids: list[int] | None  # None: tokenize prompt_text, then store_prompt_ids
    model: str | None
    heads: str | None
    settings_json: str
    produced_tokens: int
    elapsed_s: float
    memory: str = ""
    authors_note: str = ""
    world_info: str = ""  # JSON (tokenswift.text.world_info); '' for none
    instruction: str | None = None  # an instruction draft's: prompt_text starts with it, its story so far follows
    resume_from: int | None = None  # prompt_ids from here on were written before this draft: resume after them
    parent_id: int | None = None  # an edit that never ran keeps what it can of its parent's ids (worker/edits.py)
    # The precision its runs load the model in and the kind of device they ran on: its own once it ran, else its
    # nearest ancestor's that ran (a continuation, branch or edit goes on with the run that wrote its text); None:
    # the worker's (Store.record_start then fixes them).
    dtype: str | None = None
    device: str | None = None


@dataclass(frozen=True)
class EditBase:
    """A draft that ran, as an edit below it keeps what it can of it: its prompt's text and ids, the ids it generated,
    and where the text its family wrote starts in prompt_ids."""

    prompt_text: str
    prompt_ids: list[int]
    generated_ids: list[int]
    written_from: int


@dataclass(frozen=True)
class Tokens:
    prompt_ids: list[int]
    generated_ids: list[int]


@dataclass(frozen=True)
class ChunkRecord:
    seq: int
    token_start: int
    token_ids: list[int]
    text: str
    source: str
    created_at: datetime


@dataclass(frozen=True)
class TextChunk:
    """A chunk's text without its token ids: what a live view appends."""

    seq: int
    text: str


@dataclass(frozen=True)
class MetricPoint:
    tokens: int  # generated so far, resumed runs included
    elapsed_s: float  # decoding time so far, resumed runs included
    steps: int | None = None
    alpha: float | None = None
    beta: float | None = None
    tokens_per_step: float | None = None
    ngram_hits: int | None = None
    tokens_per_s: float | None = None
    ar_latency_s: float | None = None
    time_saved_s: float | None = None
    plain_share: float | None = None  # share of steps taken as plain decoding (adaptive engine)
    context_pinned: int | None = None  # tokens the model sees of Memory, World Info and Author's Note
    context_recent: int | None = None  # story tokens it sees (the latest)
    shifts: int | None = None  # context shifts in the current run
    shift_s: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Snapshot:
    """What a poller reads in one transaction: the row, the chunk texts it has not seen, metric points."""

    record: GenerationRecord
    chunks: list[TextChunk]
    points: list[MetricPoint]


@dataclass(frozen=True)
class Progress:
    """One flush: new ids and their text, appended as the next chunk."""

    token_ids: list[int]
    text: str
    elapsed_s: float  # total decoding time of the generation after this flush
    metric: MetricPoint | None = None
    alternatives: Sequence[Recorded] | None = None  # one per token id when recorded (storage/alternatives.py)


@dataclass(frozen=True)
class ModelSpec:
    model: str
    heads: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    draft_model: str | None = None  # a smaller model with its tokenizer that drafts for it (speed only)


@dataclass(frozen=True)
class Owner:
    """One worker process. `token` is new for every process, so a restarted worker never passes for the
    dead one even if the pid is reused."""

    worker_id: str
    host: str
    pid: int
    token: str

    @classmethod
    def here(cls, worker_id: str) -> Owner:
        pid = os.getpid()
        token = f"{worker_id}@{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}"
        return cls(worker_id, socket.gethostname(), pid, token)


@dataclass(frozen=True)
class WorkerStatus:
    worker_id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    model: str | None
    heads: str | None
    device: str | None
    dtype: str | None
    load_status: str
    load_error: str | None
    memory_bytes: int | None
    max_context: int | None
    current_job_id: int | None
    param_count: int | None = None
    heads_info: str | None = None  # the draft heads loaded; None: none
    drafters: str | None = None  # the loaded model's drafters as JSON (tokenswift.draft.choice.Drafters)

    @property
    def heartbeat_age_s(self) -> float:
        return (utcnow() - self.heartbeat_at).total_seconds()
