"""The front door (ui/guard.py) in front of the real app: login on every route but the login page and static
assets, failed logins throttled per address, request bodies and uploads capped."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from storage import open_store
from ui.api import api
from ui.api.guard import Throttle
from ui.api.ratelimit import Buckets, retry_after
from ui.drafts.exports import Exports
from ui.drafts.limits import Limits

GOOD = {"prompt": "Once upon a time", "max_new_tokens": 30}
AUTH = ("ann", "s3cret")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    yield s
    s.close()


def test_throttle_doubles_the_wait_after_the_free_failures():
    clock = Clock()
    throttle = Throttle(free=2, first_wait_s=1.0, max_wait_s=5.0, clock=clock)
    waits = []
    for _ in range(6):
        throttle.failed("10.0.0.1")
        waits.append(throttle.retry_after("10.0.0.1"))
    assert waits == [0, 0, 1, 2, 4, 5]  # capped
    assert throttle.retry_after("10.0.0.2") == 0  # per address
    clock.now += 5
    assert throttle.retry_after("10.0.0.1") == 0
    throttle.succeeded("10.0.0.1")
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 0  # a success starts the count again


def test_wrong_basic_passwords_are_throttled(store):
    clock = Clock()
    app = api.create_app(store, [AUTH])
    app.throttle = Throttle(free=3, first_wait_s=1.0, clock=clock)
    client = TestClient(app)
    for _ in range(4):
        assert client.get("/api/health", auth=("ann", "guess")).status_code == 401
    blocked = client.get("/api/health", auth=AUTH)  # even the right one waits now
    assert blocked.status_code == 429 and blocked.headers["retry-after"] == "1"
    assert "too many failed logins" in blocked.json()["detail"]
    clock.now += 1
    assert client.get("/api/health", auth=AUTH).status_code == 200
    assert client.get("/api/health", auth=("ann", "guess")).status_code == 401  # the count starts again


def test_bodies_over_the_limit_are_413_and_write_nothing(store):
    client = TestClient(api.create_app(store, limits=Limits(body_bytes=4096)))
    big = {**GOOD, "prompt": "word " * 2000}
    refused = client.post("/api/generations", json=big)
    assert refused.status_code == 413 and "over the 4 KB limit" in refused.json()["detail"]

    def chunks():  # no Content-Length: read up to the cap, then refused
        yield b'{"max_new_tokens": 30, "prompt": "'
        for _ in range(100):
            yield b"word " * 20
        yield b'"}'

    streamed = client.post("/api/generations", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert store.list_generations() == []
    assert client.post("/api/generations", json=GOOD).status_code == 201


@pytest.fixture(scope="module")
def page_app(tmp_path_factory):
    """The whole app (API + Gradio page) with a login, in this process; no worker is needed."""
    from ui.server import create_app

    tmp = tmp_path_factory.mktemp("guard")
    store = open_store(f"sqlite:///{tmp / 'studio.db'}")
    exports = Exports(tmp)
    app = create_app(store, [AUTH], limits=Limits(body_bytes=64 * 1024, upload_bytes=16 * 1024), exports=exports)
    yield app
    store.close()
    exports.remove()


def test_everything_but_the_login_page_needs_the_login(page_app):
    client = TestClient(page_app)
    for path in ("/api/docs", "/api/openapi.json", "/api/health", "/config", "/gradio_api/info",
                 "/gradio_api/heartbeat/abc123", "/gradio_api/startup-events", "/gradio_api/monitoring/x"):
        assert client.get(path).status_code == 401, path
    assert client.get("/api/docs").headers["www-authenticate"].startswith("Basic")  # a browser asks for it
    assert client.post("/gradio_api/reset", json={"event_id": "x"}).status_code == 401
    assert client.post("/gradio_api/upload", files={"files": ("a.txt", b"hi")}).status_code == 401
    login_page = client.get("/")
    assert login_page.status_code == 200 and "auth_required" in login_page.text
    assert "window.gradio_api_info = {};" in login_page.text and "write_start" not in login_page.text
    for path in ("/api/docs", "/api/openapi.json"):
        assert client.get(path, auth=AUTH).status_code == 200

    browser = TestClient(page_app)
    assert browser.post("/login", data={"username": "ann", "password": "s3cret"}).status_code == 200
    assert "write_start" in browser.get("/").text and browser.get("/config").status_code == 200
    assert browser.get("/api/openapi.json").status_code == 200  # the page's login also opens the API
    assert browser.post("/gradio_api/upload", files={"files": ("a.txt", b"It was a dark night.")}).is_success
    too_big = browser.post("/gradio_api/upload", files={"files": ("a.txt", b"x" * 200 * 1024)})
    assert too_big.status_code == 413 and "upload of" in too_big.json()["detail"]
    assert browser.post("/gradio_api/upload", files={"files": ("a.txt", b"x" * 20 * 1024)}).status_code == 413


def test_the_login_page_and_the_page_run_first_in_head_before_gradios_modules(page_app):
    from ui.page import FIRST_IN_HEAD

    login_page = TestClient(page_app).get("/")
    browser = TestClient(page_app)
    browser.post("/login", data={"username": "ann", "password": "s3cret"})
    app_page = browser.get("/")
    assert "auth_required" in login_page.text and "write_start" in app_page.text
    for page in (login_page, app_page):
        assert page.status_code == 200
        html = page.text
        assert html.count(FIRST_IN_HEAD) == 1
        assert html.index("<head>") < html.index(FIRST_IN_HEAD) < html.index('<script type="module"')
        assert int(page.headers["content-length"]) == len(page.content)


def test_failed_login_forms_are_throttled(page_app):
    clock = Clock()
    page_app.throttle = Throttle(free=2, first_wait_s=30.0, clock=clock)
    client = TestClient(page_app, client=("198.51.100.7", 5000))
    wrong = {"username": "ann", "password": "guess"}
    assert [client.post("/login", data=wrong).status_code for _ in range(3)] == [400, 400, 400]
    blocked = client.post("/login", data={"username": "ann", "password": "s3cret"})
    assert blocked.status_code == 429 and blocked.headers["retry-after"] == "30"
    assert TestClient(page_app, client=("198.51.100.8", 5000)).post(  # another address is not held up
        "/login", data={"username": "ann", "password": "s3cret"}).status_code == 200
    clock.now += 30
    assert client.post("/login", data={"username": "ann", "password": "s3cret"}).status_code == 200


def test_status_read_buckets_allow_a_burst_then_the_rate_per_client():
    clock = Clock()
    buckets = Buckets(rate_per_s=2, burst=3, clock=clock)
    assert [buckets.take("10.0.0.1") for _ in range(3)] == [0, 0, 0]
    assert buckets.take("10.0.0.1") == pytest.approx(0.5)  # empty: the next token in half a second
    assert buckets.take("10.0.0.2") == 0  # per address
    clock.now += 0.5
    assert buckets.take("10.0.0.1") == 0 and buckets.take("10.0.0.1") == pytest.approx(0.5)
    clock.now += 60  # refilled, but never beyond the burst
    assert [buckets.take("10.0.0.1") for _ in range(4)] == [0, 0, 0, pytest.approx(0.5)]
    assert all(Buckets(rate_per_s=0, burst=1, clock=clock).take("x") == 0 for _ in range(100))  # 0: no limit
    crowded = Buckets(rate_per_s=1, burst=1, clock=clock, max_clients=2)
    for client in ("a", "b", "c"):
        crowded.take(client)
    assert crowded.take("c") > 0 and crowded.take("a") == 0  # "a" forgotten (full again), "c" remembered
    assert (retry_after(0.01), retry_after(1.0), retry_after(1.2)) == (1, 1, 2)  # whole seconds, rounded up


def test_status_reads_over_the_limit_are_429_before_any_store_work(store):
    from sqlalchemy import event

    clock = Clock()  # still while the test runs: a slow machine must not refill the bucket between reads
    app = api.create_app(store, limits=Limits(status_reads_per_s=1, status_burst=2))
    app.status_reads.clock = clock
    client = TestClient(app)
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    path = f"/api/generations/{gen_id}"
    assert [client.get(path).status_code, client.get(f"{path}?since=0").status_code] == [200, 200]
    assert client.post("/api/generations", json=GOOD).status_code == 201  # a commit: a read now reads the store
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    refused = client.get(path)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1" and statements == []
    assert refused.json()["detail"].startswith("status reads: over the limit of 1 per second from this address")
    assert client.head(path).status_code == 429
    # Only status reads are limited: the draft's tokens, health, new drafts and controls are not polled.
    assert client.get(f"{path}/tokens").status_code == 200 and client.get("/api/health").status_code == 200
    assert client.post(f"{path}/cancel").status_code == 200
    read = len(statements)
    assert TestClient(app, client=("10.0.0.2", 50000)).get(path).status_code == 200  # its own budget
    assert len(statements) > read  # ... and an answered read does read the store (the check above can fail)
    clock.now += 1  # Retry-After was honest: a token is there after it
    assert client.get(path).status_code == 200 and client.get(path).status_code == 429


def test_the_status_read_limit_is_configured_by_flag_and_off_at_zero(store):
    import app as studio

    assert (Limits().status_reads_per_s, Limits().status_burst) == (5.0, 10)
    assert Limits.from_flags() == Limits()
    limits = Limits.from_flags(status_reads_per_s=3)
    assert (limits.status_reads_per_s, limits.status_burst) == (3, 6)  # bursts of two seconds' worth
    assert Limits.from_flags(status_reads_per_s=0.2).status_burst == 1
    for bad in ({"status_reads_per_s": -1}, {"status_reads_per_s": math.nan}, {"status_burst": 0}):
        with pytest.raises(ValueError):
            Limits(**bad)
    assert studio.parse_args(["--model", "m", "--status-reads-per-s", "3"]).status_reads_per_s == 3
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit) as stopped:
            studio.parse_args(["--model", "m", "--status-reads-per-s", bad])
        assert stopped.value.code == 2
    unlimited = TestClient(api.create_app(store, limits=Limits.from_flags(status_reads_per_s=0)))
    gen_id = unlimited.post("/api/generations", json=GOOD).json()["id"]
    assert {unlimited.get(f"/api/generations/{gen_id}").status_code for _ in range(40)} == {200}


def test_with_a_login_refused_status_reads_use_up_no_budget(store):
    app = api.create_app(store, [AUTH], limits=Limits(status_reads_per_s=1, status_burst=1))
    app.status_reads.clock = Clock()
    client = TestClient(app)
    assert {client.get("/api/generations/1").status_code for _ in range(5)} == {401}
    assert client.get("/api/generations/1", auth=AUTH).status_code == 404  # the login first, then the limit
    assert client.get("/api/generations/1", auth=AUTH).status_code == 429


def test_an_idle_app_wakes_gradios_queue_tens_of_times_a_second_not_a_thousand(page_app, monkeypatch):
    """Gradio's queue looks for events every 1 ms while it has none: an idle app took 8-9% of a core
    (ui/server.quiet_queue)."""
    import asyncio
    import time

    from gradio import queueing

    naps = []

    class Counted:  # gradio.queueing's `asyncio`, its sleeps counted
        def __getattr__(self, name):
            return getattr(asyncio, name)

        @staticmethod
        def sleep(delay, *args):
            naps.append(delay)
            return asyncio.sleep(delay, *args)

    monkeypatch.setattr(queueing, "asyncio", Counted())
    with TestClient(page_app):  # its lifespan starts the queue's loops
        time.sleep(1.0)
    assert 0 < len(naps) < 150, f"{len(naps)} wakeups in 1 s"
