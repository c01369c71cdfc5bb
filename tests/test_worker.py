"""Real worker subprocesses on a real SQLite file and a real PostgreSQL server with the stories260k model (CPU,
float64).

The promise under test: however a job is interrupted (kill -9, pause, shutdown), the ids it ends with are
exactly those of one uninterrupted run, and nothing already committed is lost or rewritten.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import children
import pytest
from conftest import both_backends, only_sqlite, sqlite_db_url
from sqlalchemy import event, text
from worker_gate import Gate, gated_command

from storage import open_store
from storage.db import make_engine
from storage.records import ModelSpec, Owner
from tokenswift.settings import PLAIN, DraftSettings, Settings, Speculation
from worker import WorkerConfig, run_worker

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time, there was a little dog named Max."
SETTINGS = DraftSettings(Settings(seed=11, max_new_tokens=240, temperature=1.0, penalty=1.2, penalty_window=64),
                         Speculation(ngram_topk=8))
FLUSH_TOKENS = 16
SHORT = DraftSettings(Settings(seed=1, max_new_tokens=30), PLAIN)


def generator(lm, asked: DraftSettings, prompt_ids: list[int], options=None, **kwargs):
    """The engine's run of a draft asked for with `asked` (options: the worker's, whose speculation it sets)."""
    from tokenswift.decode.generate import Generator
    from tokenswift.decode.options import EngineOptions

    options = dataclasses.replace(options or EngineOptions(), speculation=asked.speed)
    return Generator(lm, asked.settings, prompt_ids, options=options, **kwargs)


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
    from tokenswift.text.detok import IncrementalDetokenizer

    prompt_ids = stories64.encode(PROMPT)
    with one_torch_thread():
        ids = generator(stories64, SETTINGS, prompt_ids).run()
    detok = IncrementalDetokenizer(stories64.tokenizer, prompt_ids)
    return Straight(ids, detok.push(ids) + detok.flush())


class Workers:
    """Starts `python -m worker` processes and kills, at teardown, those of them still running. A gated one
    (tests/worker_gate.py) holds mid-job where the test asks (`gate.hold_at`), to be killed or let go there."""

    def __init__(self, tmp_path: Path, model: Path, db: str):
        self.tmp_path, self.model, self.db, self.procs, self.spawned = tmp_path, model, db, [], []
        self.gate = Gate(tmp_path / "gate")

    def start(self, *extra: str, model: str | None = None, worker_id: str = "test",
              python: tuple[str, ...] = ("-m", "worker"), gated: bool = False,
              dtype: str = "float64") -> subprocess.Popen:
        python = gated_command(self.gate.folder) if gated else python
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115 - closed at teardown
        command = [sys.executable, *python, "--db", self.db, "--model", model or str(self.model),
                   "--device", "cpu", "--dtype", dtype, "--threads", "1", "--worker-id", worker_id,
                   "--poll-s", "0.05", "--flush-s", "0.2", "--flush-tokens", str(FLUSH_TOKENS), *extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = children.start(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((proc, log))
        return proc

    def log(self) -> str:
        return "\n".join(f.name + ":\n" + Path(f.name).read_text(errors="replace") for _, f in self.procs)

    def spawn(self, config: WorkerConfig, gated: bool = False):
        """As app.py starts it: run_worker in a spawned process, which opens the store itself."""
        import worker_gate

        target, args = (worker_gate.run_worker, (config, self.gate.folder)) if gated else (run_worker, (config,))
        # Daemonic: multiprocessing ends it at this process's exit, should the test's own teardown never run.
        proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
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
            children.stop(proc)
            log.close()


db_url = sqlite_db_url  # SQLite, and both_backends for what each recovers differently


@pytest.fixture
def workers(tmp_path, stories_path, db_url):
    started = Workers(tmp_path, stories_path, db_url)
    yield started
    started.close()


@pytest.fixture
def store(workers):
    s = open_store(workers.db)
    yield s
    s.close()


def raw_chunks(workers: Workers, gen_id: int) -> list[tuple]:
    """Chunk rows exactly as stored, to prove earlier ones are never rewritten."""
    query = "select id, seq, token_start, token_ids, text, source from chunks where generation_id = :id order by seq"
    engine = make_engine(workers.db)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(text(query), {"id": gen_id})]
    finally:
        engine.dispose()


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


@both_backends  # recovery: each backend's locks, leases and lost connections
def test_pause_kill_9_and_shutdown_leave_exactly_the_straight_run(store, workers, straight):
    """One job through every interruption; each phase checks that what was committed stays as it was.
    (One test rather than three: each worker start costs seconds of torch import and model load.) Each
    interruption lands while the worker is held mid-job (two chunks or more into its run), never after a job
    that a free-running worker could have finished first."""
    gen_id = store.enqueue_generation(PROMPT, SETTINGS).id
    gate = workers.gate
    gate.hold_at(2 * FLUSH_TOKENS)
    proc = workers.start(gated=True)
    workers.wait_until(gate.held, 90, proc)

    # 1. Pause: saved and released within an iteration; the worker moves on to the next jobs.
    store.request_pause(gen_id)
    gate.release()
    workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "paused", 60, proc)
    paused = store.get_generation(gen_id, with_text=False)
    assert paused.produced_tokens < SETTINGS.max_new_tokens and paused.control is None
    kept = raw_chunks(workers, gen_id)

    # 2. Resume, then kill -9 mid-generation: the job is left "running" with a dead owner.
    gate.hold_at(paused.produced_tokens + 2 * FLUSH_TOKENS)
    store.request_resume(gen_id)
    workers.wait_until(gate.held, 90, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gate.release()
    kept = committed_prefix_kept(workers, gen_id, kept)
    interrupted = store.get_generation(gen_id, with_text=False)
    assert interrupted.status == "running" and interrupted.produced_tokens < SETTINGS.max_new_tokens

    # 3. A new worker sees the dead pid at once, resumes; SIGTERM (app.py's shutdown) hands it back.
    gate.hold_at(interrupted.produced_tokens + 2 * FLUSH_TOKENS)
    proc = workers.start(gated=True)
    workers.wait_until(gate.held, 90, proc)
    proc.send_signal(signal.SIGTERM)
    gate.release()
    workers.finish(proc, 60)
    assert store.get_generation(gen_id, with_text=False).status == "queued"
    kept = committed_prefix_kept(workers, gen_id, kept)

    # 4. A last worker finishes it: the ids are those of one uninterrupted run.
    workers.finish(workers.start("--once"))
    assert_complete_and_exact(store, workers, gen_id, straight, kept)
    assert store.latest_metric(gen_id).tokens == SETTINGS.max_new_tokens


SHIFTING = SETTINGS.replace(max_new_tokens=560, context_window=256, note_depth=100)
MEMORY, NOTE = "Max is a dog. Lily is a girl.", "They go to the park."


@only_sqlite
def test_a_draft_past_the_window_survives_pause_and_kill_9_exactly(store, workers, stories64):
    """Memory + Author's Note, a 256-token window and 560 new tokens (shifts from the 198th, every 64): shifts
    happen before and after each interruption, and the stored ids are still those of one uninterrupted run."""
    from tokenswift.text.context_window import pinned_ids

    with one_torch_thread():
        straight = generator(stories64, SHIFTING, stories64.encode(PROMPT),
                             pinned=pinned_ids(stories64, MEMORY, NOTE)).run()
    gen_id = store.enqueue_generation(PROMPT, SHIFTING, memory=MEMORY, authors_note=NOTE).id
    gate = workers.gate
    gate.hold_at(100)  # the worker holds there: the pause and the kill land mid-job, whatever the machine's speed
    proc = workers.start(gated=True)
    produced = lambda: store.get_generation(gen_id, with_text=False).produced_tokens  # noqa: E731
    workers.wait_until(gate.held, 90, proc)
    store.request_pause(gen_id)
    gate.release()
    workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "paused", 60, proc)
    gate.hold_at(260)  # past the first shift (198 generated)
    store.request_resume(gen_id)
    workers.wait_until(gate.held, 90, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gate.release()
    assert produced() < SHIFTING.max_new_tokens
    workers.finish(workers.start("--once"))
    gen = store.get_generation(gen_id, with_text=False)
    assert (gen.status, gen.finish_reason) == ("done", "length"), workers.log()
    assert store.get_tokens(gen_id).generated_ids == straight
    point = store.latest_metric(gen_id)
    assert point.shifts >= 1 and point.context_pinned > 1 and point.context_pinned + point.context_recent <= 256


@only_sqlite
def test_the_default_model_in_q4_survives_pause_and_kill_9_exactly(store, workers, gguf_path, smollm2_q4,
                                                                    monkeypatch):
    """The app's own configuration (the default model in q4, the writing defaults, the auto drafter, adaptive, one
    thread), where a rebuilt cache that rounds otherwise than the steps parts from the straight run within a few
    dozen tokens: a pause, a resume past a shift and a kill -9 still end with the uninterrupted run's ids. The
    killed worker's job is finished by a worker in this process, on the session's q4 model (each q4 load takes
    seconds; a new process taking over a killed one's job is proven on stories260k above)."""
    from tokenswift.decode.generate import Generator
    from tokenswift.decode.options import EngineOptions
    from tokenswift.settings import writing_settings
    from tokenswift.text.prompting import prompt_ids
    from worker.loop import Worker

    s = writing_settings(seed=3, max_new_tokens=120, context_window=112)  # shifts from about 75 tokens, every 29
    with one_torch_thread():
        straight = Generator(smollm2_q4, s, prompt_ids(smollm2_q4, PROMPT, "continue"),
                             options=EngineOptions(adaptive=True, alternatives=True)).run()
    gen_id = store.enqueue_generation(PROMPT, DraftSettings(s)).id
    gate, model = workers.gate, str(gguf_path)
    gate.hold_at(32)
    proc = workers.start(gated=True, model=model, dtype="q4")
    workers.wait_until(gate.held, 120, proc)
    store.request_pause(gen_id)
    gate.release()
    workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "paused", 60, proc)
    gate.hold_at(90)
    store.request_resume(gen_id)
    workers.wait_until(gate.held, 120, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gate.release()
    assert store.get_generation(gen_id, with_text=False).produced_tokens < s.max_new_tokens
    monkeypatch.setattr("tokenswift.model.loading.load_model", lambda *_, **__: smollm2_q4)
    with one_torch_thread():
        Worker(store, WorkerConfig(db=workers.db, model=model, dtype="q4", threads=1, worker_id="last", once=True,
                                   flush_s=0.2, flush_tokens=FLUSH_TOKENS)).serve()
    assert store.get_generation(gen_id, with_text=False).status == "done", workers.log()
    assert store.get_tokens(gen_id).generated_ids == straight


def committed_prefix_kept(workers: Workers, gen_id: int, kept: list[tuple]) -> list[tuple]:
    rows = raw_chunks(workers, gen_id)
    assert rows[: len(kept)] == kept
    return rows


def test_fifo_cancel_and_failures_while_the_worker_serves_on(store, workers, stories_path):
    model = str(stories_path)
    # beyond stories260k's 32K context, with context shifting off: the old refusal
    too_long = DraftSettings(Settings(seed=1, max_new_tokens=40_000, context_shift=False), PLAIN)
    ids = [
        store.enqueue_generation(PROMPT, SHORT).id,  # no model of its own: the worker's, which is broken
        store.enqueue_generation(PROMPT, SHORT.replace(max_new_tokens=20_000), model=model).id,  # cancelled
        store.enqueue_generation(PROMPT, SHORT, model=model).id,
        store.enqueue_generation(PROMPT, too_long, model=model).id,
        store.enqueue_generation(PROMPT, SETTINGS.replace(max_new_tokens=30), model=model).id,
        # an instruction goes through the chat template, which stories260k does not have
        store.enqueue_generation(PROMPT, SHORT.replace(prompt_format="instruction"), model=model).id,
    ]
    config = WorkerConfig(db=workers.db, model="/nonexistent/model", device="cpu", dtype="float64", threads=1,
                          worker_id="test", once=True, poll_s=0.05, flush_s=0.2, flush_tokens=FLUSH_TOKENS,
                          parent_pid=os.getpid())
    proc = workers.spawn(config)
    long_id = ids[1]
    workers.wait_until(lambda: len(store.chunks(long_id)) >= 2, 90, proc)
    store.request_cancel(long_id)
    workers.wait_until(lambda: store.get_generation(long_id, with_text=False).status == "cancelled", 60, proc)
    proc.join(120)
    assert proc.exitcode == 0

    gens = [store.get_generation(i) for i in ids]
    assert [g.status for g in gens] == ["failed", "cancelled", "done", "failed", "done", "failed"], workers.log()
    assert "prompt_format" in gens[5].error and "no chat template" in gens[5].error
    assert "cannot load model '/nonexistent/model'" in gens[0].error
    assert "context" in gens[3].error and "max_new_tokens" in gens[3].error
    assert 0 < gens[1].produced_tokens < 20_000
    assert [len(store.get_tokens(g.id).generated_ids) for g in gens] == [0, gens[1].produced_tokens, 30, 0, 30, 0]
    starts = [g.started_at for g in gens]
    assert starts == sorted(starts)  # FIFO
    assert all(a.finished_at <= b.started_at for a, b in zip(gens, gens[1:], strict=False))  # one at a time
    assert gens[2].model == model


def test_a_cancel_ends_the_job_at_the_next_iteration(tmp_path, stories64, stories_path):
    """The worker looks for requests after every iteration: a cancel asked for during one (here from the
    callback the job calls each iteration) ends the job after the next, whatever the machine's speed."""
    from worker.job import FlushPolicy, JobRun

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    gen_id = store.enqueue_generation(PROMPT, SHORT.replace(max_new_tokens=400)).id
    owner = Owner.here("w")
    asked_at = []

    def stopping() -> bool:
        if not asked_at and len(run.gen.produced) >= 40:
            store.request_cancel(gen_id)
            asked_at.append(len(run.gen.produced))
        return False

    try:
        with one_torch_thread():
            run = JobRun(store, owner, store.claim_next(owner), stories64,
                         ModelSpec(str(stories_path), None, "cpu", "float64"), FlushPolicy(60.0, 1000), stopping)
            assert run.run() == "cancelled"
        assert store.get_generation(gen_id).produced_tokens == asked_at[0] + 1  # AR: one token an iteration
    finally:
        store.close()


def test_the_saved_model_choice_and_the_command_lines_override(db_url):
    """Which model a worker asks its holder for (stubbed: nothing loads): the choice saved before any worker
    existed, unless --model is given, which then becomes the saved choice."""
    from worker.loop import Worker

    store = open_store(db_url)
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
    """Adaptive by default (--fixed-batch turns it off); the fast path by default where it exists (CUDA, no
    sliding window; --no-fast turns it off): on this CPU the passes stay eager either way."""
    from worker.__main__ import parse_args
    from worker.holder import ModelHolder

    assert parse_args([]).adaptive and not parse_args(["--fixed-batch"]).adaptive
    assert parse_args([]).fast and not parse_args(["--no-fast"]).fast
    with pytest.raises(SystemExit):  # refused before a model loads (100000 crashed the tokenizer's pool)
        parse_args(["--threads", "100000"])
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    for adaptive in (True, False):
        holder = ModelHolder(store, "w", threads=1, adaptive=adaptive)
        holder.ensure(ModelSpec(str(stories_path)))
        assert holder.options.adaptive is adaptive and holder.options.fast is None
    store.close()


def reference_ids(model, settings: DraftSettings) -> list[int]:
    with one_torch_thread():
        return generator(model, settings, model.encode(PROMPT)).run()


def test_a_full_database_pauses_the_job_with_the_reason_and_resume_loses_nothing(tmp_path, stories64, stories_path):
    """A real SQLITE_FULL (the file capped at its size with max_page_count, per connection) in the middle of
    a job, in this process: the job ends paused, not failed; once writes go through again, Resume finishes
    it with exactly the ids of an uninterrupted run."""
    from worker.job import FlushPolicy, JobRun

    settings = SHORT.replace(max_new_tokens=400)
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    cap = {"pages": None}

    def on_checkout(dbapi, _record, _proxy):
        dbapi.execute(f"pragma max_page_count={cap['pages'] or 1073741823}")

    event.listen(store.engine, "checkout", on_checkout)
    gen_id = store.enqueue_generation(PROMPT, settings).id
    owner = Owner.here("w")
    spec = ModelSpec(str(stories_path), None, "cpu", "float64")

    def stopping() -> bool:  # called every iteration: fill the "disk" once two chunks are saved
        if cap["pages"] is None and len(store.chunks(gen_id)) >= 2:
            with store.engine.connect() as c:
                cap["pages"] = c.exec_driver_sql("pragma page_count").scalar()
        return False

    with one_torch_thread():
        run = JobRun(store, owner, store.claim_next(owner), stories64, spec, FlushPolicy(0.0, 8), stopping)
        assert run.run() == "paused"
    paused = store.get_generation(gen_id)
    assert paused.status == "paused" and "database or disk is full" in paused.error and "resume" in paused.error
    saved = store.get_tokens(gen_id).generated_ids
    assert 16 <= len(saved) < 400

    cap["pages"] = 0  # space is back (0: the pragma's default ceiling)
    store.request_resume(gen_id)
    with one_torch_thread():
        run = JobRun(store, owner, store.claim_next(owner), stories64, spec, FlushPolicy(0.0, 64), lambda: False)
        assert run.run() == "done"
    ids = store.get_tokens(gen_id).generated_ids
    assert ids[: len(saved)] == saved and ids == reference_ids(stories64, settings)
    store.close()


def mount_tmpfs(folder: Path, megabytes: int, owner=None) -> None:
    """A small tmpfs at `folder` (root only: CI runs as root), owned by `owner` (a pwd entry) when given."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the SQLITE_FULL test above covers the job without it")
    folder.mkdir()
    options = f"size={megabytes}m" + (f",uid={owner.pw_uid},gid={owner.pw_gid},mode=0700" if owner else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")


@pytest.fixture
def small_disk(request, tmp_path, workers):
    """A small tmpfs holding the workers' store: the SQLite file, or the PostgreSQL database moved into a
    tablespace there (its WAL stays on the server's own disk, as on a server whose data disk fills up)."""
    if workers.db.startswith("sqlite"):
        disk = tmp_path / "disk"
        mount_tmpfs(disk, 8)
        workers.db = f"sqlite:///{disk / 'studio.db'}"
        try:
            yield disk
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)
        return
    cluster = request.getfixturevalue("pg_cluster")
    name = workers.db.rsplit("/", 1)[1]
    disk = cluster.root / f"disk-{name}"  # under the cluster's folder: the server's user can reach it
    mount_tmpfs(disk, 32, cluster.user)  # a fresh database takes about 8 MB
    space = disk / "tablespace"
    space.mkdir()
    if cluster.user:
        os.chown(space, cluster.user.pw_uid, cluster.user.pw_gid)
    try:
        cluster.execute(f"CREATE TABLESPACE small_{name} LOCATION '{space}'")
        cluster.execute(f"ALTER DATABASE {name} SET TABLESPACE small_{name}")
        yield disk
    finally:
        workers.close()  # the database goes before its tablespace, and that before the disk
        cluster.drop_database(workers.db)
        cluster.execute(f"DROP TABLESPACE IF EXISTS small_{name}")
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the disk says ENOSPC."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for block in (2**16, 2**12, 2**9):
            try:
                while f.write(b"\0" * block):
                    pass
            except OSError:
                continue
    return filler


# What each backend's driver says when the disk is full.
DISK_FULL = {"sqlite": "database or disk is full", "postgresql": "No space left on device"}


@both_backends  # a full SQLite file, or PostgreSQL's tablespace
def test_a_full_disk_in_a_real_worker_is_transient(small_disk, workers, stories64):
    """The worker process with its store on a real file system that fills up mid-job: the job ends paused with
    the reason (once that much can be written), and after Resume the ids are an uninterrupted run's. On SQLite
    health says so at once, and not even the pause can be written until there is space again."""
    from storage.health import store_problem

    backend = "sqlite" if workers.db.startswith("sqlite") else "postgresql"
    settings = SHORT.replace(max_new_tokens=240)
    store = open_store(workers.db)
    gen_id = store.enqueue_generation(PROMPT, settings).id
    workers.gate.hold_at(2 * FLUSH_TOKENS)  # the disk fills mid-job, however fast the machine
    proc = workers.start("--store-retry-s", "0.5", gated=True)
    workers.wait_until(workers.gate.held, 90, proc)
    filler = fill(small_disk)
    before = store.get_generation(gen_id, with_text=False)
    workers.gate.release()
    # PostgreSQL still fills free space in pages it has: the write that fails is the first one needing a new page.
    workers.wait_until(lambda: "the store could not be written" in workers.log(), 120, proc)
    if backend == "sqlite":  # a file's disk is checked directly; a server's only by a write that fails
        assert "full" in store_problem(store)
        workers.wait_until(lambda: "could not record the pause either" in workers.log(), 60, proc)
        assert store.get_generation(gen_id, with_text=False).status == "running"  # the pause cannot be written yet
    filler.unlink()
    workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "paused", 60, proc)
    assert store_problem(store) is None
    paused = store.get_generation(gen_id, with_text=False)
    assert DISK_FULL[backend] in paused.error and paused.produced_tokens >= before.produced_tokens, paused.error
    store.request_resume(gen_id)
    workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "done", 120, proc)
    assert store.get_tokens(gen_id).generated_ids == reference_ids(stories64, settings)
    store.close()


