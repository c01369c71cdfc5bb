"""The store on a real SQLite file and a real PostgreSQL server: migrations, atomic claims, append-only chunks,
control, recovery."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from conftest import only_postgresql, only_sqlite
from sqlalchemy import DateTime, bindparam, event, inspect, text
from sqlalchemy.exc import IntegrityError

from storage import Conflict, NotFound, StoreError, open_store
from storage.db import make_engine
from storage.migrate import alembic_config, upgrade
from storage.records import MetricPoint, ModelSpec, Owner, Progress, TextChunk, utcnow
from tokenswift.settings import DraftSettings, Settings

REPO = Path(__file__).resolve().parents[1]
TABLES = {"sessions", "generations", "chunks", "metric_points", "workers", "desired_model", "alembic_version"}


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.close()


def raw(url: str, sql: str, **params) -> list[tuple]:
    """Rows exactly as stored, read past the store's verbs."""
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(text(sql), params)]
    finally:
        engine.dispose()


HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()  # the newest revision


def queue(store, n: int = 1, tokens: int = 50) -> list[int]:
    settings = [DraftSettings(Settings(max_new_tokens=tokens, seed=i)) for i in range(n)]
    return [store.enqueue_generation(f"prompt {i}", s).id for i, s in enumerate(settings)]


def test_migrations_create_the_schema_on_an_empty_database(blank_db_url):
    open_store(blank_db_url).close()
    engine = make_engine(blank_db_url)
    assert set(inspect(engine).get_table_names()) >= TABLES
    engine.dispose()
    assert raw(blank_db_url, "select version_num from alembic_version") == [(HEAD,)]
    if blank_db_url.startswith("sqlite"):
        assert raw(blank_db_url, "pragma journal_mode") == [("wal",)]
    open_store(blank_db_url).close()  # already at head: nothing to do, nothing broken


def test_a_new_file_held_by_another_connection_is_waited_for_not_refused(tmp_path):
    """Switching a new file to WAL while another connection writes it: SQLite answers "database is locked" at once,
    without its busy handler (the deadlock it guards against is two processes switching a new file at once, as the
    app and its worker do on a first start); the store waits for the other to finish, as busy_timeout would."""
    path = tmp_path / "studio.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE theirs (x)")
    done = threading.Timer(0.5, other.execute, ("COMMIT",))
    done.start()
    try:
        store = open_store(f"sqlite:///{path}")
    finally:
        done.join()
        other.close()
    store.close()
    assert raw(f"sqlite:///{path}", "pragma journal_mode") == [("wal",)]
    assert raw(f"sqlite:///{path}", "select version_num from alembic_version") == [(HEAD,)]

def test_default_store_lives_in_the_app_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_HOME", str(tmp_path / "home"))
    open_store().close()
    assert (tmp_path / "home" / "studio.db").exists()


@pytest.mark.slow
def test_three_processes_migrating_a_new_database_at_once(blank_db_url):
    """SQLite: the write lock; PostgreSQL: the advisory lock. Either way one migrates, the others wait."""
    code = "import sys; from storage import open_store; open_store(sys.argv[1]).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, blank_db_url], cwd=REPO, stderr=subprocess.PIPE)
             for _ in range(3)]
    errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert raw(blank_db_url, "select version_num from alembic_version") == [(HEAD,)]


def test_connections_wait_for_locks_and_enforce_foreign_keys(db_url, store):
    with store.engine.connect() as c:
        if db_url.startswith("sqlite"):
            assert c.exec_driver_sql("pragma foreign_keys").scalar() == 1
            assert c.exec_driver_sql("pragma synchronous").scalar() == 1  # NORMAL
            assert c.exec_driver_sql("pragma busy_timeout").scalar() == 10_000
        else:
            assert c.exec_driver_sql("show lock_timeout").scalar() == "10s"
            assert c.exec_driver_sql("show idle_in_transaction_session_timeout").scalar() == "1min"
            assert make_engine(db_url.replace("+psycopg", "")).dialect.driver == "psycopg"  # postgresql://


def test_threads_racing_for_one_job_exactly_one_wins(db_url, store):
    stores = [open_store(db_url) for _ in range(6)]
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


@pytest.mark.slow
def test_processes_share_the_queue_without_double_claims(tmp_path, db_url, store):
    ids = queue(store, 40)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, db_url, f"w{i}", str(go)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(4)]
    go.touch()
    claimed = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
        claimed += json.loads(out)
    assert sorted(claimed) == ids  # every job exactly once
    assert {g.status for g in store.list_generations()} == {"running"}


