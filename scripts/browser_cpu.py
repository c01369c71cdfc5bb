"""What the app's page costs the machine it runs on: Chromium's CPU with the Write tab idle and while it follows a
draft, beside the draft's own speed. On a laptop the browser, the app and the worker share the cores the model
writes with, so a page that renders eagerly slows the draft it shows.

    .venv/bin/python scripts/browser_cpu.py --model ../shared/models/stories260k --tokens 4000 --repeats 3 \
        --json runs/browser_cpu.json

Starts `python app.py` (no login, its own store in a temporary folder) and Debian's Chromium through Playwright;
per repeat: Chromium's CPU over --idle-s seconds of an idle page, then a draft of --tokens tokens started from the
Write tab and followed until it is done (Chromium's CPU per second, and the draft's tokens per second from the click
to "Done", with the tokens the status line counts). Prints each repeat and the medians; --json writes them. CPU is
read from /proc for Chromium's processes (the descendants of this one), so nothing else on the machine is counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from studio_process import ARGS, CHROMIUM, REPO, App

PROMPT = "Once upon a time, a little fox found a key by the sea."


def descendants_cpu(root: int, name: str) -> float:
    """CPU seconds (user + system) of the live processes under `root` whose name starts with `name`."""
    hz, parents, cpu = os.sysconf("SC_CLK_TCK"), {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = stat.read_text()
            comm, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            pid = int(stat.parent.name)
            parents[pid] = int(fields[1])
            if comm.startswith(name):
                cpu[pid] = (int(fields[11]) + int(fields[12])) / hz

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == root:
                return True
        return False

    return sum(seconds for pid, seconds in cpu.items() if under(pid))


def one_repeat(browser, url: str, tokens: int, idle_s: float) -> dict:
    from playwright.sync_api import expect

    me = os.getpid()
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(url)
        expect(page.locator("#ts-banner")).to_contain_text("ready", timeout=60_000)
        page.wait_for_timeout(3_000)  # the page's first rendering done
        before, start = descendants_cpu(me, "chrom"), time.monotonic()
        page.wait_for_timeout(idle_s * 1000)
        idle = (descendants_cpu(me, "chrom") - before) / (time.monotonic() - start)
        page.locator("#write-prompt textarea").fill(PROMPT)
        page.locator("#write-target input").fill(str(tokens))
        before, start = descendants_cpu(me, "chrom"), time.monotonic()
        page.locator("#write-start").click()
        status = page.locator("#write-status")
        expect(status).to_contain_text(re.compile(r"Done|Stopped|Failed"), timeout=600_000)
        wall = time.monotonic() - start
        line = status.inner_text()
        written = re.search(r"Done.* ([\d,]+) / [\d,]+ tokens", line)
        if written is None:
            sys.exit(f"the draft did not finish: {line}")
        return {"idle_core": idle, "following_core": (descendants_cpu(me, "chrom") - before) / wall,
                "draft_tokens_per_s": int(written.group(1).replace(",", "")) / wall}
    finally:
        context.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "stories260k"))
    ap.add_argument("--tokens", type=int, default=4000, help="the draft's length")
    ap.add_argument("--idle-s", type=float, default=15.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the rows and medians here")
    args = ap.parse_args()
    if args.repeats < 1 or args.tokens < 1:
        ap.error("--repeats and --tokens: at least 1")
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is absent: install Debian's chromium package")
    from playwright.sync_api import sync_playwright

    rows = []
    with tempfile.TemporaryDirectory() as tmp, App(Path(tmp), 1, args.model, ready_s=300) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            for i in range(args.repeats):
                rows.append(one_repeat(browser, url, args.tokens, args.idle_s))
                r = rows[-1]
                print(f"repeat {i + 1}: Chromium idle {r['idle_core']:.3f} core, following a draft "
                      f"{r['following_core']:.3f} core; the draft {r['draft_tokens_per_s']:.0f} tokens/s", flush=True)
        finally:
            browser.close()
    medians = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    print("| Chromium, idle page (cores) | Chromium, following a draft (cores) | the draft (tokens/s) |")
    print("|---|---|---|")
    print(f"| {medians['idle_core']:.3f} | {medians['following_core']:.3f} | {medians['draft_tokens_per_s']:.0f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