def test_a_finished_job_frees_its_engine_without_waiting_for_a_garbage_collection(tmp_path, stories64, stories_path):
    """Reference counting alone must free a finished job's generator and KV cache (no cycle keeps them)."""
    import gc
    import weakref

    from worker.job import FlushPolicy, JobRun

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    store.enqueue_generation(PROMPT, SHORT.replace(max_new_tokens=60))
    owner = Owner.here("w")
    refs = []

    def stopping() -> bool:  # asked every iteration: note the live engine's cache once
        if not refs:
            refs.append(weakref.ref(run.gen._engine.cache))
        return False

    gc.collect()
    gc.disable()
    try:
        with one_torch_thread():
            run = JobRun(store, owner, store.claim_next(owner), stories64,
                         ModelSpec(str(stories_path), None, "cpu", "float64"), FlushPolicy(0.0, 8), stopping)
            assert run.run() == "done"
        assert refs and refs[0]() is None
    finally:
        gc.enable()
        store.close()


class FailsAfter:
    """FastOptions.attention_factory: the real kernels, raising once `calls` passes have been prepared."""

    def __init__(self, calls: int, message: str = "injected kernel failure"):
        self.left, self.message = calls, message

    def __call__(self, kind, model, visible, span):
        from tokenswift.model.attention import make_attention

        inner, faults = make_attention(kind, model, visible, span), self

        class Kernel:
            def prepare(self):
                faults.left -= 1
                if faults.left < 0:
                    raise RuntimeError(faults.message)
                inner.prepare()

            def __call__(self, q, k, v):
                return inner(q, k, v)

        return Kernel()