@only_postgresql
def test_claims_and_sweeps_pass_over_a_job_that_another_transaction_holds(db_url, store):
    """FOR UPDATE SKIP LOCKED: a worker never waits behind another that is taking a job (or a pause request),
    and a sweep leaves alone a job whose worker is writing to it right now."""
    ids = queue(store, 2)
    held = "select id from generations where id = :id for update"
    engine = make_engine(db_url)
    with engine.begin() as c:
        c.execute(text(held), {"id": ids[0]})
        assert store.claim_next(Owner.here("w")).id == ids[1]  # at once, not after lock_timeout's StoreError
    assert store.claim_next(Owner.here("w")).id == ids[0]
    with engine.begin() as c:
        c.execute(text(held), {"id": ids[0]})
        me = Owner("me", "elsewhere", 1, "me-token")
        assert store.requeue_abandoned(me, lease_s=0, is_alive=lambda pid: False) == [ids[1]]
    engine.dispose()


def test_claims_are_fifo(store):
    ids = queue(store, 3)
    owner = Owner.here("w")
    assert [store.claim_next(owner).id for _ in ids] == ids
    assert store.claim_next(owner) is None


def test_chunks_are_append_only_and_text_is_their_concatenation(db_url, store):
    (gen_id,) = queue(store)
    owner = Owner.here("w")
    store.claim_next(owner)
    assert store.record_start(gen_id, owner, [1, 5, 9], "m", None)
    pieces = [([10, 11], "Once"), ([12], " upon"), ([13, 14, 15], " a time, ü")]
    before = []
    for i, (ids, piece) in enumerate(pieces):
        metric = MetricPoint(tokens=6, elapsed_s=0.1 * i, alpha=0.5)
        assert store.append_progress(gen_id, owner, Progress(ids, piece, 0.1 * (i + 1), metric))
        rows = raw(db_url, "select seq, token_start, token_ids, text from chunks order by seq")
        assert rows[: len(before)] == before  # earlier chunks byte-identical
        before = rows
    assert [(r[0], r[1]) for r in before] == [(0, 0), (1, 2), (2, 3)]
    gen = store.get_generation(gen_id)
    assert gen.text == "Once upon a time, ü" and gen.produced_tokens == 6
    assert store.get_tokens(gen_id).prompt_ids == [1, 5, 9]
    assert store.get_tokens(gen_id).generated_ids == [10, 11, 12, 13, 14, 15]
    assert [c.seq for c in store.chunks(gen_id, after_seq=0)] == [1, 2]
    assert len(store.progress_since(gen_id, after_tokens=-1).points) == 3
    assert store.latest_metric(gen_id).elapsed_s == 0.2


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


def test_leases_keep_one_clock_in_utc_whatever_the_servers_time_zone(db_url, store):
    """On PostgreSQL heartbeats and the lease's cutoff come from the server's clock (machines' clocks may
    disagree), stored in naive UTC like every other time, whatever the session's time zone."""
    if db_url.startswith("postgresql"):
        engine = make_engine(db_url)
        with engine.begin() as c:
            c.exec_driver_sql(f"alter database {db_url.rsplit('/', 1)[1]} set timezone = 'Pacific/Kiritimati'")
        engine.dispose()
        store.engine.dispose()  # new connections take the +14:00 zone
    (gen_id,) = queue(store)
    remote = Owner("r", "other-host", 1, "r-token")
    store.claim_next(remote)
    assert store.heartbeat(remote, gen_id)
    assert abs((utcnow() - store.get_generation(gen_id).heartbeat_at).total_seconds()) < 60
    me = Owner.here("me")
    assert store.requeue_abandoned(me, lease_s=60, is_alive=lambda pid: False) == []  # another host: the lease
    assert store.requeue_abandoned(me, lease_s=0, is_alive=lambda pid: False) == [gen_id]


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
    parent = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=3)), session_id=book.id, model="m")
    owner = Owner.here("w")
    store.claim_next(owner)
    with pytest.raises(Conflict):
        store.continue_generation(parent.id, DraftSettings(Settings(max_new_tokens=3)))
    store.record_start(parent.id, owner, [1, 2], "m", "h", dtype="q4", device="cpu")
    store.append_progress(parent.id, owner, Progress([3, 4, 5], " upon a", 0.1), finish="done")
    child = store.continue_generation(parent.id, DraftSettings(Settings(max_new_tokens=7)))
    assert (child.parent_id, child.session_id, child.model, child.heads) == (parent.id, book.id, "m", "h")
    assert child.prompt_text == "Once upon a"
    assert store.get_tokens(child.id).prompt_ids == [1, 2, 3, 4, 5]
    # The family's precision and kind of device reach the child's run, also past edits that never ran.
    job = store.claim_next(owner)
    assert (job.id, job.dtype, job.device) == (child.id, "q4", "cpu")
    store.append_progress(child.id, owner, Progress([], "", 0.1), finish="paused")
    first = store.save_edit(parent.id, "Once upon a hill")
    second = store.continue_generation(store.save_edit(first.id, "Once upon a green hill").id,
                                       DraftSettings(Settings(max_new_tokens=4)))
    job = store.claim_next(owner)
    assert (job.id, job.dtype, job.device) == (second.id, "q4", "cpu")


