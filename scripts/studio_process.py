"""The app as a user starts it, for the scripts that drive it (walkthrough.py, browser_cpu.py, poll_load.py): a free
port, `python app.py` with its own worker on a scratch store until the worker reports the model loaded, and the
Debian Chromium those scripts open it in."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """`python app.py` with its own worker on a scratch store in `tmp` (model None: the default one); yields its URL
    once the worker reports the model loaded (within ready_s), and stops it (the app stops its worker) on exit."""

    def __init__(self, tmp: Path, threads: int, model: str | None = None, ready_s: float = 900):
        self.tmp, self.threads, self.model, self.ready_s, self.proc = tmp, threads, model, ready_s, None
        self.url = f"http://127.0.0.1:{free_port()}"

    def __enter__(self) -> str:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENSWIFT_HOME": str(self.tmp), "TOKENIZERS_PARALLELISM": "false",
               "GRADIO_ANALYTICS_ENABLED": "False"}
        cmd = [sys.executable, "app.py", "--port", self.url.rsplit(":", 1)[1], "--db",
               f"sqlite:///{self.tmp / 'studio.db'}", "--threads", str(self.threads)]
        if self.model is not None:
            cmd += ["--model", self.model, "--device", "cpu"]
        with open(self.tmp / "app.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_s
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.url}/api/health", timeout=2).json().get("load_status") == "ready":
                    return self.url
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise SystemExit(f"the app did not come up:\n{self.log()}")
            time.sleep(1)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return (self.tmp / "app.log").read_text(errors="replace")[-3000:]
