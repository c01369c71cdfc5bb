"""Polling load against a running draft: does polling slow the writer, and how fast are the polls?

Starts the app as a user would (`app.py`, with its own worker, loopback only) on a scratch store, then
writes the same draft (same prompt, seed and settings) unpolled and with N pollers at full speed on
GET /api/generations/{id}: each sends its next request as soon as the previous answer arrives, and honours
Retry-After when the server's per-address limit answers 429 (as a well-behaved client does). `since` pollers
pass ?since= (a client that keeps up), `wait` pollers long-poll with ?since=N&wait=10 (a client that follows
the draft), `full` pollers ask for the whole text every time. Each poller sends from its own loopback address
(127.0.0.2, 127.0.0.3, ...), so the server sees N clients, each with its own budget, not one. `browser` runs
open N pages of the app in a headless Debian Chromium instead: each page's Write tab follows the running draft, as
a writer watching it would (the page's charts and text redraw on this machine, beside the worker).

It prints a table and writes JSON: the worker's tokens/s (from the draft's own decoding time) per run;
per polled run the answered polls and their latencies (p50/p95/p99), the 429s, and the server process's CPU
time per request (Linux /proc; the worker is a process of its own). A long-poll's latency is mostly its wait
for the worker's next commit, by design: for `wait` runs the table's latencies say how fresh the text is.

    .venv/bin/python scripts/poll_load.py --model ../shared/models/stories260k --pollers 20 --tokens 6000 \
        --json poll_load.json
    .venv/bin/python scripts/poll_load.py --kinds none,since,wait,none --status-reads-per-s 0   # no limit
    .venv/bin/python scripts/poll_load.py --model DEFAULT --threads 0 --pollers 1 --tokens 1000 --max-s 600 \
        --kinds none,browser,none --repeat 2   # the cost of watching: the default model, the app's threads

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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from studio_process import free_port

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time, there was a little dog named Max. He liked to run in the park"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "stories260k"),
                   help="a model path, or DEFAULT for the app's default model")
    p.add_argument("--pollers", type=int, default=20)
    p.add_argument("--tokens", type=int, default=6000, help="draft length of each run")
    p.add_argument("--mode", default="tokenswift", choices=("tokenswift", "ar"))
    p.add_argument("--kinds", default="none,since,wait,full",
                   help="runs, in order: none, since, wait, full (repeat `none` to average the unpolled speed)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the --kinds sequence this many times (e.g. none,since,none x3 on a busy machine)")
    p.add_argument("--max-s", type=float, default=120.0, help="cancel a run after this long")
    p.add_argument("--threads", type=int, default=1, help="the worker's torch threads (0: the app's own choice)")
    p.add_argument("--poller-nice", type=int, default=0,
                   help="nice value added to this (the pollers') process once the app is up, to tell the harness's "
                        "own CPU from the server's on a machine with few cores")
    p.add_argument("--status-reads-per-s", type=float,
                   help="the app's per-address limit on status reads (default: the app's; 0: no limit)")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args(argv)
    args.pollers = max(1, min(args.pollers, 64))  # also keeps the source addresses within 127.0.0.0/8
    with tempfile.TemporaryDirectory(prefix="tokenswift-poll-load-") as tmp, Servers(Path(tmp), args) as servers:
        os.nice(args.poller_nice)
        kinds = args.kinds.split(",") * max(1, args.repeat)
        results = [run(servers, args, kind) for kind in kinds]
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
        app = [sys.executable, "app.py", "--db", db, "--host", "127.0.0.1", "--port", str(self.port)]
        if self.args.model != "DEFAULT":
            app += ["--model", self.args.model]
        if self.args.threads:
            app += ["--threads", str(self.args.threads)]
        if self.args.status_reads_per_s is not None:
            app += ["--status-reads-per-s", str(self.args.status_reads_per_s)]
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


def cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (None where /proc is absent)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pid(pid: int) -> int | None:
    """The app's worker process, to tell its CPU time from the server's: the child that multiprocessing
    spawned to run the worker (not its resource tracker)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmdline:
                return int(child)
    except OSError:
        return None
    return None