def test_books_and_worker_rows(store):
    book = store.create_session("Draft")
    assert store.rename_session(book.id, title="Final", author="Bo").title == "Final"
    gen = store.enqueue_generation("x", DraftSettings(Settings(max_new_tokens=2)), session_id=book.id)
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
    for i, (ids, piece) in enumerate(pieces):
        progress = Progress(ids, piece, 0.1 * (i + 1), MetricPoint(tokens=i + 1, elapsed_s=0.1 * (i + 1)))
        store.append_progress(gen_id, owner, progress, finish="done" if i == len(pieces) - 1 else None)


def test_deleting_a_draft_keeps_its_book_and_its_continuations(db_url, store):
    book = store.create_session("Dragons")
    parent = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=3)), session_id=book.id).id
    with pytest.raises(Conflict, match="queued.*cancel"):
        store.delete_generation(parent)
    owner = Owner.here("w")
    store.claim_next(owner)
    with pytest.raises(Conflict, match="running"):
        store.delete_generation(parent)  # its worker would go on writing to it
    store.record_start(parent, owner, [1, 2], "m", None)
    store.append_progress(parent, owner, Progress([3, 4], " upon", 0.1, MetricPoint(tokens=2, elapsed_s=0.1)),
                          finish="done")
    child = store.continue_generation(parent, DraftSettings(Settings(max_new_tokens=5))).id
    other = store.enqueue_generation("Elsewhere", DraftSettings(Settings(max_new_tokens=5)), session_id=book.id).id
    store.request_cancel(child)
    store.delete_generation(parent)

    with pytest.raises(NotFound):
        store.get_generation(parent)
    for table in ("chunks", "metric_points"):
        assert raw(db_url, f"select count(*) from {table} where generation_id = :id", id=parent) == [(0,)]
    kept = store.get_generation(child)
    assert kept.parent_id is None and kept.prompt_text == "Once upon"  # its prompt holds the parent's text
    assert store.get_session(book.id).title == "Dragons"
    assert {g.id for g in store.list_generations(book.id)} == {child, other}
    with pytest.raises(NotFound):
        store.delete_generation(parent)


def test_chunk_texts_and_draft_counts(store):
    first, second = store.create_session("One"), store.create_session("Two")
    store.create_session("Empty")
    ids = [store.enqueue_generation(f"p{i}", DraftSettings(Settings(max_new_tokens=9)), session_id=b.id).id
           for i, b in enumerate((first, first, second))]
    finished(store, ids[0], [1], [([5, 6], "Once"), ([7], " upon"), ([8], " a time")])
    chunks = [TextChunk(0, "Once"), TextChunk(1, " upon"), TextChunk(2, " a time")]
    assert store.progress_since(ids[0]).chunks == chunks
    assert store.progress_since(ids[0], after_seq=1).chunks == [TextChunk(2, " a time")]
    assert store.progress_since(ids[1]).chunks == []
    assert store.draft_counts() == {first.id: 2, second.id: 1}  # books without drafts are absent


def test_a_model_is_chosen_before_any_worker_exists(db_url, store):
    assert store.desired_model() is None and store.list_workers() == []
    store.set_desired_model(ModelSpec("org/first"))
    store.set_desired_model(ModelSpec("/models/second", "/heads", "cuda", "bfloat16"))
    other = open_store(db_url)  # e.g. the worker, started later
    assert other.desired_model() == ModelSpec("/models/second", "/heads", "cuda", "bfloat16")
    other.close()
    assert raw(db_url, "select count(*) from desired_model") == [(1,)]  # one row, updated in place
    with pytest.raises(IntegrityError):
        raw(db_url, "insert into desired_model (id) values (2)")


