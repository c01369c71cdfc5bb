"""The app in a real browser: Debian's Chromium driven by Playwright (never a downloaded browser).

Log in, start a draft with Ctrl+Enter and watch text and charts arrive, pause and resume it, run a two-column
comparison, export an EPUB (a real download). Screenshots go to artifacts/screenshots/ for a human to look at.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from conftest import REPO
from test_ui_events import running_app

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
SHOTS = REPO / "artifacts" / "screenshots"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is absent: install Debian's package (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with running_app(tmp_path_factory.mktemp("ui-browser"), "--auth", "ann:secret") as url, \
            sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        context.set_default_timeout(20_000)
        page = context.new_page()
        page.goto(url)
        page.get_by_label("username").fill("ann")
        page.get_by_label("password").fill("secret")
        page.get_by_role("button", name="Login").click()
        sync_api.expect(page.locator("#ts-banner")).to_contain_text("ready", timeout=30_000)
        page.screenshot(path=SHOTS / "01-first-visit.png", full_page=True)
        yield page
        browser.close()


def test_write_pause_resume(page):
    from playwright.sync_api import expect

    status, text = page.locator("#write-status"), page.locator("#write-text textarea")
    page.locator("#write-title input").fill("The Lighthouse")
    page.locator("#write-prompt textarea").fill("Once upon a time, a little fox found a key by the sea.")
    page.locator("#write-target input").fill("1000")
    page.locator("#write-prompt textarea").press("Control+Enter")  # the keybinding starts it
    expect(text).to_have_value(re.compile(r"fox found a key by the sea\.\S*\s*\S+"), timeout=30_000)
    expect(page.locator("#chart-alpha .scatterlayer .trace")).to_have_count(1, timeout=30_000)
    expect(page.locator("#chart-speed .scatterlayer .trace")).to_have_count(1)
    page.locator("#write-pause").click()
    expect(status).to_contain_text("Paused", timeout=30_000)
    expect(page.locator("#write-resume")).to_be_enabled()
    page.screenshot(path=SHOTS / "02-write-paused.png", full_page=True)
    paused_at = int(re.search(r"([\d,]+) / 1,000 tokens", status.inner_text()).group(1).replace(",", ""))
    assert 0 < paused_at < 1000
    page.reload()  # a reopened tab finds its draft where it is
    expect(status).to_contain_text(f"Paused — Draft #1 · {paused_at:,} / 1,000 tokens", timeout=30_000)
    expect(text).to_have_value(re.compile(r"fox found a key"))
    page.locator("#write-resume").click()
    expect(status).to_contain_text("Done", timeout=60_000)
    expect(status).to_contain_text("1,000 / 1,000 tokens")
    page.locator("#write-show-all").click()
    expect(page.locator("#write-full textarea")).to_have_value(re.compile(r"^Once upon a time, a little fox"))
    page.screenshot(path=SHOTS / "03-write-done.png", full_page=True)


def test_compare_two_columns(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("The storm had been building over the harbour for three days.")
    page.locator("#compare-target input").fill("150")
    page.locator("#compare-run").click()
    expect(page.locator("#compare-status")).to_contain_text("3 of 3 runs done", timeout=60_000)
    table = page.locator("#compare-table")
    expect(table).to_contain_text("AR twin of A, B")
    expect(table).to_contain_text("✔ identical")
    assert table.inner_text().count("✔ identical") == 2  # A and B; k changed the speed, not the text
    expect(page.locator("#compare-speed .scatterlayer .trace")).to_have_count(3)
    page.screenshot(path=SHOTS / "04-compare.png", full_page=True)


def test_library_export_epub(page, tmp_path):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Library").click()
    page.locator("#library-book input").click()
    page.get_by_role("option", name=re.compile("The Lighthouse")).click()
    expect(page.locator("#library-title input")).to_have_value("The Lighthouse")
    page.locator("#library-author input").fill("Ann Writer")
    page.locator("#library-export").click()
    link = page.locator("#library-file a").first
    expect(link).to_be_visible()
    with page.expect_download() as info:
        link.click()
    download = info.value
    assert download.suggested_filename == "the-lighthouse.epub"
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    with zipfile.ZipFile(saved) as epub:
        assert epub.read("mimetype") == b"application/epub+zip"
        opf = next(epub.read(n).decode() for n in epub.namelist() if n.endswith(".opf"))
        assert "The Lighthouse" in opf and "Ann Writer" in opf
    page.locator("#library-delete").click()
    expect(page.locator("#library-confirm")).to_contain_text("Delete The Lighthouse")
    page.screenshot(path=SHOTS / "05-library.png", full_page=True)
    page.locator("#library-delete-no").click()
    expect(page.locator("#library-confirm")).to_be_hidden()


def test_model_tab(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Model").click()
    expect(page.locator("#model-path input")).to_have_value(re.compile("stories260k$"))
    expect(page.locator("#model-details")).to_contain_text("ready")
    page.locator("#model-path input").fill("no-such-org/no-such-model")
    page.locator("#model-apply").click()
    expect(page.locator("#model-message")).to_contain_text("not in the local Hugging Face cache")
    page.screenshot(path=SHOTS / "06-model.png", full_page=True)
