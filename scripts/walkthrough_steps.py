"""The steps of scripts/walkthrough.py: each drives the page as a writer would, then reports one PASS/FAIL line
(Walk.report) with its evidence and screenshots. Selectors are the app's elem_ids, as tests/test_ui_browser.py uses
them. `w.found` carries what a later step needs (the instruction draft's story, its draft number)."""

from __future__ import annotations

import html
import io
import re
import time
import zipfile
from typing import TYPE_CHECKING

from playwright.sync_api import expect

from tokenswift.settings import Settings

if TYPE_CHECKING:
    from walkthrough import Walk

DRAFT_S = 900  # the longest a short draft may take on a busy machine
INSTRUCTION = ("Write the opening scene of a story about an old lighthouse keeper who finds a message in a "
               "bottle.")
MEMORY = ("The keeper is Elias Marsh, sixty-one, a widower who talks to the gulls. The lighthouse stands on a "
          "rocky island off the coast of Cornwall in 1898.")
NOTE = "Keep the tone quiet and melancholy; describe the sea."
TITLE = "The Lighthouse Keeper"
NEW_SENTENCE = "He read the message twice, folded it into his coat and climbed the stairs alone."
CHAT_OPENERS = ("Sure", "Certainly", "Of course", "Here is", "Here's", "I'd be happy", "As an AI", "Bonjour")
KNOWN_WORDS_GOAL = 0.95  # issue 28's goal for the default settings
TRACKER = r"^(processing \| )?[\d.]+(/[\d.]+)?s\s+"  # Gradio's update timer in a component's text ("0.4/0.4s")
SPANS = "els => els.map(e => [e.className, e.textContent])"
# The share of an element's box inside the viewport (what Playwright's to_be_in_viewport(ratio=…) measures).
VISIBLE_SHARE = """e => { const r = e.getBoundingClientRect();
  const seen = Math.min(r.bottom, innerHeight) - Math.max(r.top, 0); return Math.max(0, seen) / r.height; }"""


# --- helpers -------------------------------------------------------------------------------------------------

def wait_done(page, target: int) -> list[str]:
    """Wait until the Write tab's draft is Done at its target; the speed lines shown while it was writing."""
    status, speed, lines = page.locator("#write-status"), page.locator("#write-speed"), []
    deadline = time.monotonic() + DRAFT_S
    while not ("Done" in (text := status.inner_text()) and f"{target:,} / {target:,} tokens" in text):
        assert not re.search(r"Failed|Stopped|Paused", text), f"the draft stopped: {text}"
        assert time.monotonic() < deadline, f"not done after {DRAFT_S} s: {text}"
        line = re.sub(TRACKER, "", speed.inner_text().strip())
        if "Writing" in text and line and line not in lines:
            lines.append(line)
        time.sleep(1)
    return lines


def draft_number(page) -> int:
    return int(re.search(r"Draft #(\d+)", page.locator("#write-status").inner_text()).group(1))


def whole_text(page) -> tuple[str, list[tuple[str, str]]]:
    """The Write tab's "Show whole text": its text and its (class, text) spans (opening, model, edits)."""
    full = page.locator("#write-full .ts-whole")
    if not full.is_visible():
        page.locator("#write-show-all").click()
    expect(full).to_be_visible()
    spans = page.eval_on_selector_all("#write-full .ts-whole > span", SPANS)
    return full.text_content(), [tuple(s) for s in spans]


def checked(page, elem: str) -> str:
    return page.locator(f"{elem} input:checked").input_value()


def around(text: str, at: int, chars: int = 30) -> str:
    return repr(text[max(0, at - chars):at]) + " | " + repr(text[at:at + chars])


def start_draft(page, prompt: str, target: int, title: str) -> None:
    page.locator("#write-title input").fill(title)
    page.locator("#write-prompt textarea").fill(prompt)
    page.locator("#write-target input").fill(str(target))
    page.locator("#write-prompt textarea").press("Control+Enter")  # the keybinding starts it


# --- 1, 8, 11: a draft with the default settings -----------------------------------------------------------

