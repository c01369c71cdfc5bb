"""The real app as the UI and browser tests drive it: `python app.py` (server + worker) in a child process, and
Debian's Chromium (never a downloaded browser). conftest.py holds the session's one app and one browser."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import children
import httpx
from conftest import REPO, need_shared

CHROMIUM = Path("/usr/bin/chromium")
# --in-process-gpu: the page's (software) compositing in the browser's process, not a GPU process of its own beside
# it: test_ui_browser.py's Chromium took 49-54 CPU-s instead of 56-58 (two runs each).
ARGS = ["--no-sandbox", "--disable-gpu", "--in-process-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
SHOTS = REPO / "artifacts" / "screenshots"
AUTH = ("ann", "secret")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(tmp: Path, *extra: str, ready: bool = True):
    """`python app.py` on a free port with its own store; yields the base URL. With ready, waits until the
    worker reports the model loaded."""
    model = need_shared()
    port = free_port()
    cmd = [sys.executable, "app.py", "--port", str(port), "--db", f"sqlite:///{tmp / 'studio.db'}",
           "--model", str(model), "--device", "cpu", "--threads", "1", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENSWIFT_HOME": str(tmp), "GRADIO_ANALYTICS_ENABLED": "False",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    log = open(tmp / "app.log", "w")  # noqa: SIM115 - closed below, after the process
    # At the tests' own priority: under `nice` a loaded machine starved it past any deadline while the test waited.
    proc = children.start(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    auth = _auth(extra)
    try:
        deadline = time.monotonic() + 300  # generous: a start on a loaded 2-core machine took over 90 s
        while True:
            assert proc.poll() is None, f"app exited: {(tmp / 'app.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"app not ready: {(tmp / 'app.log').read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                health = httpx.get(f"{url}/api/health", auth=auth, timeout=2)
                if health.is_success and (not ready or health.json()["load_status"] == "ready"):
                    break
            time.sleep(0.5)
        yield url
    finally:
        spawned = child_pids(proc.pid)  # the worker (and multiprocessing's resource tracker)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    try:
        assert proc.returncode == 0, (tmp / "app.log").read_text()[-3000:]
        deadline = time.monotonic() + 5  # they end with the app
        while [pid for pid in spawned if Path(f"/proc/{pid}").exists()] and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in spawned if Path(f"/proc/{pid}").exists()]
        assert not left, f"outlived the app: {left}"
    finally:
        children.stop(proc)  # whatever of its group is left, after an error above too


def child_pids(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(stat.parent.name))
    return pids


def _auth(extra: tuple[str, ...]):
    if "--auth" in extra:
        user, _, password = extra[extra.index("--auth") + 1].partition(":")
        return (user, password)
    return None


def log_in(page, url: str) -> None:
    page.goto(url)
    page.get_by_label("username").fill(AUTH[0])
    page.get_by_label("password").fill(AUTH[1])
    page.get_by_role("button", name="Login").click()


def start_draft(page, db: Path, prompt: str, target: int, done_timeout: float) -> int:
    """Start a draft on the Write tab and wait until it is done; its id. The status line may still show an
    earlier draft (a finished one, or the one a fresh page attaches to) until the click is answered, so this
    waits for a draft newer than any the store held before the click."""
    from playwright.sync_api import expect

    from storage import open_store

    store = open_store(f"sqlite:///{db}")
    try:
        newest = max((g.id for g in store.list_generations()), default=0)
    finally:
        store.close()
    page.locator("#write-prompt textarea").fill(prompt)
    page.locator("#write-target input").fill(str(target))
    page.locator("#write-start").click()
    status = page.locator("#write-status")
    expect(status).to_contain_text("Draft #", timeout=60_000)  # the first start loads the tokenizer
    expect(status).not_to_contain_text(re.compile(rf"Draft #{newest}\b"), timeout=60_000)
    gen_id = int(re.search(r"Draft #(\d+)", status.inner_text()).group(1))
    assert gen_id > newest, status.inner_text()
    # Until it is done, the draft's ticks rewrite the status line that later steps read.
    expect(status).to_contain_text(re.compile(rf"Done.*Draft #{gen_id}\b"), timeout=done_timeout)
    return gen_id