def test_migration_0002_keeps_the_choice_made_under_0001(blank_db_url):
    engine = make_engine(blank_db_url)
    upgrade(engine, "0001")
    with engine.begin() as c:
        insert = text("insert into workers (worker_id, host, pid, started_at, heartbeat_at, load_status, "
                      "desired_model, desired_device, desired_dtype) "
                      "values (:id, 'h', 1, :at, :at, 'idle', :model, 'cuda', 'float16')"
                      ).bindparams(bindparam("at", type_=DateTime))
        c.execute(insert, {"id": "old", "at": datetime(2026, 1, 1), "model": "stale/model"})
        c.execute(insert, {"id": "new", "at": datetime(2026, 1, 2), "model": "fresh/model"})
    store = open_store(blank_db_url)
    assert store.desired_model() == ModelSpec("fresh/model", None, "cuda", "float16")
    assert [w.worker_id for w in store.list_workers()] == ["new", "old"]
    store.close()
    assert not any(c["name"].startswith("desired_") for c in inspect(engine).get_columns("workers"))
    engine.dispose()

    from alembic import command

    engine = make_engine(blank_db_url)  # and back: every worker row gets the choice again
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0001")
    with engine.connect() as c:
        rows = c.exec_driver_sql("select desired_model from workers").fetchall()
    engine.dispose()
    assert rows == [("fresh/model",), ("fresh/model",)]


@only_sqlite
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
    fresh = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    gen = fresh.get_generation(gen_id)
    assert (gen.text, gen.produced_tokens, gen.status) == ("saved", 2, "running")
    fresh.close()


def test_ids_beyond_sqlites_integers_are_simply_not_found(store):
    for ident in (2**63, 2**70, -(2**70)):
        with pytest.raises(NotFound):
            store.get_generation(ident)
        with pytest.raises(NotFound):
            store.enqueue_generation("x", DraftSettings(Settings(max_new_tokens=2)), session_id=ident)
    with pytest.raises(NotFound):
        store.request_pause(2**70)


@only_sqlite
def test_the_wal_is_checkpointed_and_kept_small(tmp_path, store):
    """3 MB of chunks: without checkpoints the WAL would hold all of it and the file none."""
    (gen_id,) = queue(store, tokens=10_000)
    owner = Owner.here("w")
    store.claim_next(owner)
    for i in range(600):
        store.append_progress(gen_id, owner, Progress([i] * 16, f"{i:05d}" + "x" * 5000, 0.1))
    wal, main = (tmp_path / "studio.db-wal").stat().st_size, (tmp_path / "studio.db").stat().st_size
    assert main > 2_500_000 and wal <= 4 * 2**20 + 64 * 1024, (main, wal)
    store.checkpoint()
    assert store.get_generation(gen_id).produced_tokens == 600 * 16


def test_a_job_paused_by_a_store_fault_shows_why_and_resumes(store):
    (gen_id,) = queue(store)
    owner = Owner.here("w")
    store.claim_next(owner)
    store.append_progress(gen_id, owner, Progress([1, 2], "kept", 0.1))
    assert store.pause_for_fault(gen_id, owner, "paused: the store could not be written (database or disk is full)")
    paused = store.get_generation(gen_id)
    assert (paused.status, paused.text, paused.owner) == ("paused", "kept", None) and "full" in paused.error
    resumed = store.request_resume(gen_id)
    assert (resumed.status, resumed.error) == ("queued", None)
    assert store.claim_next(Owner.here("w2")).id == gen_id


def test_a_requeued_job_says_it_is_recovering_until_claimed(store):
    ids = queue(store, 2)
    me, dead = Owner.here("me"), Owner("x", Owner.here("me").host, 111, "dead")
    store.claim_next(dead)
    store.claim_next(me)
    assert sorted(store.requeue_abandoned(me, lease_s=60, is_alive=lambda pid: False)) == ids
    assert {store.get_generation(i).control for i in ids} == {"recover"}
    assert store.claim_next(me).id == ids[0]
    assert store.get_generation(ids[0]).control is None  # claimed again: running, nothing pending
    assert store.request_pause(ids[1]).control is None  # the writer's own request replaces the marker


