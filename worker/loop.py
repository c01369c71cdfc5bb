"""The worker: one process that owns the model, claims jobs FIFO and runs them one at a time.

No Gradio here. It talks to the UI only through the store: jobs and control requests in, chunks,
metrics and its own status out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time

from storage import Store, StoreError, open_store
from storage.records import Job, ModelSpec, Owner
from worker.config import WorkerConfig
from worker.heartbeat import Heartbeat
from worker.holder import DeviceLost, ModelHolder, ModelUnavailable
from worker.job import FlushPolicy, JobRun, kept_dtype
from worker.liveness import pid_alive

log = logging.getLogger(__name__)
DEVICE_LOST_EXIT = 75  # the exit status of a worker whose device a sticky error left unusable


class Worker:
    def __init__(self, store: Store, config: WorkerConfig):
        self.store, self.config = store, config.resolved()
        self.owner = Owner.here(config.worker_id or f"{socket.gethostname()}:{os.getpid()}")
        self.holder = ModelHolder(store, self.owner.worker_id, config.threads, config.adaptive, config.fast,
                                  config.spare_cores)
        self.stop_requested = threading.Event()
        self.policy = FlushPolicy(config.flush_s, config.flush_tokens)
        self._last_sweep = float("-inf")  # sweep at start-up: resume what a crash left running
        self.device_lost: str | None = None  # set when a sticky device error ended this worker

    def serve(self) -> None:
        self.store.register_worker(self.owner)
        self.store.forget_dead_workers(self.owner, pid_alive)
        if self.config.model:  # the command line wins over the saved choice, and becomes it (for all workers)
            c = self.config
            self.store.set_desired_model(ModelSpec(c.model, c.heads, c.device, c.dtype))
        with Heartbeat(self.store, self.owner, self.config.heartbeat_s) as heartbeat:
            while not self.stopping():
                try:
                    if not self._next(heartbeat) and self.config.once:
                        break
                except StoreError as error:  # full disk, locked file: keep the model, try again later
                    log.error("%s; trying again in %g s", error, self.config.store_retry_s)
                    self.stop_requested.wait(self.config.store_retry_s)
                    # A job this worker was running when the store failed is still ours there: sweep first, so
                    # it is requeued and resumed now (a --once worker would otherwise find the queue empty).
                    self._last_sweep = float("-inf")
                except DeviceLost as error:  # loading, a self-test or a job: any job is back in the queue
                    self._lose_device(str(error))
        self.holder.unload()
        with contextlib.suppress(StoreError):
            self.store.report_model(self.owner.worker_id, None, "stopped")

    def _next(self, heartbeat: Heartbeat) -> bool:
        """Look after the queue, follow the Model tab, run one job. False if there was none."""
        self._sweep()
        self._load_desired()
        job = self.store.claim_next(self.owner)
        if job is None:
            if not self.config.once:
                self.stop_requested.wait(self.config.poll_s)
            return False
        heartbeat.job_id = job.id
        try:
            self._run(job)
        finally:
            heartbeat.job_id = None
        return True

    def stopping(self) -> bool:
        orphaned = self.config.parent_pid is not None and os.getppid() != self.config.parent_pid
        return self.stop_requested.is_set() or orphaned

    def _run(self, job: Job) -> None:
        spec = self._job_spec(job)
        try:
            lm = self.holder.ensure(spec)
        except ModelUnavailable as error:
            self.store.mark_failed(job.id, self.owner, str(error))
            return
        except DeviceLost:
            # No fault of the job: the next worker process runs it (if the store refuses, it requeues the job as
            # abandoned by a dead pid).
            with contextlib.suppress(StoreError):
                self.store.release(job.id, self.owner)
            raise
        log.info("job %s: start (%d tokens already)", job.id, job.produced_tokens)
        run = JobRun(self.store, self.owner, job, lm, self.holder.spec, self.policy, self.stopping,
                     wait=self.stop_requested.wait, retry_s=self.config.store_retry_s, options=self.holder.options)
        outcome = run.run()
        log.info("job %s: %s", job.id, outcome)
        if run.device_lost is not None:
            raise DeviceLost(run.device_lost)  # the job was handed back already
        if run.fast_failure is not None:
            self.holder.fall_back(run.fast_failure)  # before the requeued job is claimed again
        with contextlib.suppress(StoreError):
            self.store.checkpoint()  # the WAL back into the file while nothing is being written
        if outcome == "failed" and lm.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()  # after an OOM the next job needs the memory back

    def _lose_device(self, why: str) -> None:
        """Stop without touching the device again: every call into its context would raise. run_worker then exits
        with DEVICE_LOST_EXIT, and the app's supervisor starts a new process without the fast path."""
        log.error("the device is unusable (%s): this worker stops; a new process can use it again", why)
        self.device_lost = why
        self.holder.forget()
        self.stop_requested.set()

    def _sweep(self) -> None:
        """Requeue jobs whose worker died (this host: pid gone; elsewhere: lease expired)."""
        if time.monotonic() - self._last_sweep < self.config.sweep_s:
            return
        self._last_sweep = time.monotonic()
        for gen_id in self.store.requeue_abandoned(self.owner, self.config.lease_s, pid_alive):
            log.info("job %s was abandoned by a dead worker: requeued", gen_id)

    def _load_desired(self) -> None:
        """Between jobs, follow the Model tab; a failure is reported in the workers table, not raised."""
        spec = self._desired()
        if spec is not None and spec != self.holder.spec:
            with contextlib.suppress(ModelUnavailable):
                self.holder.ensure(spec, retry=False)

    def _desired(self) -> ModelSpec | None:
        return self.store.desired_model()

    def _job_spec(self, job: Job) -> ModelSpec | None:
        """The job's own model and precision (a resumed or continued job keeps those it started with) on this
        worker's device; else the desired one, else whatever is loaded."""
        desired = self._desired()
        if not job.model:
            return desired or self.holder.spec
        base = desired or ModelSpec("", None, self.config.device, self.config.dtype)
        # The chosen draft model drafts for the job's model too where it is the chosen one: it never changes the text.
        draft_model = base.draft_model if job.model == base.model else None
        return ModelSpec(job.model, job.heads, base.device, kept_dtype(job, base.device, base.dtype), draft_model)


def run_worker(config: WorkerConfig) -> None:
    """Process entry point (python -m worker, or app.py through multiprocessing's spawn context).
    The store is opened here, inside the child: engines and pools must never cross a fork/spawn."""
    log_format = "%(asctime)s worker[%(process)d] %(levelname)s %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    worker = Worker(open_store(config.db), config)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Finish the current iteration, save, hand the job back to the queue, exit.
            signal.signal(sig, lambda *_: worker.stop_requested.set())
    try:
        worker.serve()
    finally:
        worker.store.close()
    if worker.device_lost is not None:
        raise SystemExit(DEVICE_LOST_EXIT)  # the app's supervisor starts a new worker