def defaults_write_english(w: Walk) -> None:
    page = w.page
    page.locator("#write-settings").get_by_text(re.compile(r"^Settings \(")).first.click()  # opened for the picture
    value = {name: page.locator(f"#write-{name} input[type=number]").input_value()
             for name in ("temperature", "sampler-value", "theta", "w")}
    form = {"mode": checked(page, "#write-mode"), "prompt": checked(page, "#write-prompt-format"),
            "sampler": checked(page, "#write-sampler"), **value}
    start_draft(page, w.opening, 300, "Armadale, continued")
    w.found["running speed lines"] = wait_done(page, 300)
    w.found["default draft"] = draft_number(page)
    shots = [w.shot("01-default-draft.png")]
    _, spans = whole_text(page)
    written = "".join(text for cls, text in spans if cls == "ts-src-ai")
    known = w.known(written)
    lines = [line for line in written.strip().splitlines() if line.strip()]
    shots.append(w.shot("01b-default-draft-whole-text.png"))
    w.report("1", {f"known words ≥ {KNOWN_WORDS_GOAL:.0%}": known >= KNOWN_WORDS_GOAL,
                   "the draft continues the opening": bool(written.strip())},
             [f"form defaults: {form}", f"opening: eval book 0, {len(w.opening)} characters",
              f"known words {known:.1%} of {len(re.findall(r'[A-Za-z]+', written))} words (vocabulary of the 10 eval "
              "books, scripts/prose_quality.known_share)",
              f"first 200 characters: {written[:200]!r}", *(f"line: {line[:160]}" for line in lines[:4])], shots)


def speed_line_final(w: Walk) -> None:
    line = w.page.locator("#write-speed").inner_text().strip()
    running = w.found.get("running speed lines", [])
    w.report("8", {"final figures ('on this draft (N tokens in …)')": "on this draft (" in line,
                   "no 'so far' once done": "so far" not in line},
             [f"finished: {line!r}", *(f"while writing: {seen!r}" for seen in running[:3])],
             [w.shot("08-speed-line-final.png")])


def small_ones(w: Walk) -> None:
    page = w.page
    page.locator("#write-edit").click()
    editor = page.locator("#write-editor textarea")
    expect(editor).to_be_visible()
    text = editor.input_value()
    found = next(m for m in re.finditer(r"\b[a-z]{5,}\b", text) if m.start() > len(w.opening) + 40)
    word = "lantern" if found.group() != "lantern" else "beacon"
    editor.fill(text[:found.start()] + word + text[found.end():])
    page.set_viewport_size({"width": 1400, "height": 500})  # the editor is taller than the screen
    page.locator("#write-save-edit").scroll_into_view_if_needed()  # as a writer who read down to Save
    page.locator("#write-save-edit").click()
    expect(page.locator("#write-status")).to_contain_text("Saved your edit as Draft #")
    time.sleep(1)  # the page brings the saved draft back into view 100 ms after it redrew
    in_view = page.locator("#write-text").evaluate(VISIBLE_SHARE)
    shots = [w.shot("11a-after-save-viewport.png", full_page=False)]
    page.set_viewport_size(w.VIEW)
    _, spans = whole_text(page)
    marked = [text for cls, text in spans if cls == "ts-src-edit"]
    shots.append(w.shot("11b-one-word-marked.png"))
    write_label = page.locator("#write-target [data-testid=block-info]").text_content().strip()
    page.get_by_role("tab", name="Library").click()
    library_label = page.locator("#library-extend [data-testid=block-info]").text_content().strip()
    shots.append(w.shot("11c-library-target-label.png"))
    page.get_by_role("tab", name="Write").click()
    w.report("11", {"only the changed word is marked": [m.strip() for m in marked] == [word],
                    "the saved text stays in view (≥ 90% of its box)": in_view >= 0.9,
                    "Library says 'Target length (new tokens)'": library_label == "Target length (new tokens)"},
             [f"edit: {found.group()!r} -> {word!r}; marked as edits: {marked!r}",
              f"after Save at 1400x500: {in_view:.0%} of the draft's box is in the viewport",
              f"Library label {library_label!r}; Write label {write_label!r}"], shots)



# --- 2+3, 4: an instruction draft with Memory and Author's Note, edited, continued, exported -------------------

