"""Issue 29's steps of scripts/walkthrough.py (`--issue 29`): DRY and XTC, banned phrases, World Info, alternatives
and branches, presets, each driven in the Write tab as a writer would and checked against what the app stored
(its API and its SQLite file). Each draft is short (100-120 tokens) and starts from OPENING with seed 0."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from playwright.sync_api import expect
from walkthrough_steps import DRAFT_S, SPANS, around, draft_number, start_draft, wait_done

from storage import open_store
from tokenswift.settings import DraftSettings, Settings
from tokenswift.settings.phrases import normal
from tokenswift.text.writing_presets import built_in

if TYPE_CHECKING:
    from walkthrough import Walk

OPENING = ("Elias Marsh climbed the lighthouse stairs as the storm came in from the sea. At the top he stopped, "
           "because the lamp was already lit.")
KEYED = "The lighthouse on Gull Rock is ninety years old; its lamp burns whale oil and can be seen for twenty miles."
CONSTANT = "Elias Marsh is sixty-one, a widower who talks to the gulls and keeps a logbook of every ship."
LORE = {"entries": [
    {"keys": ["lighthouse"], "secondary_keys": [], "content": KEYED, "constant": False, "enabled": True},
    {"keys": [], "secondary_keys": [], "content": CONSTANT, "constant": True, "enabled": True}]}
PRESET = "Creative (XTC)"
BAD_PRESET = {"temperature": 0.7, "temprature": 0.4}  # one known key, one misspelt: the whole file is refused
PANEL = {"temperature": "#write-temperature input[type=number]", "sampler value": "#write-sampler-value input",
         "θ": "#write-theta input", "W": "#write-w input", "DRY strength": "#write-dry-multiplier input",
         "DRY growth": "#write-dry-base input", "DRY look-back": "#write-dry-range input",
         "XTC probability": "#write-xtc-probability input", "XTC threshold": "#write-xtc-threshold input",
         "banned phrases": "#write-ban textarea"}
PROBABILITY = r"· \d+(\.\d+)?%$"  # how an alternative's label ends ("“␣sea” · 12.5%")


# --- helpers -------------------------------------------------------------------------------------------------

def api(w: Walk, path: str, **params) -> dict:
    response = httpx.get(f"{w.url}/api{path}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def stored_settings(w: Walk, gen_id: int) -> Settings:
    """The draft's settings as the store holds them for the worker (the app's own SQLite file)."""
    store = open_store(w.found["db"])
    try:
        return DraftSettings.from_json(store.get_generation(gen_id, with_text=False).settings_json).settings
    finally:
        store.close()


def token_texts(w: Walk, gen_id: int) -> list[str]:
    """Each generated token's text, as the app's alternatives route decodes it (so a divergence has a place)."""
    produced = api(w, f"/generations/{gen_id}")["produced_tokens"]
    return [api(w, f"/generations/{gen_id}/alternatives", position=i)["text"] for i in range(produced)]


def open_box(page, box: str, label: str, inside: str) -> None:
    """Open an accordion unless it is open already (an earlier step may have opened it: a click would close it)."""
    if not page.locator(inside).first.is_visible():
        page.locator(box).get_by_text(label).first.click()
    expect(page.locator(inside).first).to_be_visible()


def open_settings(page) -> None:
    open_box(page, "#write-settings", "Settings (", "#write-theta")
    open_box(page, "#write-dry-xtc", "Repetition and stock phrases", "#write-dry-multiplier")
    open_box(page, "#write-ban-box", "Banned phrases", "#write-ban")


def panel(page) -> dict[str, str]:
    values = {name: page.locator(box).first.input_value() for name, box in PANEL.items()}
    values["sampler"] = page.locator("#write-sampler input:checked").input_value()
    values["DRY breakers"] = [t.strip() for t in page.locator("#write-dry-breakers .token").all_inner_texts()]
    return values


def draft(w: Walk, target: int, title: str) -> int:
    """Start a draft and wait until it is done: its number. The status line first shows the one before, maybe
    Done at the same target, so the new number is waited for first."""
    status = w.page.locator("#write-status")
    before = re.search(r"Draft #(\d+)", status.inner_text())
    start_draft(w.page, OPENING, target, title)
    started = {"timeout": 120_000}  # the first Start loads the tokenizer, on a busy machine
    if before:
        expect(status).not_to_contain_text(f"Draft #{before.group(1)} ", **started)
    expect(status).to_contain_text("Draft #", **started)
    wait_done(w.page, target)
    return draft_number(w.page)


def inputs(w: Walk, name: str, content: dict) -> Path:
    """A file the writer loads (kept beside the screenshots, as evidence)."""
    path = w.out / "inputs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(content, indent=2))
    return path


# --- a: DRY and XTC reach the stored settings ----------------------------------------------------------------

def dry_xtc(w: Walk) -> None:
    page = w.page
    page.get_by_role("tab", name="Write").click()
    page.locator("#write-new").click()
    expect(page.locator("#write-status")).to_contain_text("New book")
    open_settings(page)
    page.locator("#write-prompt-format").get_by_label("Continue my text").check()
    page.locator("#write-seed input").fill("0")
    for box, value in (("dry-multiplier", "0.8"), ("xtc-probability", "0.5"), ("xtc-threshold", "0.1")):
        page.locator(f"#write-{box} input").fill(value)
    gen_id = draft(w, 120, "Issue 29: DRY and XTC")
    body = api(w, f"/generations/{gen_id}")
    kept = stored_settings(w, gen_id)
    want = {"dry_multiplier": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.1}
    got = {name: getattr(kept, name) for name in want}
    shown = panel(page)  # the panel as the finished draft refills it
    page.locator("#write-dry-xtc").scroll_into_view_if_needed()
    shots = [w.shot("29a-dry-xtc.png")]
    w.report("29a", {"the store's settings carry DRY 0.8, XTC 0.5 / 0.1": got == want,
                     "GET /api/generations/{id} shows its settings": "settings" in body,
                     "the panel still shows them": (shown["DRY strength"], shown["XTC probability"],
                                                    shown["XTC threshold"]) == ("0.8", "0.5", "0.1")},
             [f"Draft #{gen_id}: {body['produced_tokens']} / {body['target_tokens']} tokens, {body['status']}",
              f"stored (SQLite settings_json): {got}; DRY base {kept.dry_base}, allowed length "
              f"{kept.dry_allowed_length}, range {kept.dry_range}, breakers {kept.dry_breakers!r}",
              f"GET /api/generations/{gen_id} keys: {sorted(body)}",
              f"continuation, first 160 characters: {''.join(token_texts(w, gen_id))[:160]!r}"], shots)


# --- b: a banned phrase the model writes with this seed is never shown ------------------------------------------

def banned_phrase(w: Walk) -> None:
    page = w.page
    open_settings(page)
    page.locator("#write-ban textarea").fill("")
    free = draft(w, 120, "Issue 29: no bans")
    free_texts = token_texts(w, free)
    phrase, start = pick_phrase("".join(free_texts))
    page.locator("#write-ban textarea").fill(phrase)
    banned = draft(w, 120, "Issue 29: one ban")
    banned_texts = token_texts(w, banned)
    written = "".join(banned_texts)
    shown = page.locator("#write-text textarea").input_value()
    status, speed = page.locator("#write-status").inner_text(), page.locator("#write-speed").inner_text()
    at = next((i for i, (a, b) in enumerate(zip(free_texts, banned_texts, strict=False)) if a != b), None)
    token_start = len("".join(free_texts[:at or 0]))
    where_began = at is not None and token_start <= start < token_start + len(free_texts[at])
    kept = stored_settings(w, banned)
    shots = [w.shot("29b-banned-phrase.png")]
    w.report("29b", {f"the phrase {phrase!r} is in the unbanned draft": bool(phrase),
                     "not in the banned draft (API text, the page's text)": normal(phrase) not in normal(written)
                                                                           and normal(phrase) not in normal(shown),
                     "the drafts are the same up to the token where the phrase began, and differ there": where_began,
                     "the stored settings ban exactly it": kept.ban == (phrase,)},
             [f"unbanned Draft #{free}, banned Draft #{banned}; same opening, seed {kept.seed}, settings but the ban",
              f"phrase begins at character {start} of the unbanned continuation: {around(''.join(free_texts), start)}",
              f"first different token: index {at}, at character {token_start}: unbanned {free_texts[at]!r}, banned "
              f"{banned_texts[at]!r}" if at is not None else "first different token: none (the drafts are equal)",
              f"banned draft there: {around(written, token_start)}",
              f"rewinds shown by the app: {'rewind' in (status + speed).lower()} (status {status[:120]!r}; "
              f"speed {speed[:120]!r}); the API's metrics: {sorted(api(w, f'/generations/{banned}')['metrics'])}"],
             shots)


def pick_phrase(text: str) -> tuple[str, int]:
    """The first three-word run of plain words in `text` not in OPENING, and where it begins ('' if none); from
    the 40th character on, so that the two drafts share some text before it."""
    for found in re.finditer(r"(?=\b([A-Za-z]+ [A-Za-z]+ [A-Za-z]+)\b)", text):
        if found.start() >= 40 and normal(found.group(1)) not in normal(OPENING):
            return found.group(1), found.start()
    return "", -1


# --- c: World Info in what the model sees -------------------------------------------------------------------------

def world_info(w: Walk) -> None:
    page = w.page
    lore = inputs(w, "lorebook.json", LORE)
    open_box(page, "#write-world", "World Info (lorebook)", "#write-world-import")
    with page.expect_file_chooser() as chooser:
        page.locator("#write-world-import").click()
    chooser.value.set_files(str(lore))
    expect(page.locator("#write-status")).to_contain_text("lorebook.json imported: 2 entries")
    gen_id = draft(w, 100, "Issue 29: World Info")
    open_box(page, "#write-seen-box", "What the model sees", "#write-seen-show")
    page.locator("#write-seen-show").click()
    expect(page.locator("#write-seen .ts-seen-world-info").first).to_be_visible()
    pieces = page.eval_on_selector_all("#write-seen .ts-seen > span", SPANS)
    world = [text for cls, text in pieces if cls == "ts-seen-world-info"]
    head = page.locator("#write-seen p").first.inner_text()
    count = re.search(r"World Info ([\d,]+)", head)
    page.locator("#write-seen").scroll_into_view_if_needed()
    shots = [w.shot("29c-world-info-seen.png")]
    stored = api(w, f"/generations/{gen_id}")["world_info"]
    w.report("29c", {"the keyed entry ('lighthouse' is in the opening) is shown as World Info":
                     any(KEYED in text for text in world),
                     "the constant entry is shown as World Info": any(CONSTANT in text for text in world),
                     "the view's head counts World Info tokens and its legend names it":
                     bool(count) and int(count.group(1).replace(",", "")) > 0 and "World Info" in head.split("\n")[-1],
                     "the draft stored both entries": stored is not None and len(stored["entries"]) == 2},
             [f"Draft #{gen_id}; lorebook {lore}", f"view head: {head!r}",
              f"pieces in order: {[cls.removeprefix('ts-seen-') for cls, _ in pieces]}",
              *(f"World Info piece: {text.strip()[:120]!r}" for text in world)], shots)


# --- d: alternatives of a word, a branch from one, and back to the original ------------------------------------

def alternatives_branch(w: Walk) -> None:
    page = w.page
    original = draft_number(page)
    before = api(w, f"/generations/{original}")["text"]
    before_shown = page.locator("#write-text textarea").input_value()
    open_box(page, "#write-branch-box", "Alternatives and branches", "#write-words-show")
    expect(page.locator("#write-branches input")).to_have_value(re.compile(rf"^#{original} original"))
    words, info, options = (page.locator("#write-words .ts-tok"), page.locator("#write-alt-info"),
                            page.locator("#write-alternatives label"))
    expect(words.first).to_be_visible()
    for i in range(words.count()):  # the first word where the model had another likely one
        position = int(words.nth(i).get_attribute("data-pos"))
        words.nth(i).click()
        expect(info).to_contain_text(f"At token {position:,} the model wrote")
        if options.count():
            break
    labels = options.all_inner_texts()
    said = info.inner_text()
    options.first.click()
    page.locator("#write-branch-box").scroll_into_view_if_needed()
    shots = [w.shot("29d-alternatives.png")]
    page.locator("#write-branch").click()
    expect(page.locator("#write-status")).to_contain_text("Branched: Draft #")
    branch = draft_number(page)
    expect(page.locator("#write-status")).to_contain_text("Done", timeout=DRAFT_S * 1000)
    time.sleep(3)
    page.locator("#write-branches input").click()
    listed_at_done = page.locator("#write-branches li").all_inner_texts()
    page.keyboard.press("Escape")
    page.locator("#write-words-show").click()  # "Show the words to click (again, …)" lists the family anew
    time.sleep(2)
    page.locator("#write-branches input").click()
    listed = page.locator("#write-branches li").all_inner_texts()
    shots.append(w.shot("29d-branch-done.png"))
    page.locator("#write-branches li", has_text=f"#{original} original").click()
    expect(page.locator("#write-status")).to_contain_text(f"Draft #{original}")
    expect(page.locator("#write-branches input")).to_have_value(re.compile(rf"^#{original} original"))
    after_shown = page.locator("#write-text textarea").input_value()
    shots.append(w.shot("29d-back-to-original.png"))
    family = api(w, f"/generations/{original}/branches")
    ours = [b for b in family["branches"] if b["id"] == branch]
    probabilities = bool(re.search(r"\(\d+(\.\d+)?%\)", said)) and bool(labels) and all(
        re.search(PROBABILITY, label) for label in labels)
    w.report("29d", {"the word's probability and each alternative's are shown": probabilities,
                     "the branch finished": bool(ours) and ours[0]["status"] == "done"
                                             and ours[0]["produced_tokens"] == ours[0]["target_tokens"],
                     "the branch is listed with the draft": any(f"#{branch} branch of #{original}" in item
                                                                for item in listed),
                     "the original's text is unchanged (API and page)": api(w, f"/generations/{original}")["text"]
                                                                        == before and after_shown == before_shown},
             [f"original Draft #{original}, branch Draft #{branch}: {ours}", f"clicked: {said!r}",
              f"alternatives: {labels[:6]}", f"branches list once the branch was done: {listed_at_done}",
              f"branches list after 'Show the words to click (again…)': {listed}"], shots)


# --- e: a built-in preset, Save preset, a bad preset refused by its key ------------------------------------------

def presets(w: Walk) -> None:
    page = w.page
    open_settings(page)
    page.locator("#write-preset input").click()
    page.get_by_role("option", name=PRESET).click()
    expect(page.locator("#write-status")).to_contain_text(f"Preset {PRESET}")
    time.sleep(1)  # the status line and the boxes are one update; let the boxes draw
    chosen = panel(page)
    creative = built_in()[PRESET]
    page.locator("#write-save-preset").click()
    link = page.locator("#write-preset-file a").first
    expect(link).to_be_visible()
    with page.expect_download() as info:
        link.click()
    saved_path = w.out / "inputs" / info.value.suggested_filename
    saved_path.parent.mkdir(exist_ok=True)
    info.value.save_as(saved_path)
    saved = json.loads(saved_path.read_text())
    bad = inputs(w, "bad-preset.json", BAD_PRESET)
    with page.expect_file_chooser() as chooser:
        page.locator("#write-load-preset").click()
    chooser.value.set_files(str(bad))
    status = page.locator("#write-status")
    expect(status).to_contain_text("Load preset: bad-preset.json")
    time.sleep(1)
    refused = status.inner_text()
    after = panel(page)
    page.locator("#write-settings").scroll_into_view_if_needed()
    shots = [w.shot("29e-presets.png")]
    values = {"temperature": chosen["temperature"], "min-p": chosen["sampler value"], "sampler": chosen["sampler"],
              "XTC": (chosen["XTC probability"], chosen["XTC threshold"])}
    w.report("29e", {f"the panel shows {PRESET}'s values": values == {
                         "temperature": f"{creative['temperature']:g}", "min-p": f"{creative['min_p']:g}",
                         "sampler": "min-p", "XTC": (f"{creative['xtc_probability']:g}",
                                                     f"{creative['xtc_threshold']:g}")},
                     "Save preset downloads it as JSON": saved == creative,
                     "the bad preset's status names the unknown key": "temprature: unknown setting" in refused
                                                                       and "unchanged" in refused,
                     "the panel is unchanged": after == chosen},
             [f"panel after {PRESET}: {values}; DRY {chosen['DRY strength']}",
              f"saved {saved_path.name} ({len(saved)} keys): xtc {saved.get('xtc_probability')}/"
              f"{saved.get('xtc_threshold')}, min_p {saved.get('min_p')}, temperature {saved.get('temperature')}",
              f"bad preset {bad}: {BAD_PRESET}", f"status: {refused.strip()!r}"], shots)


STEPS = [("29a", dry_xtc), ("29b", banned_phrase), ("29c", world_info), ("29d", alternatives_branch),
         ("29e", presets)]