def test_a_fast_path_failing_mid_job_requeues_it_on_the_next_path_down(tmp_path, stories64, stories_path):
    """The job is handed back from its last saved token, the worker falls back (stories260k: SDPA, then the eager
    passes) and says so in its model notice, and the next run finishes the job with the uninterrupted run's ids."""
    from tokenswift.decode.options import EngineOptions, PathChoice
    from tokenswift.model.fastpath import FastOptions
    from worker.loop import Worker

    url = f"sqlite:///{tmp_path / 'studio.db'}"
    store = open_store(url)
    settings = SHORT.replace(max_new_tokens=60)
    gen_id = store.enqueue_generation(PROMPT, settings).id
    worker = Worker(store, WorkerConfig(db=url, device="cpu", dtype="float64", flush_s=0.0, flush_tokens=8))
    store.register_worker(worker.owner)
    spec = ModelSpec(str(stories_path), None, "cpu", "float64")
    worker.holder.ensure(spec)
    failing = FastOptions(attention="sdpa", attention_factory=FailsAfter(30))
    worker.holder.options = EngineOptions(fast=failing, choice=PathChoice("sdpa"))
    try:
        with one_torch_thread():
            worker._run(store.claim_next(worker.owner))
            job = store.get_generation(gen_id, with_text=False)
            assert job.status == "queued" and 0 < job.produced_tokens < 60
            assert worker.holder.options.fast is None
            assert worker.holder.options.choice.describe() == ("eager passes; not sdpa: failed mid-job (the fast "
                                                               "path's sdpa attention failed: RuntimeError: "
                                                               "injected kernel failure)")
            worker._run(store.claim_next(worker.owner))
        assert store.get_generation(gen_id, with_text=False).status == "done"
        assert store.get_tokens(gen_id).generated_ids == reference_ids(stories64, settings)
    finally:
        store.close()