def instruction_draft(w: Walk) -> None:
    page = w.page
    page.locator("#write-new").click()
    expect(page.locator("#write-status")).to_contain_text("New book")  # its reply resets the title: fill after
    page.locator("#write-prompt-format").get_by_label("Follow my instruction").check()
    page.locator("#write-context").get_by_text("Memory and Author's Note").first.click()
    page.locator("#write-memory textarea").fill(MEMORY)
    page.locator("#write-note textarea").fill(NOTE)
    start_draft(page, INSTRUCTION, 200, TITLE)
    wait_done(page, 200)
    shots = [w.shot("02-instruction-draft.png")]
    seen, seen_shot = model_sees(w)
    shots.append(seen_shot)
    edited, replaced = edit_last_sentence(w)
    shots.append(w.shot("02b-instruction-edited.png"))
    page.locator("#write-target input").fill("100")
    page.locator("#write-continue").click()
    wait_done(page, 100)
    w.found["draft"] = draft_number(page)
    story, _ = whole_text(page)
    w.found["story"] = story
    shots.append(w.shot("02c-instruction-continued.png"))
    joined = story.startswith(edited)
    more = story[len(edited):] if joined else ""
    spaced = bool(more) and (edited[-1].isspace() or more[0].isspace())
    chat = [opener for opener in CHAT_OPENERS if more.strip().lower().startswith(opener.lower())]
    w.report("2+3", {"Memory inside the system turn": seen["memory"],
                     "the note a user turn just before the story": seen["note"],
                     f"the note ≤ note_depth ({Settings.note_depth}) tokens before the end": seen["near the end"],
                     "the continuation extends the edited story": joined and bool(more.strip()),
                     "a space or newline at the join": spaced,
                     "no new chat answer, no 'Bonjour'": not chat and "bonjour" not in more.lower()
                                                         and "<|im_" not in story},
             [*seen["evidence"],
              f"edit: {replaced!r} -> {NEW_SENTENCE!r} (the draft's last whole sentence; on a line of its own)",
              f"join (Draft #{w.found['draft']}): {around(story, len(edited))}",
              f"continuation, first 200 characters: {more[:200]!r}"], shots)


def model_sees(w: Walk) -> tuple[dict, object]:
    """Open "What the model sees" on the draft: where Memory and note sit among the chat turns."""
    page = w.page
    page.locator("#write-seen-box").get_by_text("What the model sees").first.click()
    page.locator("#write-seen-show").click()
    expect(page.locator("#write-seen .ts-seen-memory")).to_be_visible()
    pieces = [(cls.removeprefix("ts-seen-"), text)
              for cls, text in page.eval_on_selector_all("#write-seen .ts-seen > span", SPANS)]
    kinds = [kind for kind, _ in pieces]
    status = page.locator("#write-status").inner_text()
    recent = int(re.search(r"last ([\d,]+) tokens", status).group(1).replace(",", ""))  # the story in view
    memory, note = kinds.index("memory"), kinds.index("note")
    before_memory, before_note = pieces[memory - 1][1], pieces[note - 1][1]
    after_note = "".join(text for _, text in pieces[note + 1:])
    page.locator("#write-seen").scroll_into_view_if_needed()
    picture = w.shot("03-what-the-model-sees.png")
    return {"memory": pieces[memory][1].strip() == MEMORY and before_memory.rstrip().endswith("system"),
            "note": NOTE in pieces[note][1] and "<|im_start|>user" in before_note[-20:] + pieces[note][1]
                    and set(kinds[note + 1:]) <= {"frame", "story"},
            "near the end": "story" not in kinds[:note] and recent <= Settings.note_depth,
            "evidence": [f"seen, pieces in order: {kinds}", f"seen: memory after {before_memory[-40:]!r}",
                         f"seen: note {pieces[note][1].strip()!r} after {before_note[-30:]!r}",
                         f"seen: after the note the assistant turn and the whole story in view ({recent} tokens, "
                         f"{len(after_note)} characters): {after_note[:60]!r}…"]}, picture


