"""UI pieces of the hardening without a running app: status lines for recovery and store faults, the
exports folder, the live view's one-read poll, per-process worker ids."""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta

import pytest

from storage import open_store
from storage.records import MetricPoint, Owner, Progress, utcnow
from tokenswift.settings import DraftSettings, Settings
from ui.display import views
from ui.display.live import Watch
from ui.drafts.exports import Exports
from ui.drafts.texts import DraftTexts
from ui.library.library import export_file


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    yield s
    s.close()


def running_since(seconds: float):
    return utcnow() - timedelta(seconds=seconds)


def test_status_lines_for_a_recovering_job_and_a_store_fault(store):
    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=50)))
    owner = Owner("w", "this-host", 4242, "gone")
    running = store.claim_next(owner)
    assert "**Writing**" in views.progress_line(store.get_generation(gen.id), 0, None)
    silent = dataclasses.replace(store.get_generation(gen.id), heartbeat_at=running_since(60))
    assert "Recovering — its worker stopped answering" in views.progress_line(silent, 0, None)
    assert running.id == gen.id
    store.requeue_abandoned(Owner.here("me"), lease_s=0, is_alive=lambda pid: False)
    line = views.progress_line(store.get_generation(gen.id), 0, None)
    assert "Recovering after a restart — loading the model" in line
    assert "**Paused** —" in views.progress_line(store.request_pause(gen.id), 0, None)
    store.request_resume(gen.id)
    assert "Queued" in views.progress_line(store.get_generation(gen.id), 0, None)  # a resume is no recovery
    me = Owner.here("me")
    store.claim_next(me)
    store.pause_for_fault(gen.id, me, "paused: the store could not be written (database or disk is full)")
    line = views.progress_line(store.get_generation(gen.id), 0, None)
    assert "Paused" in line and "database or disk is full" in line


def test_exports_go_to_one_folder_that_is_pruned_and_removed(tmp_path, store):
    (tmp_path / "tmp").mkdir()
    exports = Exports(tmp_path / "tmp", keep_s=3600)
    gen = store.enqueue_generation("Once upon a time", DraftSettings(Settings(max_new_tokens=5)))
    paths = [export_file(store, exports, gen.id, fmt, "Title", "") for fmt in ("TXT", "EPUB", "TXT")]
    assert all(p.parent.parent == exports.folder for p in paths) and len(set(paths)) == 3
    assert paths[0].read_text(encoding="utf-8").count("Once upon a time") == 1
    assert [p.name for p in (tmp_path / "tmp").iterdir()] == [exports.folder.name]  # nothing else left around
    os.utime(paths[0].parent, (0, 0))  # an old export
    exports.write("new.txt", b"x")
    assert not paths[0].exists() and paths[1].exists()
    exports.remove()
    assert not exports.folder.exists()


def test_the_live_view_and_whole_text_read_only_what_is_new(store):
    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=50)))
    owner = Owner.here("w")
    store.claim_next(owner)
    watch = Watch.open(store, gen.id)
    texts = DraftTexts(store)
    for i, piece in enumerate((" upon", " a ti", "me")):
        store.append_progress(gen.id, owner, Progress([i], piece, 0.1, MetricPoint(tokens=i + 1, elapsed_s=0.1)))
        moved, texted, pointed = watch.refresh(store)
        assert moved and texted and pointed
        assert texts.whole(gen.id) == "Once" + "".join((" upon", " a ti", "me")[: i + 1])
    assert watch.refresh(store) == (False, False, False)  # nothing new: nothing read beyond the row
    assert watch.tail == "Once upon a time" and watch.words == 3 and [p.tokens for p in watch.points] == [1, 2, 3]


def test_each_worker_process_has_its_own_id(tmp_path, store):
    from worker import WorkerConfig
    from worker.loop import Worker

    assert WorkerConfig().worker_id is None
    worker = Worker(store, WorkerConfig())
    assert worker.owner.worker_id == f"{socket.gethostname()}:{os.getpid()}"
    assert Worker(store, WorkerConfig(worker_id="gpu0")).owner.worker_id == "gpu0"


def test_polls_read_the_store_only_after_a_commit(store):
    from sqlalchemy import event

    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=50)))
    owner = Owner.here("w")
    store.claim_next(owner)
    store.append_progress(gen.id, owner, Progress([1], " upon", 0.1, MetricPoint(tokens=1, elapsed_s=0.1)))
    texts = DraftTexts(store)
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))

    def reads(call):
        before = len(statements)
        result = call()
        return result, len(statements) - before

    first, n = reads(lambda: texts.read(gen.id))
    assert n > 0 and (first.text, first.since(1), first.metric.tokens) == (" upon", "", 1)
    assert reads(lambda: texts.read(gen.id))[1] == 0  # nothing committed: answered from memory
    store.append_progress(gen.id, owner, Progress([2], " a time", 0.2, MetricPoint(tokens=2, elapsed_s=0.2)))
    later, n = reads(lambda: texts.read(gen.id))
    assert n > 0 and (later.text, later.since(1), later.record.produced_tokens) == (" upon a time", " a time", 2)
    chunk_reads = [s for s in statements if s.lstrip().startswith("SELECT") and "FROM chunks" in s]
    assert chunk_reads and all("chunks.seq >" in s for s in chunk_reads)  # only what is new


def test_the_live_views_ticks_read_the_store_only_after_a_commit(store):
    from sqlalchemy import event

    from storage.changes import Changes

    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=50)))
    owner = Owner.here("w")
    store.claim_next(owner)
    watch, changes = Watch.open(store, gen.id), Changes(store)
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    store.append_progress(gen.id, owner, Progress([1], " upon", 0.1, MetricPoint(tokens=1, elapsed_s=0.1)))
    before = len(statements)
    assert watch.refresh(store, changes) == (True, True, True) and len(statements) > before
    before = len(statements)
    assert watch.refresh(store, changes) == (False, False, False) and len(statements) == before  # from memory
    store.append_progress(gen.id, owner, Progress([2], " a time", 0.2, MetricPoint(tokens=2, elapsed_s=0.2)))
    assert watch.refresh(store, changes) == (True, True, True)  # the next tick sees the commit
    assert watch.tail == "Once upon a time" and watch.words == 3
    before = len(statements)
    watch.refresh(store)  # a click's refresh reads whatever the counter says
    assert len(statements) > before


def test_refreshes_of_one_watch_at_once_add_each_chunk_once(store):
    """A Pause click and the Write tick (both in the server's threads) may refresh one tab's Watch at the same moment:
    each chunk reaches the live tail once, each metric point the chart once."""
    import sys
    import threading

    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=500)))
    owner = Owner.here("w")
    store.claim_next(owner)
    pieces = [f" w{i}" for i in range(300)]
    for i, piece in enumerate(pieces):
        store.append_progress(gen.id, owner, Progress([i], piece, 0.1, MetricPoint(tokens=i + 1, elapsed_s=0.1)))
    record = store.get_generation(gen.id, with_text=False)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns every few bytecodes: a check-then-set gap is hit
    try:
        for _ in range(5):
            watch, start = Watch(gen.id, record, tail="Once"), threading.Barrier(4)

            def refresh(watch=watch, start=start):
                start.wait()
                watch.refresh(store)

            threads = [threading.Thread(target=refresh) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert watch.tail == "Once" + "".join(pieces) and watch.words == len(pieces)
            assert [p.tokens for p in watch.points] == list(range(1, len(pieces) + 1))
    finally:
        sys.setswitchinterval(interval)