def test_a_sticky_device_error_hands_the_job_back_and_ends_the_worker(tmp_path, stories_path):
    """After a CUDA error that leaves the device unusable (raised here by an injected kernel), the worker hands the
    job back from its saved tokens, touches the device no more, and stops: a new process (the app's supervisor
    starts one) resumes the job."""
    from tokenswift.decode.options import EngineOptions
    from tokenswift.model.fastpath import FastOptions
    from worker.loop import Worker

    url = f"sqlite:///{tmp_path / 'studio.db'}"
    store = open_store(url)
    gen_id = store.enqueue_generation(PROMPT, SHORT.replace(max_new_tokens=60)).id
    worker = Worker(store, WorkerConfig(db=url, device="cpu", dtype="float64", flush_s=0.0, flush_tokens=8,
                                        once=True))
    worker.holder.ensure(ModelSpec(str(stories_path), None, "cpu", "float64"))
    sticky = FailsAfter(30, "CUDA error: an illegal memory access was encountered")
    worker.holder.options = options = EngineOptions(fast=FastOptions(attention="sdpa", attention_factory=sticky))
    try:
        with one_torch_thread():
            worker.serve()
        job = store.get_generation(gen_id, with_text=False)
        assert job.status == "queued" and 0 < job.produced_tokens < 60 and job.error is None
        assert worker.stopping() and "illegal memory access" in worker.device_lost
        assert worker.holder.model is None and worker.holder.options is options  # no fallback: a new process
    finally:
        store.close()