def edit_last_sentence(w: Walk) -> tuple[str, str]:
    """Replace the draft's last whole sentence (dropping an unfinished one after it) by NEW_SENTENCE on a line of its
    own, after a single newline (a paragraph as the model often writes one), and save: (saved, replaced)."""
    page = w.page
    page.locator("#write-edit").click()
    editor = page.locator("#write-editor textarea")
    expect(editor).to_be_visible()
    text = editor.input_value()
    assert INSTRUCTION not in text, f"the editor holds the instruction: {text[:200]!r}"
    ends = [m.end() for m in re.finditer(r"[.!?][\"”’']?(?=\s|$)", text)]
    assert len(ends) >= 2, f"fewer than two sentences to edit: {text!r}"
    start = ends[-2] + len(re.match(r"\s*", text[ends[-2]:]).group())
    edited = text[:ends[-2]] + "\n" + NEW_SENTENCE
    editor.fill(edited)
    page.locator("#write-save-edit").click()
    expect(page.locator("#write-status")).to_contain_text("Saved your edit as Draft #")
    return edited, text[start:ends[-1]]


def exports(w: Walk) -> None:
    import docx

    page, story = w.page, w.found["story"]
    page.get_by_role("tab", name="Library").click()
    expect(page.locator("#library-title input")).to_have_value(TITLE)
    expect(page.locator("#library-draft input")).to_have_value(re.compile(f"^#{w.found['draft']} "))
    files = {fmt: download(w, fmt) for fmt in ("TXT", "DOCX", "EPUB")}
    shots = [w.shot("04-library-export.png")]
    lines = [line.strip() for line in story.split("\n") if line.strip()]
    gaps = re.findall(r"\n+", story.strip())
    breaks = {"single": gaps.count("\n"), "blank": len(gaps) - gaps.count("\n")}
    txt = files["TXT"].decode()
    document = docx.Document(io.BytesIO(files["DOCX"]))
    body = [p.text for p in document.paragraphs if p.style.name == "Normal"]
    epub = zipfile.ZipFile(io.BytesIO(files["EPUB"]))
    chapters = "".join(epub.read(n).decode() for n in sorted(epub.namelist()) if re.search(r"chapter-\d+\.xhtml$", n))
    epub_paras = [html.unescape(p) for p in re.findall(r"<p>(.*?)</p>", chapters, flags=re.S)]
    instruction_out = all(INSTRUCTION[:40] not in text for text in (txt, " ".join(body), chapters))
    w.report("4", {"no instruction in TXT/DOCX/EPUB": instruction_out,
                   "each book starts with the story": txt_story_start(txt, lines) and body[:1] == lines[:1]
                                                       and epub_paras[:1] == lines[:1],
                   "the model's single-newline paragraphs stay paragraphs (DOCX, EPUB)": body == lines
                                                       and epub_paras == lines},
             [f"story: {len(lines)} lines, broken by {breaks['single']} single newline(s) and {breaks['blank']} blank "
              f"line(s); DOCX {len(body)} body paragraphs, EPUB {len(epub_paras)}",
              f"TXT begins: {txt[:200]!r}", *(f"DOCX paragraph {i + 1}: {p[:150]!r}" for i, p in enumerate(body[:4])),
              f"files: {', '.join(str(w.out / 'exports' / name) for name in w.found['exports'])}"], shots)


def txt_story_start(txt: str, lines: list[str]) -> bool:
    """After the title (and the opening chapter's heading, which is the title too) comes the story's first line."""
    paragraphs = [p.strip() for p in txt.split("\n\n") if p.strip() and p.strip() != TITLE]
    return paragraphs[:1] == lines[:1]


def download(w: Walk, fmt: str) -> bytes:
    """Export the Library's chosen draft as fmt, download it as a browser does, and keep it under out/exports."""
    page = w.page
    page.locator("#library-format").get_by_label(fmt).check()
    page.locator("#library-export").click()
    name = f"{re.sub(r'[^a-z]+', '-', TITLE.lower())}.{fmt.lower()}"
    expect(page.locator("#library-status")).to_contain_text(f"Exported {name}")
    with page.expect_download() as info:
        page.locator("#library-file a").first.click()
    assert info.value.suggested_filename == name, f"downloaded {info.value.suggested_filename}, not {name}"
    saved = w.out / "exports" / name
    saved.parent.mkdir(exist_ok=True)
    info.value.save_as(saved)
    w.found.setdefault("exports", []).append(name)
    return saved.read_bytes()


# --- 5: the Model tab refuses a model that is not there, and keeps the working one ----------------------------