def run(servers: Servers, args, kind: str) -> dict:
    url, server_pid = servers.url, servers.procs[0].pid
    worker_pid = child_pid(server_pid)
    cpu_before, worker_before, client_before = cpu_s(server_pid), cpu_s(worker_pid), time.process_time()
    load = os.getloadavg()[0]  # of the last minute: what else ran on the machine just before this run
    body = {"prompt": PROMPT, "max_new_tokens": args.tokens, "mode": args.mode, "seed": 7,
            "settings": {"temperature": 1.0, "min_p": 0.05, "penalty": 1.2, "penalty_window": 256}}
    with httpx.Client(base_url=url, timeout=30) as client:
        gen_id = client.post("/api/generations", json=body).raise_for_status().json()["id"]
        started = time.monotonic()
        stop = threading.Event()
        watching = contextlib.ExitStack()
        if kind == "browser":
            watching.enter_context(browser_pages(url, args.pollers))
        tallies = [Tally() for _ in range(args.pollers if kind not in ("none", "browser") else 0)]
        pollers = [threading.Thread(target=poll, args=(url, gen_id, kind, stop, tally, f"127.0.0.{2 + i}"))
                   for i, tally in enumerate(tallies)]
        for t in pollers:
            t.start()
        deadline = time.monotonic() + args.max_s
        while (gen := client.get(f"/api/generations/{gen_id}?since=999999999").json())["status"] in ("queued",
                                                                                                      "running"):
            if time.monotonic() > deadline:
                client.post(f"/api/generations/{gen_id}/cancel")
            time.sleep(0.5)  # well within the per-address limit (this client is 127.0.0.1)
        stop.set()
        watching.close()
        wall = time.monotonic() - started
        for t in pollers:
            t.join()
    all_ms = sorted(x * 1000 for tally in tallies for x in tally.answered)
    refused_ms = sorted(x * 1000 for tally in tallies for x in tally.refused)
    elapsed = gen["metrics"].get("elapsed_s") or 0.0
    cpu_after = cpu_s(server_pid)
    server_cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    worker_after, client_cpu = cpu_s(worker_pid), time.process_time() - client_before
    worker_cpu = worker_after - worker_before if worker_before is not None and worker_after is not None else None
    return {
        "kind": kind, "pollers": len(tallies), "status": gen["status"], "tokens": gen["produced_tokens"],
        "tokens_per_s": gen["produced_tokens"] / elapsed if elapsed else None, "polls": len(all_ms),
        "p50_ms": pct(all_ms, 50), "p95_ms": pct(all_ms, 95), "p99_ms": pct(all_ms, 99),
        "mean_ms": statistics.fmean(all_ms) if all_ms else None, "refused_429": len(refused_ms),
        "refused_p95_ms": pct(refused_ms, 95), "server_cpu_s": server_cpu, "client_cpu_s": client_cpu,
        "worker_cpu_s": worker_cpu, "wall_s": wall, "load_before": load, "answered_ms": all_ms,
        "server_cpu_ms_per_request": (1000 * server_cpu / (len(all_ms) + len(refused_ms))
                                      if server_cpu is not None and all_ms else None),
    }


@contextlib.contextmanager
def browser_pages(url: str, count: int):
    """`count` pages of the app in a headless Debian Chromium, each on the Write tab (which follows the draft
    being written); the pages keep redrawing on their own while this process waits."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            for _ in range(count):
                browser.new_page(viewport={"width": 1280, "height": 900}).goto(url)
            yield
        finally:
            browser.close()


class Tally:
    """One poller's request latencies in seconds: answered (200) and refused (429)."""

    def __init__(self):
        self.answered: list[float] = []
        self.refused: list[float] = []


