"""Real worker subprocesses on a real SQLite file with the stories260k model (CPU, float64).

The promise under test: however a job is interrupted (kill -9, pause, shutdown), the ids it ends with are
exactly those of one uninterrupted run, and nothing already committed is lost or rewritten.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage import open_store
from storage.records import ModelSpec, utcnow
from tokenswift.settings import Settings
from worker import WorkerConfig, run_worker

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time, there was a little dog named Max."
SETTINGS = Settings(mode="tokenswift", seed=11, max_new_tokens=240, temperature=1.0, penalty=1.2,
                    penalty_length=64, ngram_topk=8)
FLUSH_TOKENS = 16
SHORT = Settings(mode="ar", seed=1, max_new_tokens=30)


@dataclass(frozen=True)
class Straight:
    ids: list[int]
    text: str


@contextmanager
def one_torch_thread():
    """Tiny models run far faster on one thread on a busy 2-core machine; restore the setting after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def straight(stories64) -> Straight:
    """The uninterrupted run, computed in this process with the engine."""
    from tokenswift.detok import IncrementalDetokenizer
    from tokenswift.generate import Generator

    prompt_ids = stories64.encode(PROMPT)
    with one_torch_thread():
        ids = Generator(stories64, SETTINGS, prompt_ids).run()
    detok = IncrementalDetokenizer(stories64.tokenizer, prompt_ids)
    return Straight(ids, detok.push(ids) + detok.flush())


