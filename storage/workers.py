"""Store verbs for the worker-status table (what each worker holds) and the desired model (what they should hold).

Mixed into storage.repo.Store (it provides _read/_write); kept apart because only the worker, the Model tab
and the status lines use them.
"""

from __future__ import annotations

from sqlalchemy import select, update

from storage.clock import lease_now
from storage.models import DesiredModelRow, GenerationRow, WorkerRow
from storage.records import ModelSpec, Owner, WorkerStatus, from_row, utcnow

DESIRED_ID = 1  # the desired_model table's one row


class WorkerVerbs:
    def register_worker(self, owner: Owner) -> WorkerStatus:
        """Create or take over this worker id's row."""
        with self._write() as s:
            row = s.get(WorkerRow, owner.worker_id)
            if row is None:
                row = WorkerRow(worker_id=owner.worker_id, load_status="idle")
                s.add(row)
            row.host, row.pid, row.current_job_id = owner.host, owner.pid, None
            row.started_at = row.heartbeat_at = utcnow()
            s.flush()
            return _status(row)

    def report_model(
        self, worker_id: str, spec: ModelSpec | None, load_status: str, *, load_error: str | None = None,
        memory_bytes: int | None = None, max_context: int | None = None, param_count: int | None = None,
        heads_info: str | None = None, drafters: str | None = None,
    ) -> None:
        with self._write() as s:
            row = s.get(WorkerRow, worker_id)
            if row is None:
                return
            row.model, row.heads = (spec.model, spec.heads) if spec else (None, None)
            row.device, row.dtype = (spec.device, spec.dtype) if spec else (None, None)
            row.load_status, row.load_error = load_status, load_error
            row.memory_bytes, row.max_context, row.heartbeat_at = memory_bytes, max_context, utcnow()
            row.param_count, row.heads_info, row.drafters = param_count, heads_info, drafters

    def heartbeat(self, owner: Owner, job_id: int | None = None) -> bool:
        """Touch the worker row and the job it runs; False if that job is no longer this worker's."""
        with self._write() as s:
            s.execute(update(WorkerRow).where(WorkerRow.worker_id == owner.worker_id)
                      .values(heartbeat_at=utcnow(), current_job_id=job_id))
            if job_id is None:
                return True
            touched = s.execute(
                update(GenerationRow)
                .where(GenerationRow.id == job_id, GenerationRow.owner == owner.token)
                .values(heartbeat_at=lease_now(s))
                .execution_options(synchronize_session=False)
            )
            return touched.rowcount == 1

    def probe_write(self) -> None:
        """A one-row update that changes nothing but must still be written: StoreError while the store
        cannot take writes (storage/health.py asks, once a write of this process has failed)."""
        with self._write() as s:
            s.execute(update(DesiredModelRow).where(DesiredModelRow.id == DESIRED_ID)
                      .values(updated_at=DesiredModelRow.updated_at))

    def forget_dead_workers(self, me: Owner, is_alive) -> None:
        """Drop the rows of workers on this host whose process is gone (each process has its own row)."""
        with self._write() as s:
            rows = s.scalars(select(WorkerRow).where(WorkerRow.host == me.host, WorkerRow.worker_id != me.worker_id))
            for row in rows:
                if not is_alive(row.pid):
                    s.delete(row)

    def set_desired_model(self, spec: ModelSpec) -> None:
        """The Model tab's choice (or a worker's --model). Every worker loads it between drafts; with no
        worker yet, the first one to start does (unless its own --model overrides it)."""
        with self._write() as s:
            row = s.get(DesiredModelRow, DESIRED_ID)
            if row is None:  # a store the 0002 migration did not seed (created by hand)
                row = DesiredModelRow(id=DESIRED_ID)
                s.add(row)
            row.model, row.heads, row.device, row.dtype = spec.model, spec.heads, spec.device, spec.dtype
            row.draft_model = spec.draft_model
            row.updated_at = utcnow()

    def desired_model(self) -> ModelSpec | None:
        """None until a model has been chosen."""
        with self._read() as s:
            row = s.get(DesiredModelRow, DESIRED_ID)
            if row is None or not row.model:
                return None
            return ModelSpec(row.model, row.heads, row.device or "cpu", row.dtype or "float32", row.draft_model)

    def get_worker(self, worker_id: str) -> WorkerStatus | None:
        with self._read() as s:
            row = s.get(WorkerRow, worker_id)
            return _status(row) if row else None

    def list_workers(self) -> list[WorkerStatus]:
        """Freshest heartbeat first."""
        with self._read() as s:
            rows = s.scalars(select(WorkerRow).order_by(WorkerRow.heartbeat_at.desc()))
            return [_status(r) for r in rows]


def _status(row: WorkerRow) -> WorkerStatus:
    return from_row(WorkerStatus, row)