def poll(url: str, gen_id: int, kind: str, stop: threading.Event, tally: Tally, address: str) -> None:
    """A client at full speed: the next request as soon as the answer arrives, after Retry-After on a 429."""
    since = 0
    query = {"since": "?since={}", "wait": "?since={}&wait=10", "full": ""}[kind]
    transport = httpx.HTTPTransport(local_address=address)  # a client address of its own
    with httpx.Client(base_url=url, timeout=30, transport=transport) as client:
        while not stop.is_set():
            start = time.perf_counter()
            response = client.get(f"/api/generations/{gen_id}" + query.format(since))
            took = time.perf_counter() - start
            if response.status_code == 429:
                tally.refused.append(took)
                stop.wait(float(response.headers["retry-after"]))
                continue
            tally.answered.append(took)
            body = response.raise_for_status().json()
            if body["status"] not in ("queued", "running"):
                return  # the draft is finished: a client that follows it stops asking
            since = body["next_since"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def neighbours(results: list[dict], i: int) -> float | None:
    """Mean tokens/s of the unpolled runs just before and after run i: on a machine others use too, the
    speed drifts by tens of percent within minutes, so a polled run is compared with the runs around it."""
    near = []
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(results) and results[j]["kind"] != "none":
            j += step
        if 0 <= j < len(results) and results[j]["tokens_per_s"]:
            near.append(results[j]["tokens_per_s"])
    return statistics.fmean(near) if near else None


def report(results: list[dict], args) -> None:
    for i, r in enumerate(results):
        base = neighbours(results, i) if r["kind"] != "none" else None
        r["vs_unpolled_around"] = r["tokens_per_s"] / base - 1 if base and r["tokens_per_s"] else None
    print(f"{args.pollers} pollers (nice +{args.poller_nice}), {args.tokens} tokens per run, {args.mode}, model "
          f"{args.model}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    limit = "app default" if args.status_reads_per_s is None else f"{args.status_reads_per_s:g}/s"
    print(f"status read limit per poller address: {limit}")
    print(f"{'run':<7}{'status':<10}{'tokens':>8}{'tok/s':>9}{'vs none':>9}{'polls':>8}{'429s':>7}{'p50 ms':>9}"
          f"{'p95 ms':>9}{'p99 ms':>9}{'srv ms/req':>12}{'worker cpu':>12}{'clients cpu':>13}")
    # worker cpu: the worker's CPU seconds per wall second of the run (1.0: a core to itself the whole time);
    # clients cpu: the pollers' own CPU seconds (this process), which a real deployment spends elsewhere.
    for r in results:
        ratio = f"{100 * r['vs_unpolled_around']:+.0f}%" if r["vs_unpolled_around"] is not None else "–"
        cells = [f"{r[k]:.1f}" if r[k] is not None else "–"
                 for k in ("p50_ms", "p95_ms", "p99_ms", "server_cpu_ms_per_request")]
        speed = f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] else "–"
        print(f"{r['kind']:<7}{r['status']:<10}{r['tokens']:>8}{speed:>9}{ratio:>9}{r['polls']:>8}"
              f"{r['refused_429']:>7}{cells[0]:>9}{cells[1]:>9}{cells[2]:>9}{cells[3]:>12}"
              f"{share(r['worker_cpu_s'], r['wall_s']):>12}{r['client_cpu_s']:>12.1f}s")
    print("vs none: against the mean of the unpolled runs just before and after (load average before each run: "
          + ", ".join(f"{r['load_before']:.1f}" for r in results) + ")")
    summary = {}
    for kind in dict.fromkeys(r["kind"] for r in results if r["kind"] != "none"):
        runs = [r for r in results if r["kind"] == kind]
        ratios = [r["vs_unpolled_around"] for r in runs if r["vs_unpolled_around"] is not None]
        pooled = sorted(x for r in runs for x in r["answered_ms"])
        summary[kind] = {"runs": len(runs), "median_vs_unpolled": statistics.median(ratios) if ratios else None,
                         "p95_ms": pct(pooled, 95), "answered": len(pooled),
                         "refused_429": sum(r["refused_429"] for r in runs)}
        median = f"{100 * summary[kind]['median_vs_unpolled']:+.1f}%" if ratios else "–"
        p95 = f"{summary[kind]['p95_ms']:.1f} ms" if pooled else "–"
        print(f"{kind}: {len(runs)} runs, tokens/s vs the unpolled runs around them (median) {median}, "
              f"p95 of {len(pooled)} answered polls {p95}, {summary[kind]['refused_429']} answered 429")
    for r in results:
        del r["answered_ms"]
    if args.json_out:
        payload = {"args": vars(args), "cpus": os.cpu_count(), "runs": results, "summary": summary}
        Path(args.json_out).write_text(json.dumps(payload, indent=2))


def share(cpu: float | None, wall: float) -> str:
    return f"{cpu / wall:.2f}" if cpu is not None and wall else "–"


if __name__ == "__main__":
    sys.exit(main())
