"""Store verbs for a job's run, the worker's side: claim the oldest queued job, write its progress as it goes,
end it, hand it back, and requeue the jobs of workers that are gone.

Mixed into storage.repo.Store (it provides _read/_write), like storage.drafts. Every write checks that the worker
still owns the job, so a worker that lost its claim (lease expired, job deleted) can never append a duplicate.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import alternatives
from storage.clock import lease_now
from storage.drafts import instruction_of
from storage.models import FINISHED, ChunkRow, GenerationRow, MetricRow
from storage.records import Job, Owner, Progress, from_row, pack_ids, unpack_ids, utcnow

# A stopped worker's job goes back to the queue unless the user asked for something else meanwhile.
_RELEASED = {"pause": "paused", "cancel": "cancelled", None: "queued"}
# The control value of a job requeued after its worker stopped or died, until a worker claims it again: the
# status line says it is recovering (the new worker is still starting or loading the model).
RECOVER = "recover"


class RunVerbs:
    def claim_next(self, owner: Owner) -> Job | None:
        """Take the oldest queued job, locking its row while it is taken: on a server database FOR UPDATE
        SKIP LOCKED lets workers on several machines pass over a row that another is taking (or that a pause
        request holds) instead of waiting for it; SQLite's BEGIN IMMEDIATE lets one writer in at a time.
        Either way no two workers ever take the same job."""
        oldest = (select(GenerationRow).where(GenerationRow.status == "queued").order_by(GenerationRow.id)
                  .limit(1).with_for_update(skip_locked=True))
        with self._write() as s:
            row = s.scalars(oldest).first()
            if row is None:
                return None
            row.status, row.control, row.heartbeat_at = "running", None, lease_now(s)
            row.owner, row.owner_host, row.owner_pid = owner.token, owner.host, owner.pid
            row.started_at = row.started_at or utcnow()
            ids = unpack_ids(row.prompt_ids) if row.prompt_ids is not None else None
            ran = row
            # The family's precision, as its model, whatever the child keeps of its text (an edit's tokens are only
            # known once the model is loaded): the nearest ancestor's that ran, past edits that never did.
            while ran.dtype is None and ran.parent_id is not None:
                ran = s.get(GenerationRow, ran.parent_id)
            return from_row(Job, row, prompt_ids=ids, instruction=instruction_of(row), dtype=ran.dtype,
                            device=ran.device)

    def control_for(self, gen_id: int, owner: Owner) -> str | None:
        """The pending request for a running job: "pause", "cancel", None, or "lost" if not ours any more."""
        query = select(GenerationRow.owner, GenerationRow.control).where(GenerationRow.id == gen_id)
        with self._read() as s:
            found = s.execute(query).first()
        if found is None or found.owner != owner.token:
            return "lost"
        return found.control

    def record_start(
        self, gen_id: int, owner: Owner, prompt_ids: list[int], model: str, heads: str | None,
        resume_from: int | None = None, kv_cache: str = "float32", dtype: str | None = None,
        device: str | None = None,
    ) -> str | None:
        """Fix what the job runs with: the tokenized prompt (and where its family's written text starts in it), the
        model, its precision and kind of device (`dtype`, `device`, kept once fixed: claim_next hands them to the
        next run) and its KV cache, so a resume uses the same. Returns the KV cache the run keeps: the draft's own
        once fixed, else its parent's where it goes on from the text its family wrote (resume_from), else `kv_cache`
        (the worker's); None where the job is no longer ours."""
        with self._write() as s:
            row = _owned(s, gen_id, owner)
            if row is None:
                return None
            row.prompt_ids, row.model, row.heads = pack_ids(prompt_ids), model, heads
            row.resume_from = resume_from
            if row.dtype is None:
                row.dtype, row.device = dtype, device
            if row.kv_cache is None:
                parent = s.get(GenerationRow, row.parent_id) if row.parent_id and resume_from is not None else None
                row.kv_cache = (parent.kv_cache if parent is not None else None) or kv_cache
            return row.kv_cache

    def append_progress(
        self, gen_id: int, owner: Owner, progress: Progress, *, finish: str | None = None,
        finish_reason: str | None = None,
    ) -> bool:
        """Append one chunk + metric point and bump the counters, in one transaction; `finish` (done,
        paused, cancelled) ends the run in the same one. False if the job is no longer ours."""
        with self._write() as s:
            row = _owned(s, gen_id, owner)
            if row is None:
                return False
            if progress.token_ids or progress.text:
                s.add(ChunkRow(generation_id=gen_id, seq=row.chunk_count, token_start=row.produced_tokens,
                               token_ids=pack_ids(progress.token_ids), text=progress.text, source="ai",
                               created_at=utcnow(), alternatives=_packed(progress)))
                row.chunk_count += 1
                row.produced_tokens += len(progress.token_ids)
            if progress.metric is not None:
                s.add(MetricRow(generation_id=gen_id, created_at=utcnow(), **progress.metric.to_dict()))
            row.elapsed_s, row.heartbeat_at = progress.elapsed_s, lease_now(s)
            if finish is not None:
                _end_run(row, finish)
                row.finish_reason = finish_reason
            return True

    def mark_failed(self, gen_id: int, owner: Owner, error: str) -> bool:
        return self._end_owned(gen_id, owner, "failed", error)

    def pause_for_fault(self, gen_id: int, owner: Owner, reason: str) -> bool:
        """The store refused a write (full disk, read-only file): the job stops as paused with `reason`
        shown, and Resume, once the store takes writes again, continues it from its last saved chunk."""
        return self._end_owned(gen_id, owner, "paused", reason)

    def _end_owned(self, gen_id: int, owner: Owner, status: str, message: str) -> bool:
        with self._write() as s:
            row = _owned(s, gen_id, owner)
            if row is not None:
                _end_run(row, status)
                row.error = message
            return row is not None

    def release(self, gen_id: int, owner: Owner) -> bool:
        """A stopping worker hands the job back (queued, or paused/cancelled if that was asked for)."""
        with self._write() as s:
            row = _owned(s, gen_id, owner)
            if row is not None:
                _hand_back(row)
            return row is not None

    def requeue_abandoned(self, me: Owner, lease_s: float, is_alive: Callable[[int], bool]) -> list[int]:
        """Give back running jobs whose worker is gone: on this host a dead pid is proof at once;
        elsewhere, a heartbeat older than the lease. A worker calls it between jobs, so a job held under
        its own pid (its own, stuck after a failed write, or a previous process's) is abandoned too."""
        running = GenerationRow.status == "running"
        with self._read() as s:
            if s.scalar(select(func.count()).where(running)) == 0:
                return []  # the common case, without taking the write lock
        with self._write() as s:
            expired = GenerationRow.heartbeat_at < lease_now(s) - timedelta(seconds=lease_s)
            # A row locked right now is being written by its worker (or paused by a user): not abandoned.
            query = (select(GenerationRow, expired).where(running).order_by(GenerationRow.id)
                     .with_for_update(skip_locked=True, of=GenerationRow))
            released = []
            for row, stale in s.execute(query).all():
                here = row.owner_host == me.host
                dead = here and (row.owner_pid == me.pid or not is_alive(row.owner_pid))
                if dead or row.heartbeat_at is None or stale:
                    _hand_back(row)
                    released.append(row.id)
            return released


def _packed(progress: Progress) -> bytes | None:
    """The chunk's alternatives, packed; None unless every token of it has them."""
    recorded = progress.alternatives
    if recorded is None or len(recorded) != len(progress.token_ids):
        return None
    return alternatives.pack(recorded)


def _owned(s: Session, gen_id: int, owner: Owner) -> GenerationRow | None:
    row = s.get(GenerationRow, gen_id, with_for_update=True, populate_existing=True)
    return row if row is not None and row.status == "running" and row.owner == owner.token else None


def _hand_back(row: GenerationRow) -> None:
    status = _RELEASED.get(row.control, "queued")
    _end_run(row, status)
    if status == "queued":
        row.control = RECOVER


def _end_run(row: GenerationRow, status: str) -> None:
    row.status, row.control = status, None
    row.owner = row.owner_host = row.owner_pid = None
    if status in FINISHED:
        row.finished_at = utcnow()