STICKY = "CUDA error: an illegal memory access was encountered"


def sticky_load(*_, **__):
    raise RuntimeError(STICKY)


def sticky_self_test(model, adaptive, fast):
    from tokenswift.decode.options import EngineOptions, PathChoice

    return EngineOptions(adaptive=adaptive, choice=PathChoice("eager", (f"flex: RuntimeError: {STICKY}",)))


@pytest.mark.parametrize("where", ["tokenswift.model.loading.load_model", "tokenswift.decode.selftest.device_defaults"])
def test_a_sticky_device_error_while_loading_hands_the_job_back_and_ends_the_worker(tmp_path, stories_path,
                                                                                  monkeypatch, where):
    """The load itself, or its fast-path self-test, leaves the device unusable: the job is not failed but handed
    back untouched, and the worker stops as after a sticky error mid-job (run_worker then exits 75)."""
    from worker.loop import Worker

    monkeypatch.setattr(where, sticky_load if where.endswith("load_model") else sticky_self_test)
    url = f"sqlite:///{tmp_path / 'studio.db'}"
    store = open_store(url)
    gen_id = store.enqueue_generation(PROMPT, SHORT, model=str(stories_path)).id
    worker = Worker(store, WorkerConfig(db=url, device="cpu", dtype="float64", once=True))
    try:
        worker.serve()
        job = store.get_generation(gen_id, with_text=False)
        assert job.status == "queued" and job.produced_tokens == 0 and job.error is None
        assert worker.stopping() and "illegal memory access" in worker.device_lost
        assert worker.holder.model is None
    finally:
        store.close()


