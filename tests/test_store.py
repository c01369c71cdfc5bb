"""The store on real SQLite files: migrations, atomic claims, append-only chunks, control, recovery."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import event

from storage import Conflict, NotFound, StoreError, open_store
from storage.db import make_engine
from storage.migrate import alembic_config, upgrade
from storage.records import MetricPoint, ModelSpec, Owner, Progress, TextChunk
from tokenswift.settings import Settings

REPO = Path(__file__).resolve().parents[1]
TABLES = {"sessions", "generations", "chunks", "metric_points", "workers", "desired_model", "alembic_version"}


def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studio.db'}"


@pytest.fixture
def store(tmp_path):
    s = open_store(url(tmp_path))
    yield s
    s.close()


def queue(store, n: int = 1, tokens: int = 50) -> list[int]:
    settings = [Settings(max_new_tokens=tokens, seed=i) for i in range(n)]
    return [store.enqueue_generation(f"prompt {i}", s).id for i, s in enumerate(settings)]


def test_migrations_create_the_schema_on_an_empty_file(tmp_path):
    open_store(url(tmp_path)).close()
    db = sqlite3.connect(tmp_path / "studio.db")
    tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
    assert tables >= TABLES
    assert db.execute("select version_num from alembic_version").fetchall() == [("0002",)]
    assert db.execute("pragma journal_mode").fetchone() == ("wal",)
    open_store(url(tmp_path)).close()  # already at head: nothing to do, nothing broken


def test_default_store_lives_in_the_app_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_HOME", str(tmp_path / "home"))
    open_store().close()
    assert (tmp_path / "home" / "studio.db").exists()


def test_two_processes_migrating_a_new_file_at_once(tmp_path):
    code = "import sys; from storage import open_store; open_store(sys.argv[1]).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, url(tmp_path)], cwd=REPO, stderr=subprocess.PIPE)
             for _ in range(3)]
    errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    db = sqlite3.connect(tmp_path / "studio.db")
    assert db.execute("select count(*) from alembic_version").fetchone() == (1,)


def test_connections_enforce_foreign_keys_and_wal(store):
    with store.engine.connect() as c:
        assert c.exec_driver_sql("pragma foreign_keys").scalar() == 1
        assert c.exec_driver_sql("pragma synchronous").scalar() == 1  # NORMAL
        assert c.exec_driver_sql("pragma busy_timeout").scalar() == 10_000


def test_threads_racing_for_one_job_exactly_one_wins(tmp_path, store):
    stores = [open_store(url(tmp_path)) for _ in range(6)]
    for _ in range(5):
        queue(store)
        barrier, won = threading.Barrier(len(stores)), []

        def claim(s, barrier=barrier, won=won):
            barrier.wait()
            won.append(s.claim_next(Owner.here("t")))

        threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(j is not None for j in won) == 1
    for s in stores:
        s.close()


CLAIMER = """
import json, sys, time
from pathlib import Path
from storage import open_store
from storage.records import Owner
store, owner, go = open_store(sys.argv[1]), Owner.here(sys.argv[2]), Path(sys.argv[3])
while not go.exists():
    time.sleep(0.005)
ids = []
while (job := store.claim_next(owner)) is not None:
    ids.append(job.id)
