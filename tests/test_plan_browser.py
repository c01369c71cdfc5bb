"""The Plan tab in a real browser (Debian's Chromium, the shared app on stories260k): a three-chapter plan, two
chapters written, one of them opened in the Write tab and edited there, and the book exported by chapters. The
screenshots of the plan and of a chapter in the Write tab go to artifacts/screenshots/."""

from __future__ import annotations

import re
import zipfile

import pytest
from studio_app import SHOTS

from storage import open_store

pytestmark = pytest.mark.browser

NO_TOASTS = ".toast-wrap { display: none !important; }"
WRITTEN = re.compile(r"(?<!not )written")  # the State column: "written", not "not written"
CHAPTERS = (("Arrival", "Lily comes to the lighthouse\nThe keeper shows her the lamp"),
            ("The Storm", "A storm breaks\nLily keeps the lamp lit"),
            ("The Diary", "Lily finds the old keeper's diary"))


def chapter_row(page, number: int):
    return page.locator("#plan-chapters tbody tr").nth(number - 1)


def choose_chapter(page, label: str) -> None:
    from playwright.sync_api import expect

    page.locator("#plan-chapter input").click()
    page.get_by_role("option", name=label).click()
    expect(page.locator("#plan-write")).to_have_text(f"Write chapter {label.split('.')[0]}")


def write_chapter(page, label: str) -> None:
    from playwright.sync_api import expect

    choose_chapter(page, label)
    page.locator("#plan-target input").fill("30")
    page.locator("#plan-write").click()
    number = int(label.split(".")[0])
    expect(page.locator("#plan-status")).to_contain_text(f"Writing chapter {number}")
    expect(chapter_row(page, number)).to_contain_text(WRITTEN, timeout=120_000)  # the list refreshes by itself


def test_a_plan_written_by_chapters_edited_and_exported(app_page, studio_app, tmp_path):
    from playwright.sync_api import expect

    page, status = app_page, app_page.locator("#plan-status")
    page.get_by_role("tab", name="Plan").click()
    page.locator("#plan-new-title input").fill("The Keeper's Diary")
    page.locator("#plan-new").click()
    expect(status).to_contain_text("Made “The Keeper's Diary”")
    page.locator("#plan-premise textarea").fill("A girl keeps a lighthouse through one winter and learns its secret.")
    page.locator("#plan-char-name input").fill("Lily")
    page.locator("#plan-char-description textarea").fill("a girl of twelve, brave and curious")
    page.locator("#plan-char-keys input").fill("the girl")
    page.locator("#plan-char-save").click()  # leaving the premise box saved it first
    expect(page.locator("#plan-characters")).to_contain_text("a girl of twelve")
    for number, (title, beats) in enumerate(CHAPTERS, 1):
        page.locator("#plan-chapter-title input").fill(title)
        page.locator("#plan-chapter-beats textarea").fill(beats)
        page.locator("#plan-add").click()
        expect(status).to_contain_text(f"Added chapter {number}, “{title}”")
    page.locator("#plan-up").click()  # the chapter just added is the chosen one
    expect(status).to_contain_text("“The Diary” is chapter 2 now")
    page.locator("#plan-down").click()
    expect(status).to_contain_text("“The Diary” is chapter 3 now")

    write_chapter(page, "1. Arrival")
    write_chapter(page, "2. The Storm")
    expect(chapter_row(page, 3)).to_contain_text("not written")
    page.screenshot(path=SHOTS / "plan-01-plan.png", full_page=True, style=NO_TOASTS)

    store = open_store(f"sqlite:///{studio_app.db}")
    try:
        plan = next(store.plan(b.id) for b in store.list_sessions() if b.title == "The Keeper's Diary")
        assert plan.premise.startswith("A girl keeps a lighthouse")
        first, second = (store.get_generation(c.draft_id) for c in plan.chapters[:2])
        # stories260k has no chat template: a chapter continues its heading, the beats in the Author's Note, the
        # premise and the last chapter's end in the Memory.
        assert second.prompt_text == "Chapter 2: The Storm\n\n" and "Lily keeps the lamp lit" in second.authors_note
        assert second.memory.startswith(plan.premise) and first.text.strip()[-40:] in second.memory
        assert second.origin == "chapter" and '"Lily"' in second.world_info

        choose_chapter(page, "2. The Storm")
        page.locator("#plan-open").click()
        expect(page.locator("#write-status")).to_contain_text(f"Draft #{second.id}")
        page.screenshot(path=SHOTS / "plan-02-chapter-in-write.png", full_page=True, style=NO_TOASTS)
        page.locator("#write-edit").click()
        editor = page.locator("#write-editor textarea")
        expect(editor).to_have_value(re.compile(r"^Chapter 2: The Storm"))
        editor.fill("Chapter 2: The Storm\n\nThe wind came off the sea at dusk, and Lily climbed to the lamp.")
        page.locator("#write-save-edit").click()
        expect(page.locator("#write-status")).to_contain_text("Saved your edit as Draft #")
        edit = store.plan(plan.book.id).chapters[1].draft_id
        assert edit != second.id and store.get_generation(edit).parent_id == second.id  # the chapter follows it
    finally:
        store.close()

    page.get_by_role("tab", name="Plan").click()
    expect(chapter_row(page, 2)).to_contain_text(f"#{edit}")
    expect(chapter_row(page, 2)).to_contain_text("14")  # the edit's words, its heading not counted
    page.locator("#plan-export").click()
    link = page.locator("#plan-file a").first
    expect(link).to_be_visible()
    with page.expect_download() as info:
        link.click()
    assert info.value.suggested_filename == "the-keeper-s-diary.epub"
    saved = tmp_path / "book.epub"
    info.value.save_as(saved)
    with zipfile.ZipFile(saved) as epub:
        nav = epub.read("OEBPS/nav.xhtml").decode()
        storm = epub.read("OEBPS/chapter-002.xhtml").decode()
    assert re.findall(r"<a href=\"[^\"]+\">([^<]+)</a>", nav) == ["Chapter 1: Arrival", "Chapter 2: The Storm"]
    assert "The wind came off the sea at dusk" in storm and storm.count("The Storm") == 2  # its title, its heading