class Exits:
    """Supervisor's start(fast): real processes, the first exiting with `code`, the later ones running until
    stopped; it records the fast flag of each start."""

    def __init__(self, code: int):
        self.code, self.fast = code, []

    def __call__(self, fast: bool):
        target, args = (time.sleep, (600,)) if self.fast else (sys.exit, (self.code,))
        self.fast.append(fast)
        proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
        proc.start()
        return proc


def test_a_worker_that_lost_its_device_is_replaced_by_one_without_the_fast_path():
    """Exit 75 (a sticky CUDA error): else a worker that passes the small self-test and breaks mid-job restarts
    forever."""
    from worker.supervisor import Supervisor

    start = Exits(75)
    supervisor = Supervisor(start, poll_s=0.01)
    try:
        deadline = time.monotonic() + 60
        while supervisor.restarts < 1 and time.monotonic() < deadline:  # counted once the new worker is started
            time.sleep(0.01)
        assert start.fast == [True, False] and supervisor.restarts == 1 and not supervisor.fast
    finally:
        supervisor.stop()
    assert not supervisor.process.is_alive()


def test_a_worker_that_exited_cleanly_is_not_restarted():
    """Ctrl+C reaches the worker through the app's process group: it stops with code 0 before the app does."""
    from worker.supervisor import Supervisor

    start = Exits(0)
    supervisor = Supervisor(start, poll_s=0.01)
    try:
        supervisor._thread.join(60)  # the watcher ends when the worker stopped on its own
        assert not supervisor._thread.is_alive() and start.fast == [True] and supervisor.restarts == 0
    finally:
        supervisor.stop()