def test_each_worker_process_keeps_its_own_row_and_dead_ones_are_forgotten(store):
    me = Owner.here("host:1")
    gone, other_host = Owner("host:2", me.host, 2, "t2"), Owner("far:3", "far-away", 3, "t3")
    for owner in (gone, other_host, me):
        store.register_worker(owner)
    store.forget_dead_workers(me, is_alive=lambda pid: False)
    assert sorted(w.worker_id for w in store.list_workers()) == ["far:3", "host:1"]


def test_progress_since_reads_only_what_is_new(store):
    (gen_id,) = queue(store)
    finished(store, gen_id, [1], [([5], "Once"), ([6], " upon"), ([7], " a time")])
    snap = store.progress_since(gen_id, after_seq=0, after_tokens=1)
    assert snap.chunks == [TextChunk(1, " upon"), TextChunk(2, " a time")] and snap.record.chunk_count == 3
    assert [p.tokens for p in snap.points] == [2, 3]
    latest = store.progress_since(gen_id, after_seq=2)
    assert latest.chunks == [] and [p.tokens for p in latest.points] == [3]  # only the newest point


def test_memory_and_authors_note_are_kept_per_draft_and_editable(store):
    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=4)), memory="Tom fishes.",
                                   authors_note="Rain.")
    assert (gen.memory, gen.authors_note) == ("Tom fishes.", "Rain.")
    owner = Owner.here("w")
    job = store.claim_next(owner)
    assert (job.memory, job.authors_note) == ("Tom fishes.", "Rain.")  # what the worker builds windows from
    assert store.record_start(gen.id, owner, [1, 4], "model", None)
    store.append_progress(gen.id, owner, Progress([5, 6], " upon", 0.1), finish="paused")
    edited = store.set_context_text(gen.id, "Tom and Lily fish.", "")
    assert (edited.memory, edited.authors_note) == ("Tom and Lily fish.", "")
    store.request_resume(gen.id)
    assert store.claim_next(owner).memory == "Tom and Lily fish."  # the resumed run sees the edit
    store.append_progress(gen.id, owner, Progress([7], " a", 0.2), finish="done", finish_reason="length")
    child = store.continue_generation(gen.id, DraftSettings(Settings(max_new_tokens=4)))
    assert (child.memory, child.authors_note) == ("Tom and Lily fish.", "")  # it belongs to the story


def test_migration_0005_takes_only_the_compare_tabs_own_titles_for_comparisons(blank_db_url):
    """Any book titled 'Compare: ...' became a comparison, hidden from the writer's Library."""
    engine = make_engine(blank_db_url)
    upgrade(engine, "0004")
    titles = {"Compare: Once upon a time there was…": "comparison", "Compare: Tom…": "comparison",
              "Compare: two endings": "book", "Compare: one two three four five six seven…": "book",
              "Compare:  Once upon…": "book"}
    with engine.begin() as c:
        insert = text("insert into sessions (id, title, author, created_at, updated_at) values (:id, :title, "
                      ":author, :at, :at)").bindparams(bindparam("at", type_=DateTime))
        for i, title in enumerate(titles, 1):
            c.execute(insert, {"id": i, "title": title, "author": "", "at": datetime(2026, 1, 1)})
        c.execute(insert, {"id": 9, "title": "Compare: Tom…", "author": "Ann", "at": datetime(2026, 1, 1)})
    engine.dispose()
    open_store(blank_db_url).close()
    kinds = dict(raw(blank_db_url, "select title, kind from sessions where author = ''"))
    assert kinds == titles and raw(blank_db_url, "select kind from sessions where id = 9") == [("book",)]


def test_migration_0004_gives_existing_drafts_an_empty_memory(blank_db_url):
    engine = make_engine(blank_db_url)
    upgrade(engine, "0003")
    with engine.begin() as c:
        c.execute(text("insert into sessions (id, title, author, created_at, updated_at) values (1, 't', '', :at, :at)"
                       ).bindparams(bindparam("at", type_=DateTime)), {"at": datetime(2026, 1, 1)})
        c.execute(text("insert into generations (id, session_id, prompt_text, mode, seed, settings_json, "
                       "target_tokens, status, produced_tokens, chunk_count, created_at, elapsed_s) values "
                       "(1, 1, 'old', 'ar', 0, '{}', 5, 'done', 0, 0, :at, 0)"
                       ).bindparams(bindparam("at", type_=DateTime)), {"at": datetime(2026, 1, 1)})
    engine.dispose()
    store = open_store(blank_db_url)
    gen = store.get_generation(1)
    assert (gen.prompt_text, gen.memory, gen.authors_note) == ("old", "", "")
    store.close()
