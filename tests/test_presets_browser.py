"""Presets and the DRY/XTC controls of the Write tab in a real browser (Debian's Chromium through Playwright):
a preset file loaded fills the panel and a draft started has its values; a bad file is refused by its key and
changes nothing; a built-in preset, boxes edited by hand and Save preset reach the draft's stored settings; so do
the banned phrases typed in their box (test_banned.py has the rest of their tests, without a browser)."""

from __future__ import annotations

import json

import pytest
from studio_app import SHOTS, start_draft

from storage import open_store
from tokenswift.settings import DraftSettings, Settings
from tokenswift.settings.phrases import STARTER_BANS
from tokenswift.text.writing_presets import built_in, preset_of

pytestmark = pytest.mark.browser

MINE = {"temperature": 0.6, "top_p": 0.85, "min_p": 0.0, "penalty": 1.25, "penalty_window": 128,
        "dry_multiplier": 1.1, "dry_breakers": ["\n", "."], "xtc_threshold": 0.15, "xtc_probability": 0.3,
        "ban_eos": False}
SLOW = 30_000  # ms: a shared 2-core machine under load answers events late
BOXES = ["#write-theta input", "#write-w input", "#write-sampler-value input", "#write-temperature input",
         "#write-dry-multiplier input", "#write-dry-base input", "#write-xtc-threshold input",
         "#write-xtc-probability input"]


@pytest.fixture(scope="module")
def app(app_page, studio_app):
    """(the page, logged in on the Write tab with its settings open; the app's SQLite file)."""
    app_page.locator("#write-settings").get_by_text("Settings (presets").first.click()
    app_page.locator("#write-dry-xtc").get_by_text("Repetition and stock phrases").first.click()
    return app_page, studio_app.db


def upload(page, path) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#write-load-preset").click()
    chooser.value.set_files(str(path))


def breakers(page) -> list[str]:
    return [t.strip() for t in page.locator("#write-dry-breakers .token").all_inner_texts()]


def panel(page) -> list:
    return [page.locator(box).first.input_value() for box in BOXES] + breakers(page)


def start(page, db, prompt: str) -> Settings:
    """Start a 30-token draft; its settings as the store holds them for the worker."""
    gen_id = start_draft(page, db, prompt, 30, 4 * SLOW)
    store = open_store(f"sqlite:///{db}")
    try:
        return DraftSettings.from_json(store.get_generation(gen_id, with_text=False).settings_json).settings
    finally:
        store.close()


def test_a_loaded_preset_fills_the_panel_and_the_draft_has_it(app, tmp_path):
    from playwright.sync_api import expect

    page, db = app
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(MINE))
    upload(page, path)
    expect(page.locator("#write-status")).to_contain_text("mine.json loaded", timeout=SLOW)
    expect(page.locator("#write-theta input")).to_have_value("1.25")
    expect(page.locator("#write-w input")).to_have_value("128")
    expect(page.locator("#write-sampler").get_by_label("top-p")).to_be_checked()
    expect(page.locator("#write-sampler-value input")).to_have_value("0.85")
    expect(page.locator("#write-temperature input").first).to_have_value("0.6")
    expect(page.locator("#write-past-eos").get_by_label("Stop there")).to_be_checked()
    expect(page.locator("#write-dry-multiplier input")).to_have_value("1.1")
    expect(page.locator("#write-xtc-probability input")).to_have_value("0.3")
    assert breakers(page) == ["\\n", "."]
    page.locator("#write-settings").screenshot(path=SHOTS / "09-preset-loaded.png")
    got = start(page, db, "The lamp in the window was lit.")
    assert preset_of(got) == {**preset_of(got), **MINE}


def test_a_bad_preset_names_its_key_and_changes_nothing(app, tmp_path):
    from playwright.sync_api import expect

    page, _ = app
    status = page.locator("#write-status")
    before = panel(page)
    for name, content, message in (
            ("range.json", {"temperature": 0.4, "dry_base": 0.5}, "dry_base (DRY growth): must be in (1, 10]"),
            ("typo.json", {"temprature": 0.4}, "temprature: unknown setting"),
            ("type.json", {"xtc_probability": "often"},
             'xtc_probability (XTC probability): must be a number, got "often"')):
        path = tmp_path / name
        path.write_text(json.dumps(content))
        upload(page, path)
        expect(status).to_contain_text(f"Load preset: {name}: {message}. The settings are unchanged.", timeout=SLOW)
        assert panel(page) == before


def test_built_in_preset_hand_edits_and_save_reach_the_draft(app, tmp_path):
    from playwright.sync_api import expect

    page, db = app
    page.locator("#write-preset input").click()
    page.get_by_role("option", name="Creative (XTC)").click()
    expect(page.locator("#write-status")).to_contain_text("Preset Creative (XTC)", timeout=SLOW)
    expect(page.locator("#write-xtc-probability input")).to_have_value("0.5")
    expect(page.locator("#write-sampler").get_by_label("min-p")).to_be_checked()
    page.locator("#write-dry-multiplier input").fill("0.5")
    page.locator("#write-dry-range input").fill("100")
    page.locator("#write-xtc-threshold input").fill("0.2")
    page.locator("#write-dry-breakers .token", has_text="*").locator(".token-remove").click()
    page.locator("#write-dry-breakers input").fill("!")
    page.locator("#write-dry-breakers input").press("Enter")
    assert breakers(page) == ["\\n", ":", '"', "!"]
    got = start(page, db, "The wind rose over the moor.")
    want = {**built_in()["Creative (XTC)"], "dry_multiplier": 0.5, "dry_range": 100, "xtc_threshold": 0.2,
            "dry_breakers": ["\n", ":", '"', "!"], "ban": list(STARTER_BANS)}  # the built-in kept the ban box
    assert preset_of(got) == want
    page.locator("#write-save-preset").click()
    link = page.locator("#write-preset-file a").first
    expect(link).to_be_visible(timeout=SLOW)
    with page.expect_download() as info:
        link.click()
    saved = tmp_path / info.value.suggested_filename
    info.value.save_as(saved)
    assert saved.name == "tokenswift-preset.json" and json.loads(saved.read_text()) == want


def test_the_write_tab_s_ban_box_reaches_the_draft_s_settings(app):
    """The banned phrases box starts with the starter list, and what the writer types there is what the worker gets.
    (Last here: the drafts above keep the starter list, which no preset replaces.)"""
    from playwright.sync_api import expect

    page, db = app
    page.locator("#write-ban-box").get_by_text("Banned phrases").first.click()
    box = page.locator("#write-ban textarea")
    expect(box).to_have_value("\n".join(STARTER_BANS))
    box.fill("big tree\n# a comment, not a phrase\n\n  Had fun \n")
    assert start(page, db, "The old lighthouse keeper climbed the stairs and").ban == ("big tree", "Had fun")