def test_the_app_respawns_a_killed_worker_and_the_job_finishes_exactly(store, workers, straight, stories_path):
    """app.py's supervisor over a real spawned worker: kill -9 it mid-job, a new one starts and finishes the job
    with the ids and text of one uninterrupted run. (On SQLite: the supervisor knows no backend, and a new worker
    recovering a killed one's claim on PostgreSQL is test_pause_kill_9_and_shutdown_...[postgresql]'s step 3.)"""
    from worker.supervisor import Supervisor

    config = WorkerConfig(db=workers.db, model=str(stories_path), device="cpu", dtype="float64", threads=1,
                          poll_s=0.05, flush_s=0.2, flush_tokens=FLUSH_TOKENS, parent_pid=os.getpid())
    gen_id = store.enqueue_generation(PROMPT, SETTINGS).id
    workers.gate.hold_at(2 * FLUSH_TOKENS)  # the first worker holds mid-job; its successor finds no hold
    supervisor = Supervisor(lambda fast: workers.spawn(config, gated=True), poll_s=0.1)
    try:
        first = supervisor.process
        workers.wait_until(workers.gate.held, 90, first)
        kept = raw_chunks(workers, gen_id)
        os.kill(first.pid, signal.SIGKILL)
        first.join()
        workers.gate.release()
        workers.wait_until(lambda: store.get_generation(gen_id, with_text=False).status == "done", 180)
        assert supervisor.restarts == 1 and supervisor.process.pid != first.pid and supervisor.process.is_alive()
        assert_complete_and_exact(store, workers, gen_id, straight, kept)
    finally:
        supervisor.stop()