print(json.dumps(ids))
"""


def test_processes_share_the_queue_without_double_claims(tmp_path, store):
    ids = queue(store, 40)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, url(tmp_path), f"w{i}", str(go)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(4)]
    go.touch()
    claimed = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
        claimed += json.loads(out)
    assert sorted(claimed) == ids  # every job exactly once
    assert {g.status for g in store.list_generations()} == {"running"}


def test_claims_are_fifo(store):
    ids = queue(store, 3)
    owner = Owner.here("w")
    assert [store.claim_next(owner).id for _ in ids] == ids
    assert store.claim_next(owner) is None


def test_chunks_are_append_only_and_text_is_their_concatenation(tmp_path, store):
    (gen_id,) = queue(store)
    owner = Owner.here("w")
    store.claim_next(owner)
    assert store.record_start(gen_id, owner, [1, 5, 9], "m", None)
    pieces = [([10, 11], "Once"), ([12], " upon"), ([13, 14, 15], " a time, ü")]
    db = sqlite3.connect(tmp_path / "studio.db")
    before = []
    for i, (ids, text) in enumerate(pieces):
        metric = MetricPoint(tokens=6, elapsed_s=0.1 * i, alpha=0.5)
        assert store.append_progress(gen_id, owner, Progress(ids, text, 0.1 * (i + 1), metric))
        rows = db.execute("select seq, token_start, token_ids, text from chunks order by seq").fetchall()
        assert rows[: len(before)] == before  # earlier chunks byte-identical
        before = rows
    assert [(r[0], r[1]) for r in before] == [(0, 0), (1, 2), (2, 3)]
    gen = store.get_generation(gen_id)
    assert gen.text == "Once upon a time, ü" and gen.produced_tokens == 6
    assert store.get_tokens(gen_id).prompt_ids == [1, 5, 9]
    assert store.get_tokens(gen_id).generated_ids == [10, 11, 12, 13, 14, 15]
    assert [c.seq for c in store.chunks(gen_id, after_seq=0)] == [1, 2]
    assert len(store.metric_points(gen_id)) == 3 and store.latest_metric(gen_id).elapsed_s == 0.2


def test_a_worker_that_lost_its_claim_cannot_append(store):
    (gen_id,) = queue(store)
    first, second = Owner.here("a"), Owner("b", "elsewhere", 1, "b-token")
    store.claim_next(first)
    assert store.requeue_abandoned(second, lease_s=0.0, is_alive=lambda pid: True) == [gen_id]
    assert store.claim_next(second).id == gen_id
    assert not store.append_progress(gen_id, first, Progress([1], "x", 0.1))
    assert store.control_for(gen_id, first) == "lost"
    assert store.get_generation(gen_id).produced_tokens == 0


def test_requeue_on_same_host_needs_a_dead_pid_elsewhere_an_expired_lease(store):
    ids = queue(store, 3)
    me = Owner.here("me")
    dead, alive, remote = Owner("x", me.host, 111, "dead"), Owner("y", me.host, 222, "alive"), Owner(
        "z", "other-host", 333, "remote")
    for owner in (dead, alive, remote):
        store.claim_next(owner)
    store.request_pause(ids[0])  # asked while its worker was dying: it ends paused, not queued
    released = store.requeue_abandoned(me, lease_s=60, is_alive=lambda pid: pid == 222)
    assert released == [ids[0]]
    assert [store.get_generation(i).status for i in ids] == ["paused", "running", "running"]
    assert sorted(store.requeue_abandoned(me, lease_s=0, is_alive=lambda pid: True)) == ids[1:]


def test_control_requests(store):
    ids = queue(store, 2)
    assert store.request_pause(ids[0]).status == "paused"  # queued: at once
    assert store.request_resume(ids[0]).status == "queued"
    owner = Owner.here("w")
    store.claim_next(owner)
    assert store.request_pause(ids[0]).control == "pause"  # running: the worker's next look
    assert store.control_for(ids[0], owner) == "pause"
    assert store.append_progress(ids[0], owner, Progress([4], "a", 0.1), finish="paused")
    assert store.request_cancel(ids[1]).status == "cancelled"
    with pytest.raises(Conflict):
        store.request_resume(ids[1])
    with pytest.raises(NotFound):
        store.request_pause(999)


def test_continue_builds_on_the_parent(store):
    book = store.create_session("Dragons", "Ann")
    parent = store.enqueue_generation("Once", Settings(max_new_tokens=3), session_id=book.id, model="m")
    owner = Owner.here("w")
    store.claim_next(owner)
    with pytest.raises(Conflict):
        store.continue_generation(parent.id, Settings(max_new_tokens=3))
    store.record_start(parent.id, owner, [1, 2], "m", "h")
    store.append_progress(parent.id, owner, Progress([3, 4, 5], " upon a", 0.1), finish="done")
    child = store.continue_generation(parent.id, Settings(max_new_tokens=7))
    assert (child.parent_id, child.session_id, child.model, child.heads) == (parent.id, book.id, "m", "h")
    assert child.prompt_text == "Once upon a"
    assert store.get_tokens(child.id).prompt_ids == [1, 2, 3, 4, 5]


def test_books_and_worker_rows(store):
    book = store.create_session("Draft")
    assert store.rename_session(book.id, title="Final", author="Bo").title == "Final"
    gen = store.enqueue_generation("x", Settings(max_new_tokens=2), session_id=book.id)
    owner = Owner.here("gpu0")
    store.register_worker(owner)
    store.set_desired_model(ModelSpec("m", None, "cuda", "bfloat16"))
    store.report_model("gpu0", ModelSpec("m"), "ready", memory_bytes=5 * 2**30, max_context=4096)
    status = store.get_worker("gpu0")
    assert store.desired_model() == ModelSpec("m", None, "cuda", "bfloat16") and status.memory_bytes == 5 * 2**30
    assert store.heartbeat(owner, None) and store.list_workers()[0].heartbeat_age_s < 5
    store.delete_session(book.id)  # foreign keys cascade to the generations
    with pytest.raises(NotFound):
        store.get_generation(gen.id)


def finished(store, gen_id: int, prompt_ids: list[int], pieces: list[tuple[list[int], str]]) -> None:
    """Play the worker: claim `gen_id` (the oldest queued job) and write it to the end, a metric per piece."""
    owner = Owner.here("w")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, prompt_ids, "m", None)
    for i, (ids, text) in enumerate(pieces):
        progress = Progress(ids, text, 0.1 * (i + 1), MetricPoint(tokens=i + 1, elapsed_s=0.1 * (i + 1)))
        store.append_progress(gen_id, owner, progress, finish="done" if i == len(pieces) - 1 else None)


def test_deleting_a_draft_keeps_its_book_and_its_continuations(tmp_path, store):
    book = store.create_session("Dragons")
    parent = store.enqueue_generation("Once", Settings(max_new_tokens=3), session_id=book.id).id
    with pytest.raises(Conflict, match="queued.*cancel"):
        store.delete_generation(parent)
    owner = Owner.here("w")
    store.claim_next(owner)
    with pytest.raises(Conflict, match="running"):
        store.delete_generation(parent)  # its worker would go on writing to it
    store.record_start(parent, owner, [1, 2], "m", None)
    store.append_progress(parent, owner, Progress([3, 4], " upon", 0.1, MetricPoint(tokens=2, elapsed_s=0.1)),
                          finish="done")
    child = store.continue_generation(parent, Settings(max_new_tokens=5)).id
    other = store.enqueue_generation("Elsewhere", Settings(max_new_tokens=5), session_id=book.id).id
    store.request_cancel(child)
    store.delete_generation(parent)

    with pytest.raises(NotFound):
        store.get_generation(parent)
    db = sqlite3.connect(tmp_path / "studio.db")
    for table in ("chunks", "metric_points"):
        assert db.execute(f"select count(*) from {table} where generation_id=?", (parent,)).fetchone() == (0,)
    kept = store.get_generation(child)
    assert kept.parent_id is None and kept.prompt_text == "Once upon"  # its prompt holds the parent's text
    assert store.get_session(book.id).title == "Dragons"
    assert {g.id for g in store.list_generations(book.id)} == {child, other}
    with pytest.raises(NotFound):
        store.delete_generation(parent)


def test_chunk_texts_and_draft_counts(store):
    first, second = store.create_session("One"), store.create_session("Two")
    store.create_session("Empty")
    ids = [store.enqueue_generation(f"p{i}", Settings(max_new_tokens=9), session_id=b.id).id
           for i, b in enumerate((first, first, second))]
    finished(store, ids[0], [1], [([5, 6], "Once"), ([7], " upon"), ([8], " a time")])
    assert store.chunk_texts(ids[0]) == [TextChunk(0, "Once"), TextChunk(1, " upon"), TextChunk(2, " a time")]
    assert store.chunk_texts(ids[0], after_seq=1) == [TextChunk(2, " a time")]
    assert store.chunk_texts(ids[1]) == []
    assert store.draft_counts() == {first.id: 2, second.id: 1}  # books without drafts are absent


def test_a_model_is_chosen_before_any_worker_exists(tmp_path, store):
    assert store.desired_model() is None and store.list_workers() == []
    store.set_desired_model(ModelSpec("org/first"))
    store.set_desired_model(ModelSpec("/models/second", "/heads", "cuda", "bfloat16"))
    other = open_store(url(tmp_path))  # e.g. the worker, started later
    assert other.desired_model() == ModelSpec("/models/second", "/heads", "cuda", "bfloat16")
    other.close()
    db = sqlite3.connect(tmp_path / "studio.db")
    assert db.execute("select count(*) from desired_model").fetchone() == (1,)  # one row, updated in place
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("insert into desired_model (id) values (2)")


def test_migration_0002_keeps_the_choice_made_under_0001(tmp_path):
    engine = make_engine(url(tmp_path))
    upgrade(engine, "0001")
    with engine.begin() as c:
        insert = ("insert into workers (worker_id, host, pid, started_at, heartbeat_at, load_status, desired_model, "
                  "desired_device, desired_dtype) values (?, 'h', 1, ?, ?, 'idle', ?, 'cuda', 'float16')")
        c.exec_driver_sql(insert, ("old", "2026-01-01 00:00:00", "2026-01-01 00:00:00", "stale/model"))
        c.exec_driver_sql(insert, ("new", "2026-01-01 00:00:00", "2026-01-02 00:00:00", "fresh/model"))
    engine.dispose()
    store = open_store(url(tmp_path))
    assert store.desired_model() == ModelSpec("fresh/model", None, "cuda", "float16")
    assert [w.worker_id for w in store.list_workers()] == ["new", "old"]
    store.close()
    db = sqlite3.connect(tmp_path / "studio.db")
    assert not any(r[1].startswith("desired_") for r in db.execute("pragma table_info(workers)"))
    db.close()

    from alembic import command

    engine = make_engine(url(tmp_path))  # and back: every worker row gets the choice again
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0001")
    with engine.connect() as c:
        rows = c.exec_driver_sql("select desired_model from workers").fetchall()
    engine.dispose()
    assert rows == [("fresh/model",), ("fresh/model",)]


def test_full_disk_or_read_only_file_is_a_clear_error_and_loses_nothing(tmp_path, store):
    (gen_id,) = queue(store)
    owner = Owner.here("w")
    store.claim_next(owner)
    store.append_progress(gen_id, owner, Progress([1, 2], "saved", 0.1))
    read_only = open_store(f"sqlite:///file:{tmp_path / 'studio.db'}?mode=ro&uri=true")
    with pytest.raises(StoreError, match="readonly"):
        read_only.append_progress(gen_id, owner, Progress([3], "x", 0.2))
    read_only.close()
    with store.engine.connect() as c:
        pages = c.exec_driver_sql("pragma page_count").scalar()
    # A real SQLITE_FULL: cap the file at its current size (per connection, so reconnect).
    event.listen(store.engine, "connect", lambda dbapi, _: dbapi.execute(f"pragma max_page_count={pages}"))
    store.engine.dispose()
    with pytest.raises(StoreError, match="full.*intact"):
        store.append_progress(gen_id, owner, Progress([3] * 100, "y" * 100_000, 0.2))
    fresh = open_store(url(tmp_path))
    gen = fresh.get_generation(gen_id)
    assert (gen.text, gen.produced_tokens, gen.status) == ("saved", 2, "running")
    fresh.close()
