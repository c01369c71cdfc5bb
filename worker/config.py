"""The worker's settings: one picklable dataclass, so app.py can hand it to a spawned process."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class WorkerConfig:
    db: str | None = None  # SQLAlchemy URL; None = the default SQLite file (storage.db.default_url)
    model: str | None = None  # loaded at start, replacing the saved choice (the Model tab's) for all workers
    heads: str | None = None  # draft-heads directory, when not inside the checkpoint
    device: str = "cpu"
    dtype: str | None = None  # None: run_defaults.default_dtype for the device and model (resolved())
    worker_id: str | None = None  # its row in the workers table; None = host:pid, one row per process
    once: bool = False  # exit when the queue is empty instead of waiting for more jobs
    threads: int | None = None  # torch CPU threads; None = tokenswift.model.loading.cpu_threads for the model
    spare_cores: int = 0  # cores left to other work here when threads is None (the app's page and the browser)
    adaptive: bool = True  # TokenSwift adapts its candidate batch, down to plain steps (same text, faster)
    fast: bool = True  # on a CUDA device, the fast path: static shapes captured as CUDA graphs (same text)
    poll_s: float = 0.25  # idle wait between looks at the queue
    heartbeat_s: float = 2.0
    lease_s: float = 60.0  # a job whose worker (on another host) is silent this long is requeued
    sweep_s: float = 5.0  # how often an idle worker looks for abandoned jobs
    flush_s: float = 1.0  # persist at least this often while generating ...
    flush_tokens: int = 256  # ... or once this many tokens are pending, whichever comes first
    store_retry_s: float = 5.0  # while the store refuses writes (a full disk, a restart), try again this often
    parent_pid: int | None = None  # stop when this process (app.py) is gone

    def resolved(self) -> WorkerConfig:
        """With its precision chosen: run_defaults.default_dtype's for the device and model where none was given.
        The Worker asks, in its own process: run_defaults imports torch, which app.py's server never does."""
        if self.dtype is not None:
            return self
        from tokenswift.model.run_defaults import default_dtype

        return replace(self, dtype=default_dtype(self.device, self.model))