def model_switch(w: Walk) -> None:
    page, missing = w.page, "someone/not-a-cached-model"
    page.get_by_role("tab", name="Model").click()
    expect(page.locator("#model-path input")).to_have_value(re.compile(r"SmolLM2.*\.gguf$"))  # the working model
    before = page.locator("#model-path input").input_value()
    page.locator("#model-path input").fill(missing)
    page.locator("#model-apply").click()
    message = page.locator("#model-message")
    expect(message).to_contain_text(missing)
    time.sleep(2 * 3.0 + 1)  # two refreshes of the banner (ui/page.STATUS_S): a worker that unloaded would show it
    said = message.inner_text().replace("●", "").strip()
    banner = page.locator("#ts-banner").inner_text().replace("●", "").strip()
    sentences = re.findall(r"[.!?](?=\s|$)", said)
    shots = [w.shot("05-model-tab-refused.png")]
    w.report("5", {"the banner still says SmolLM2 is ready": "SmolLM2" in banner and "ready" in banner,
                   "the message is one plain sentence": len(sentences) == 1 and not re.search(
                       r"Traceback|Error\b|Exception|stories260k|test model", said),
                   "'Default model' is offered": page.locator("#model-default").is_visible()},
             [f"model box before: {before}", f"message: {said!r}", f"banner: {banner!r}"], shots)


# --- 6+7: Compare in plain words; the Library afterwards opens on the writer's draft -----------------------------

def compare_then_library(w: Walk) -> None:
    page = w.page
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("The old lighthouse keeper climbed the stairs and")
    page.locator("#compare-target input").fill("100")
    page.locator("#compare-run").click()
    expect(page.locator("#compare-status")).to_contain_text("Comparison finished", timeout=DRAFT_S * 1000)
    time.sleep(1)  # the tooltips are set by the page's 400 ms timer
    headers = [h.strip().rstrip("⋮").strip() for h in page.eval_on_selector_all(
        "#compare-table th", "els => els.map(e => e.innerText)") if h.strip()]
    tips = [title for title in page.eval_on_selector_all("#compare-table th[title]", "els => els.map(e => e.title)")
            if title[:1] in "αβ"]
    legend = page.locator("#compare-speed .legend").text_content()
    same = re.findall(r"✔ identical[^\n]*|✘ differs[^\n]*", page.locator("#compare-table").inner_text())
    names = ("A TokenSwift", "B TokenSwift", "A, B plain")
    shots = [w.shot("06-compare.png")]
    library = library_opens_on_draft(w, page, "07a-library-after-compare.png")
    fresh = w.fresh_page()  # a first visit: nothing remembered in this browser
    library_fresh = library_opens_on_draft(w, fresh, "07b-library-fresh-browser.png")
    fresh.context.close()
    shots += [library["shot"], library_fresh["shot"]]
    w.report("6+7", {"plain column names (no α, β, Distinct)": not re.search(r"α|β|[Dd]istinct", " ".join(headers)),
                     "both sides named in the legend": all(name in legend for name in names),
                     "the Library opens on the writer's last draft": library["ok"] and library_fresh["ok"]},
             [f"columns: {headers}", f"tooltips: {tips}", f"legend: {legend!r}",
              f"same text as plain decoding: {same}",
              f"Library (this tab): {library['said']}", f"Library (fresh browser): {library_fresh['said']}"], shots)


def library_opens_on_draft(w: Walk, page, picture: str) -> dict:
    """The Library as it opens: the writer's book and last draft, no comparison among the books."""
    page.get_by_role("tab", name="Library").click()
    expect(page.locator("#library-title input")).not_to_have_value("")
    title = page.locator("#library-title input").input_value()
    draft = page.locator("#library-draft input").input_value()
    books = page.locator("#library-books").inner_text()
    shot = w.shot(picture, page)
    ok = title == TITLE and draft.startswith(f"#{w.found.get('draft')} ") and "Compare:" not in books
    return {"ok": ok, "said": f"book {title!r}, draft {draft!r}, a comparison among the books: {'Compare:' in books}",
            "shot": shot}


STEPS = [("1", defaults_write_english), ("8", speed_line_final), ("11", small_ones), ("2+3", instruction_draft),
         ("4", exports), ("5", model_switch), ("6+7", compare_then_library)]
