"""Polling load against a running draft: does polling slow the writer, and how fast are the polls?

Starts the app as a user would (`app.py`, with its own worker, loopback only) on a scratch store, then
writes the same draft (same prompt, seed and settings) unpolled and with N pollers hammering
GET /api/generations/{id} as fast as they can: `since` pollers pass ?since= (what a client that keeps up
does), `full` pollers ask for the whole text every time. It prints a table and writes JSON: the worker's
tokens/s (from the draft's own decoding time) per run, poll latencies (p50/p95/p99) per polled run, and the
server process's CPU time per poll (Linux /proc; the worker is a process of its own).

    .venv/bin/python scripts/poll_load.py --model ../shared/models/stories260k --pollers 20 --tokens 6000 \
        --json poll_load.json

Bounded: at most 64 pollers and --max-s seconds per run (the draft is cancelled then); the scratch store is
deleted at the end. Target (issue 15): 20 `since` pollers -> p95 < 100 ms and tokens/s within 10% of the
unpolled run. On a machine with fewer cores than pollers + server + worker need, the pollers' own CPU
competes with the worker: say so next to any number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time, there was a little dog named Max. He liked to run in the park"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "stories260k"))
    p.add_argument("--pollers", type=int, default=20)
    p.add_argument("--tokens", type=int, default=6000, help="draft length of each run")
    p.add_argument("--mode", default="tokenswift", choices=("tokenswift", "ar"))
    p.add_argument("--kinds", default="none,since,full", help="runs, in order: none, since, full")
    p.add_argument("--max-s", type=float, default=120.0, help="cancel a run after this long")
    p.add_argument("--threads", type=int, default=1, help="the worker's torch threads")
    p.add_argument("--poller-nice", type=int, default=0,
                   help="nice value added to this (the pollers') process once the app is up, to tell the harness's "
                        "own CPU from the server's on a machine with few cores")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args(argv)
    args.pollers = max(1, min(args.pollers, 64))
    with tempfile.TemporaryDirectory(prefix="tokenswift-poll-load-") as tmp, Servers(Path(tmp), args) as servers:
        os.nice(args.poller_nice)
        results = [run(servers, args, kind) for kind in args.kinds.split(",")]
    report(results, args)
    return 0


class Servers:
    """The app (API + page + its worker) on a scratch store, stopped on exit."""

    def __init__(self, tmp: Path, args):
        self.tmp, self.args, self.procs = tmp, args, []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Servers:
        db = f"sqlite:///{self.tmp / 'studio.db'}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TOKENSWIFT_HOME": str(self.tmp)}
        app = [sys.executable, "app.py", "--db", db, "--host", "127.0.0.1", "--port", str(self.port), "--model",
               self.args.model, "--threads", str(self.args.threads)]
        with open(self.tmp / "app.log", "wb") as out:
            self.procs.append(subprocess.Popen(app, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/api/health", timeout=2).json()["load_status"] == "ready":
                    return self
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.__exit__()
                log = (self.tmp / "app.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"the app did not come up:\n{log}")
            time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()  # the app stops its worker
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None where /proc is absent)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(servers: Servers, args, kind: str) -> dict:
    url, server_pid = servers.url, servers.procs[0].pid
    cpu_before = cpu_s(server_pid)
    body = {"prompt": PROMPT, "max_new_tokens": args.tokens, "mode": args.mode, "seed": 7,
            "settings": {"temperature": 1.0, "min_p": 0.05, "penalty": 1.2, "penalty_window": 256}}
    with httpx.Client(base_url=url, timeout=30) as client:
        gen_id = client.post("/api/generations", json=body).raise_for_status().json()["id"]
        stop = threading.Event()
        latencies: list[list[float]] = [[] for _ in range(args.pollers if kind != "none" else 0)]
        pollers = [threading.Thread(target=poll, args=(url, gen_id, kind, stop, lat)) for lat in latencies]
        for t in pollers:
            t.start()
        deadline = time.monotonic() + args.max_s
        while (gen := client.get(f"/api/generations/{gen_id}?since=999999999").json())["status"] in ("queued",
                                                                                                      "running"):
            if time.monotonic() > deadline:
                client.post(f"/api/generations/{gen_id}/cancel")
            time.sleep(0.2)
        stop.set()
        for t in pollers:
            t.join()
    all_ms = sorted(x * 1000 for lat in latencies for x in lat)
    elapsed = gen["metrics"].get("elapsed_s") or 0.0
    cpu_after = cpu_s(server_pid)
    server_cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return {
        "kind": kind, "pollers": len(latencies), "status": gen["status"], "tokens": gen["produced_tokens"],
        "tokens_per_s": gen["produced_tokens"] / elapsed if elapsed else None, "polls": len(all_ms),
        "p50_ms": pct(all_ms, 50), "p95_ms": pct(all_ms, 95), "p99_ms": pct(all_ms, 99),
        "mean_ms": statistics.fmean(all_ms) if all_ms else None, "server_cpu_s": server_cpu,
        "server_cpu_ms_per_poll": 1000 * server_cpu / len(all_ms) if server_cpu is not None and all_ms else None,
    }


def poll(url: str, gen_id: int, kind: str, stop: threading.Event, latencies: list[float]) -> None:
    since = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            path = f"/api/generations/{gen_id}" + (f"?since={since}" if kind == "since" else "")
            start = time.perf_counter()
            body = client.get(path).json()
            latencies.append(time.perf_counter() - start)
            since = body["next_since"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def report(results: list[dict], args) -> None:
    unpolled = [r["tokens_per_s"] for r in results if r["kind"] == "none" and r["tokens_per_s"]]
    base = statistics.fmean(unpolled) if unpolled else None  # repeat `none` in --kinds to average out noise
    print(f"{args.pollers} pollers (nice +{args.poller_nice}), {args.tokens} tokens per run, {args.mode}, model "
          f"{args.model}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'run':<7}{'status':<10}{'tokens':>8}{'tok/s':>9}{'vs none':>9}{'polls':>8}{'p50 ms':>9}{'p95 ms':>9}"
          f"{'p99 ms':>9}{'srv ms/poll':>13}")
    for r in results:
        ratio = f"{100 * r['tokens_per_s'] / base - 100:+.0f}%" if base and r["tokens_per_s"] else "–"
        cells = [f"{r[k]:.1f}" if r[k] is not None else "–"
                 for k in ("p50_ms", "p95_ms", "p99_ms", "server_cpu_ms_per_poll")]
        speed = f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] else "–"
        print(f"{r['kind']:<7}{r['status']:<10}{r['tokens']:>8}{speed:>9}{ratio:>9}{r['polls']:>8}"
              f"{cells[0]:>9}{cells[1]:>9}{cells[2]:>9}{cells[3]:>13}")
    if args.json_out:
        payload = {"args": vars(args), "cpus": os.cpu_count(), "runs": results}
        Path(args.json_out).write_text(json.dumps(payload, indent=2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