class Workers:
    """Starts `python -m worker` processes and kills, at teardown, those of them still running."""

    def __init__(self, tmp_path: Path, model: Path):
        self.tmp_path, self.model, self.procs, self.spawned = tmp_path, model, [], []
        self.db = f"sqlite:///{tmp_path / 'studio.db'}"

    def start(self, *extra: str, model: str | None = None) -> subprocess.Popen:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115 - closed at teardown
        command = [sys.executable, "-m", "worker", "--db", self.db, "--model", model or str(self.model),
                   "--device", "cpu", "--dtype", "float64", "--threads", "1", "--worker-id", "test",
                   "--poll-s", "0.05", "--flush-s", "0.2", "--flush-tokens", str(FLUSH_TOKENS), *extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((proc, log))
        return proc

    def log(self) -> str:
        return "\n".join(f.name + ":\n" + Path(f.name).read_text(errors="replace") for _, f in self.procs)

    def spawn(self, config: WorkerConfig):
        """As app.py starts it: run_worker in a spawned process, which opens the store itself."""
        proc = multiprocessing.get_context("spawn").Process(target=run_worker, args=(config,))
        proc.start()
        self.spawned.append(proc)
        return proc

    def wait_until(self, condition, timeout: float, proc=None) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            code = proc.exitcode if hasattr(proc, "exitcode") else proc and proc.poll()
            if code is not None:
                pytest.fail(f"worker exited with {code}\n{self.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s\n{self.log()}")
            time.sleep(0.02)

    def finish(self, proc: subprocess.Popen, timeout: float = 120) -> None:
        assert proc.wait(timeout) == 0, self.log()

    def close(self) -> None:
        for spawned in self.spawned:
            if spawned.is_alive():
                spawned.kill()
                spawned.join()
        for proc, log in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


@pytest.fixture
def workers(tmp_path, stories_path):
    started = Workers(tmp_path, stories_path)
    yield started
    started.close()


@pytest.fixture
def store(workers):
    s = open_store(workers.db)
    yield s
    s.close()


def raw_chunks(workers: Workers, gen_id: int) -> list[tuple]:
    """Chunk rows exactly as stored, to prove earlier ones are never rewritten."""
    db = sqlite3.connect(workers.tmp_path / "studio.db")
    query = "select id, seq, token_start, token_ids, text, source from chunks where generation_id=?"
    query += " order by seq"
    rows = db.execute(query, (gen_id,)).fetchall()
    db.close()
    return rows


def assert_complete_and_exact(store, workers, gen_id: int, straight: Straight, kept: list[tuple]) -> None:
    gen = store.get_generation(gen_id)
    assert (gen.status, gen.finish_reason, gen.error) == ("done", "length", None), workers.log()
    rows = raw_chunks(workers, gen_id)
    assert rows[: len(kept)] == kept  # committed before the interruption: byte-identical
    assert [r[1] for r in rows] == list(range(len(rows)))  # seq contiguous
    starts = [0]
    for chunk in store.chunks(gen_id)[:-1]:
        starts.append(starts[-1] + len(chunk.token_ids))
    assert [r[2] for r in rows] == starts  # no token lost or duplicated at a seam
    assert store.get_tokens(gen_id).generated_ids == straight.ids
    assert gen.text == straight.text and gen.produced_tokens == SETTINGS.max_new_tokens


def test_pause_kill_9_and_shutdown_leave_exactly_the_straight_run(store, workers, straight):
    """One job through every interruption; each phase checks that what was committed stays as it was.
    (One test rather than three: each worker start costs seconds of torch import and model load.)"""
    gen_id = store.enqueue_generation(PROMPT, SETTINGS).id
    proc = workers.start()
    workers.wait_until(lambda: len(store.chunks(gen_id)) >= 2, 90, proc)

    # 1. Pause: saved and released within an iteration; the worker moves on to the next jobs.
    store.request_pause(gen_id)
    workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "paused", 10, proc)
    paused = store.get_generation(gen_id, with_text=False)
    assert paused.produced_tokens < SETTINGS.max_new_tokens and paused.control is None
    kept = raw_chunks(workers, gen_id)

    # 2. Resume, then kill -9 mid-generation: the job is left "running" with a dead owner.
    store.request_resume(gen_id)
    workers.wait_until(lambda: len(store.chunks(gen_id)) >= len(kept) + 2, 30, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = committed_prefix_kept(workers, gen_id, kept)
    interrupted = store.get_generation(gen_id, with_text=False)
    assert interrupted.status == "running" and interrupted.produced_tokens < SETTINGS.max_new_tokens

    # 3. A new worker sees the dead pid at once, resumes; SIGTERM (app.py's shutdown) hands it back.
    proc = workers.start()
    workers.wait_until(lambda: len(store.chunks(gen_id)) >= len(kept) + 2, 60, proc)
    proc.send_signal(signal.SIGTERM)
    workers.finish(proc, 30)
    assert store.get_generation(gen_id, with_text=False).status in ("queued", "done")
    kept = committed_prefix_kept(workers, gen_id, kept)

    # 4. A last worker finishes it: the ids are those of one uninterrupted run.
    workers.finish(workers.start("--once"))
    assert_complete_and_exact(store, workers, gen_id, straight, kept)
    assert store.latest_metric(gen_id).tokens == SETTINGS.max_new_tokens


def committed_prefix_kept(workers: Workers, gen_id: int, kept: list[tuple]) -> list[tuple]:
    rows = raw_chunks(workers, gen_id)
    assert rows[: len(kept)] == kept
    return rows


def test_fifo_cancel_and_failures_while_the_worker_serves_on(store, workers, stories_path):
    model = str(stories_path)
    too_long = Settings(mode="ar", seed=1, max_new_tokens=40_000)  # beyond stories260k's 32K context
    ids = [
        store.enqueue_generation(PROMPT, SHORT).id,  # no model of its own: the worker's, which is broken
        store.enqueue_generation(PROMPT, SHORT.replace(max_new_tokens=20_000), model=model).id,  # cancelled
        store.enqueue_generation(PROMPT, SHORT, model=model).id,
        store.enqueue_generation(PROMPT, too_long, model=model).id,
        store.enqueue_generation(PROMPT, SETTINGS.replace(max_new_tokens=30), model=model).id,
    ]
    config = WorkerConfig(db=workers.db, model="/nonexistent/model", device="cpu", dtype="float64", threads=1,
                          worker_id="test", once=True, poll_s=0.05, flush_s=0.2, flush_tokens=FLUSH_TOKENS,
                          parent_pid=os.getpid())
    proc = workers.spawn(config)
    long_id = ids[1]
    workers.wait_until(lambda: len(store.chunks(long_id)) >= 2, 90, proc)
    store.request_cancel(long_id)
    asked = utcnow()
    workers.wait_until(lambda: store.get_generation(long_id, with_text=False).status == "cancelled", 10, proc)
    proc.join(120)
    assert proc.exitcode == 0

    gens = [store.get_generation(i) for i in ids]
    assert [g.status for g in gens] == ["failed", "cancelled", "done", "failed", "done"], workers.log()
    assert "cannot load model '/nonexistent/model'" in gens[0].error
    assert "context" in gens[3].error and "max_new_tokens" in gens[3].error
    # An iteration of this model takes milliseconds; the worker looks for requests after every one. (A
    # token count would be tighter but flaky: this test process may stall on a busy machine.)
    assert (gens[1].finished_at - asked).total_seconds() < 2.0
    assert 0 < gens[1].produced_tokens < 20_000
    assert [len(store.get_tokens(g.id).generated_ids) for g in gens] == [0, gens[1].produced_tokens, 30, 0, 30]
    starts = [g.started_at for g in gens]
    assert starts == sorted(starts)  # FIFO
    assert all(a.finished_at <= b.started_at for a, b in zip(gens, gens[1:], strict=False))  # one at a time
    assert gens[2].model == model


def test_the_saved_model_choice_and_the_command_lines_override(tmp_path):
    """Which model a worker asks its holder for (stubbed: nothing loads): the choice saved before any worker
    existed, unless --model is given, which then becomes the saved choice."""
    from worker.loop import Worker

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    store.set_desired_model(ModelSpec("org/chosen-in-the-ui"))  # no worker row yet (--no-worker, first start)
    asked = []

    def serve(config: WorkerConfig) -> None:
        worker = Worker(store, config)
        worker.holder.ensure = lambda spec, retry=True: asked.append(spec)
        worker.serve()

    serve(WorkerConfig(worker_id="w", once=True))
    assert asked == [ModelSpec("org/chosen-in-the-ui")]
    serve(WorkerConfig(model="/cli/model", device="cuda", dtype="bfloat16", worker_id="w", once=True))
    assert asked[-1] == ModelSpec("/cli/model", None, "cuda", "bfloat16") == store.desired_model()
    store.close()


def test_the_worker_runs_tokenswift_adaptive_unless_told_not_to(tmp_path, stories_path):
    from worker.__main__ import parse_args
    from worker.holder import ModelHolder

    assert parse_args([]).adaptive and not parse_args(["--fixed-batch"]).adaptive
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    for adaptive in (True, False):
        holder = ModelHolder(store, "w", threads=1, adaptive=adaptive)
        assert holder.ensure(ModelSpec(str(stories_path))).extras["adaptive"] is adaptive
    store.close()
