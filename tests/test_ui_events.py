"""Every event the UI wires up, called through gradio_client against a real `python app.py` (real worker,
stories260k on CPU), plus the REST API mounted beside it and the shared login.

Outputs are looked up by component label (view_api), so a reordering of outputs does not break a test.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import children
import httpx
import pytest
from conftest import REPO, need_shared
from studio_app import AUTH, running_app
from tiny_models import hf_model, save_checkpoint

from ui.display import views
from ui.forms.forms import DEFAULTS, SAMPLERS, SettingsForm
from ui.forms.samplers_panel import NAMES

FORM = ["TokenSwift", 200, 1.2, 1024, 20, "top-p", 0.9, 1.0, 3, 0]  # mode target θ W k sampler value T seed budget
DRY_XTC = [getattr(SettingsForm(), name) for name in NAMES]  # after past-the-context: the writing defaults
BAN = "big tree"  # the Write tab's banned phrases, after DRY and XTC


class UI:
    """gradio_client with results as {label: value} (states, buttons and timers are not returned)."""

    def __init__(self, url: str, auth=None):
        from gradio_client import Client

        # A loaded 2-core machine (the shared app writing beside the suite) can take longer than httpx's 5 s.
        self.client = Client(url + "/", auth=auth, verbose=False, httpx_kwargs={"timeout": 60})
        api = self.client.view_api(return_format="dict", print_info=False)["named_endpoints"]
        self.labels = {name: [r["label"] for r in ep["returns"]] for name, ep in api.items()}

    def __call__(self, api: str, *args) -> dict:
        result = self.client.predict(*args, api_name=api)
        values = result if isinstance(result, tuple) else (result,)
        return dict(zip(self.labels[api], values, strict=True))

    def until(self, api: str, done, timeout: float = 60.0, *args) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            out = self(api, *args)
            if done(out):
                return out
            assert time.monotonic() < deadline, f"{api}: condition not met; last {out}"
            time.sleep(0.5)

    def settle(self, out: dict, done) -> dict:
        """`out` of a control click if it already shows `done`, else the tick that does: the click reads the
        store after its request, so when the worker was quicker the click itself carries the change and the
        ticks after it report nothing new."""
        return out if done(out) else self.until("/write_tick", done)


def value(update):
    """A returned component update or plain value -> its value (None for 'unchanged')."""
    return update.get("value") if isinstance(update, dict) else update


@pytest.fixture
def app(studio_app):
    return studio_app.url


@pytest.fixture
def ui(app):
    return UI(app, auth=AUTH)


def test_banner_and_limits(ui, app):
    status = ui("/app_status_load")
    assert "stories260k" in status["Model banner"] and "ready" in status["Model banner"]
    assert "32,768 tokens" in status["Model limit"]
    for notice in (status["Model limit"], status["Model details"]):  # the model notice, in Write and Model tabs
        assert "Model: **stories260k**" in notice and "parameters" in notice and "cpu/float32" in notice
        assert "trained for 32,768 tokens of context" in notice and "drafters: n-grams only" in notice
    assert "stories260k" in status["Model details"] and "ready" in status["Model details"]
    assert ui("/app_status")["Model banner"] == status["Model banner"]



def test_the_polls_go_around_the_queue_unless_a_state_they_set_has_listeners(ui):
    """The timers' polls are unqueued (ui/display/live.POLL): at each status message of an event Gradio's page client
    refreshes every component's loading status, and a queued event sends four such messages, an unqueued one two. But
    the page fires a State's change listeners only from a queued event's messages: no unqueued event may set such a
    State (the Write tick's `ended`, which the Library's list and the branches listen to, is a hidden box)."""
    config = ui.client.config
    states = {c["id"] for c in config["components"] if c.get("type") == "state"}
    listened = states & {target for d in config["dependencies"] for target, event in d["targets"] if event == "change"}
    unqueued = [d for d in config["dependencies"] if d.get("queue") is False]
    assert {"write_tick", "compare_tick", "app_status"} <= {d["api_name"] for d in unqueued}
    assert [d["api_name"] for d in unqueued if listened & set(d["outputs"])] == []
    clicks = [d for d in config["dependencies"] if d["api_name"] in ("write_start", "write_pause")]
    assert len(clicks) == 2 and all(d["queue"] is not False for d in clicks)


def test_no_event_shows_progress_on_a_state_or_a_timer(ui):
    """ui/page.progress_on_shown_outputs: at each message of any event the page looks up every progress target any
    event has named in its tree and copies its value; a State or a Timer shows no progress."""
    config = ui.client.config
    unseen = {c["id"] for c in config["components"] if c.get("type") in ("state", "browserstate", "timer")}
    start = next(d for d in config["dependencies"] if d["api_name"] == "write_start")
    assert unseen & set(start["outputs"]) and start["show_progress_on"]  # it sets States and shows progress ...
    assert not unseen & set(start["show_progress_on"])  # ... on what it draws only
    assert all(d["show_progress_on"] is not None and not unseen & set(d["show_progress_on"])
               for d in config["dependencies"])


def test_the_apps_server_imports_no_torch(ui, app):
    """The model is the worker's: the server (the page, the API, the tokenizer that measures prompts) runs without
    torch, whose libraries took ~180 MB of its memory and ~2 s of its start."""
    args = ["Title", "Once upon a time " * 50, FORM[0], 32_700, *FORM[2:], "Continue my text", "Keep writing",
            "Refuse", *DRY_XTC, BAN, "", ""]
    assert "prompt (202 tokens)" in ui("/write_start", *args)["Write status"]  # measured with the model's tokenizer
    maps = (server_process(app) / "maps").read_text()
    assert "libtorch" not in maps and "libc10" not in maps


def server_process(url: str) -> Path:
    """/proc/<pid> of the `python app.py` serving `url` (its worker, a spawned child, has no app.py in its command)."""
    port = url.rsplit(":", 1)[1].encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended while we looked
            if {b"app.py", port} <= set(cmdline.read_bytes().split(b"\0")):
                return cmdline.parent
    raise AssertionError(f"no app.py serves {url}")


def test_one_login_guards_ui_and_api(app):
    assert httpx.get(f"{app}/api/health", timeout=5).status_code == 401
    assert httpx.get(f"{app}/api/health", auth=AUTH, timeout=5).json()["load_status"] == "ready"  # API beside UI
    assert httpx.get(f"{app}/config", timeout=5).status_code in (401, 403)
    with httpx.Client(base_url=app, timeout=5) as browser:
        assert browser.post("/login", data={"username": "ann", "password": "wrong"}).status_code in (400, 401)
        assert browser.post("/login", data={"username": "ann", "password": "secret"}).is_success
        assert browser.get("/config").is_success


@pytest.mark.parametrize(("change", "message"), [
    ({1: ""}, "Prompt: write or load the opening"),
    ({4: 0.5}, "Repetition penalty: theta must be a finite number >= 1"),
    ({5: -1}, "Penalty window: must be in 0..131072"),
    ({6: 999}, "Phrase guesses: k must be in 0..256"),
    ({8: 1.5}, "top-p: must be in (0, 1]"),
    ({3: 50_000, 14: "Refuse"}, "exceeds the model's context of 32768 tokens (context shifting is off)"),
    ({1: "Once upon a time " * 50, 3: 32_700, 14: "Refuse"},  # counted with the model's tokenizer, before queueing
     "Target length: prompt (202 tokens) + max_new_tokens (32700) = 32902 exceeds the model's context of 32768 tokens"),
    ({10: None}, "Seed: enter a number"),
    ({16: 1.0}, "DRY growth: must be in (1, 10]"),
    ({21: 1.5}, "XTC probability: must be in 0..1"),
    ({22: 2}, "No copied runs longer than: must be 0 (off) or in 4..64 tokens"),
    ({23: -1.0}, "Top-nσ: must be in 0..100 (0 = off)"),
    ({24: 1.5}, "Adaptive-P target: must be in 0..1 (negative = off)"),
    ({25: 1.0}, "Adaptive-P memory: must be in 0..0.99"),
    ({26: "big tree\n!?"}, "Banned phrases: a phrase needs a letter or digit"),
    ({27: "x" * 20_001}, "Memory: at most 20,000 characters"),
])
def test_start_rejects_bad_input_readably(ui, change, message):
    # + prompt format, past end-of-text, past the context, DRY and XTC, Memory, Author's Note
    args = ["Title", "Once upon a time", *FORM, "Continue my text", "Keep writing", "Shift", *DRY_XTC, BAN, "", ""]
    for index, new in change.items():
        args[index] = new
    status = ui("/write_start", *args)["Write status"]
    assert message in status and "Traceback" not in status


def test_both_front_doors_refuse_the_same_over_long_draft_in_the_same_words(app, ui):
    """One rule (ui/drafts.py): the REST API and the Write tab refuse the same prompt + target past the model's
    context, each naming the target as it names it (the API's field, the form's label), for the same reason."""
    prompt, target = "Once upon a time " * 50, 32_700  # 202 tokens with <s>, as the worker counts them
    api = httpx.post(f"{app}/api/generations", auth=AUTH, timeout=30,
                     json={"prompt": prompt, "max_new_tokens": target, "settings": {"context_shift": False}})
    assert api.status_code == 422
    [detail] = api.json()["detail"]
    field, reason = detail["msg"].split(": ", 1)
    assert detail["loc"] == ["body", "max_new_tokens"] and field == "max_new_tokens"
    assert reason.startswith("prompt (202 tokens) + max_new_tokens (32700) = 32902 exceeds the model's context")
    form = ["TokenSwift", target, *FORM[2:]]
    status = ui("/write_start", "Title", prompt, *form, "Continue my text", "Keep writing", "Refuse", *DRY_XTC, BAN,
                "", "")["Write status"]
    assert f"Target length: {reason}" in status and "Queued" not in status


def test_write_pause_resume_stop_continue(ui):
    assert ui("/write_quick_length", "25K")["Target length (new tokens)"] == 25_000
    label = SAMPLERS[DEFAULTS["sampler"]][2]  # the box as first built: the writing defaults' sampler
    assert value(ui("/write_sampler", "top-p")[label]) == 0.9
    assert "no draft is open" in ui("/write_pause")["Write status"]

    out = ui("/write_start", "Pause test", "Once upon a time", "TokenSwift", 3000, *FORM[2:], "Continue my text",
             "Keep writing", "Shift", *DRY_XTC, BAN, "Max is a dog.", "Rain.")
    assert "Queued" in out["Write status"] or "Writing" in out["Write status"]
    out = ui.until("/write_tick", lambda o: value(o["Draft (live: last 6,000 characters)"]))
    out = ui.settle(ui("/write_pause"), lambda o: "Paused" in (o["Write status"] or ""))
    paused_at = int(out["Write status"].split(" / ")[0].split()[-1].replace(",", ""))
    assert 0 < paused_at < 3000
    assert "Resume" in out["Write status"]
    assert "context: memory " in out["Write status"]  # what the model sees: pinned + the latest tokens
    # A tick on a stopped draft (its timer switched back on by a click's late answer) sends the stopped view again.
    assert value(ui("/write_tick")["Write status"]) == out["Write status"]
    saved = ui("/write_save_context", "Max is a brown dog.", "")["Write status"]
    assert "saved to Draft" in saved and "next context shift or resume" in saved
    out = ui("/write_resume")
    assert "Queued" in out["Write status"] or "Writing" in out["Write status"]  # queued until the worker claims it
    ui.settle(out, lambda o: "Writing" in (o["Write status"] or "") and "tokens/s" in o["Write status"])
    out = ui.settle(ui("/write_stop"), lambda o: "Stopped" in (o["Write status"] or ""))
    assert "cannot resume" in ui("/write_resume")["Write status"]  # a readable Conflict, not a trace

    shown = ui("/write_show_all")
    assert shown["Whole text"]["visible"] and '<span class="ts-src-opening">Once upon a time</span>' in \
        shown["Whole text"]["value"]
    assert ui("/write_show_all")["Whole text"]["visible"] is False

    out = ui("/write_continue", "TokenSwift", 200, *FORM[2:])
    assert "Draft #" in out["Write status"]
    out = ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""))
    assert "200 / 200 tokens" in out["Write status"]
    refused = ui("/write_continue", "TokenSwift", 40_000, *FORM[2:], "Continue my text", "Keep writing", "Refuse")
    status = refused["Write status"]  # context shifting off: the old refusal, said once
    assert status.count("exceeds the model's context of 32768 tokens (context shifting is off)") == 1

    fresh = ui("/write_new_book")
    assert fresh["Book title"] == "Untitled" and "New book" in fresh["Write status"]


def test_upload_txt(ui, tmp_path):
    from gradio_client import handle_file

    good = tmp_path / "opening.txt"
    good.write_text("It was a dark and stormy night.\n", encoding="utf-8")
    out = ui("/write_upload", handle_file(str(good)))
    assert out["Opening / prompt"].startswith("It was a dark") and "7 words" in out["Write status"]
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    assert "not UTF-8" in ui("/write_upload", handle_file(str(bad)))["Write status"]


def test_reopened_tab_reattaches(ui, app):
    out = ui("/write_start", "Reattach", "The dragon slept", *FORM)
    gen_line = out["Write status"]
    gen_id = int(gen_line.split("Draft #")[1].split("*")[0])
    other = UI(app, auth=AUTH)  # a new browser session: nothing in its state
    attached = other("/write_attach", gen_id)
    assert f"Draft #{gen_id}" in attached["Write status"]
    assert attached["Opening / prompt"] == "The dragon slept" and attached["Book title"] == "Reattach"
    ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""))
    assert value(UI(app, auth=AUTH)("/write_attach", None)["Write status"]) is None  # nothing active: nothing opened

    long = ui("/write_start", "Reattach", "The dragon woke", "TokenSwift", 3000, *FORM[2:])
    long_id = int(long["Write status"].split("Draft #")[1].split("*")[0])
    assert f"Draft #{long_id}" in UI(app, auth=AUTH)("/write_attach", None)["Write status"]  # the active one
    ui.settle(ui("/write_pause"), lambda o: "Paused" in (o["Write status"] or ""))
    fresh = UI(app, auth=AUTH)("/write_attach", None)  # another browser: the paused draft is offered, not lost
    assert value(fresh["Write status"]) is None
    assert f"**Paused** — Draft #{long_id} of *Reattach*" in fresh["Draft on offer"] and " / 3,000 tokens" in \
        fresh["Draft on offer"]
    ui.settle(ui("/write_stop"), lambda o: "Stopped" in (o["Write status"] or ""))
    # Nothing of this test is left to offer (a draft another test left paused in the shared app may be).
    assert f"Draft #{long_id}" not in (UI(app, auth=AUTH)("/write_attach", None)["Draft on offer"] or "")


def test_edit_and_continue(ui):
    ui("/write_start", "Edited", "The fox sat by the river", *FORM[:1], 60, *FORM[2:])
    ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""))
    opened = ui("/write_edit")
    original = opened["Your edit of the whole draft"]["value"]
    assert original.startswith("The fox sat by the river") and opened["Your edit of the whole draft"]["visible"]
    edited = original.replace("The fox sat", "The old grey fox sat") + " Then the rain came."
    saved = ui("/write_save_edit", edited)
    assert "Saved your edit as Draft #" in saved["Write status"] and "is kept" in saved["Write status"]
    shown = ui("/write_show_all")["Whole text"]["value"]
    assert re.search(r'<span class="ts-src-edit"> ?old grey ?</span>', shown) and "Then the rain came." in shown
    assert "ts-src-ai" in shown and "ts-src-opening" in shown
    ui("/write_show_all")
    revision = int(saved["Write status"].split("Draft #")[1].split(";")[0])
    parent = int(saved["Write status"].split("version (#")[1].split(")")[0])
    assert f"Draft #{parent}" in ui("/write_restore")["Write status"]  # the model's version, as it was
    assert "empty" in ui("/write_save_edit", "  ")["Write status"]
    assert any(v == revision for _, v in ui("/library_refresh", None)["Draft"]["choices"])  # the Library shows both
    ui("/library_open", revision)
    out = ui("/write_continue", "TokenSwift", 40, *FORM[2:])
    assert "Draft #" in out["Write status"] and f"#{revision}" not in out["Write status"], out["Write status"]
    ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""))
    whole = ui("/write_show_all")["Whole text"]["value"]
    assert whole.count("Then the rain came.") == 1 and whole.index("Then the rain came.") < whole.rindex("ts-src-ai")
    assert "not an edit" in ui("/write_restore")["Write status"]


def test_what_the_model_sees(ui):
    """The context of the next token, with Memory, Author's Note and the text shifted out of view marked."""
    assert "Open a draft first" in ui("/write_seen")["What the model sees"]
    ui("/write_start", "Seen", "Once upon a time", "TokenSwift", 700, *FORM[2:], "Continue my text", "Keep writing",
       "Shift", *DRY_XTC, BAN, "Max is a dog.", "Rain falls.")
    ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""), 120)
    seen = ui("/write_seen")["What the model sees"]
    assert re.search(r'<span class="ts-seen-memory"[^>]*> ?Max is a dog\.', seen)  # SentencePiece's space
    assert re.search(r'<span class="ts-seen-note"[^>]*>\s*\[Author&#x27;s note: Rain falls\.\]', seen)
    assert "0 earlier tokens shifted out" in seen and "ts-seen-shifted" not in seen  # 700 of 32,768 tokens
    assert ui("/write_new_book")["What the model sees"] == ""  # another draft: the view does not linger


def test_what_the_model_sees_marks_the_text_shifted_out(tmp_path):
    from storage import open_store
    from storage.records import ModelSpec, Owner, Progress
    from tokenswift.settings import DraftSettings, Settings
    from ui.drafts.tokens import PromptTokens
    from ui.write import seen

    model = str(need_shared())
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    store.set_desired_model(ModelSpec(model, None, "cpu", "float32"))
    settings = Settings(max_new_tokens=300, context_window=64, shift_step=16, note_depth=8)
    gen = store.enqueue_generation("Once upon a time", DraftSettings(settings), memory="Max is a dog.",
                                   authors_note="Rain.")
    owner = Owner.here("w")
    store.claim_next(owner)
    store.record_start(gen.id, owner, [1, 400, 401], model, None)
    store.append_progress(gen.id, owner, Progress(list(range(300, 500)), "", 1.0), finish="paused")
    view = seen.context_html(store, PromptTokens(store), gen.id)
    shifted = re.search(r'<span class="ts-seen-shifted"[^>]*>([^<]*)</span>', view).group(1)
    assert shifted.startswith("[") and "tokens no longer in view, ending:] …" in shifted
    in_view = int(re.search(r"<b>([\d,]+) tokens in view", view).group(1).replace(",", ""))
    assert 48 <= in_view <= 64 and "ts-seen-memory" in view and "Author&#x27;s note: Rain." in view
    store.close()


def test_compare_two_columns(ui, app):
    columns = [1.2, 1024, 20, "top-p", 0.9, "fused", *DRY_XTC, 1.2, 1024, 4, "top-p", 0.9, "paper", *DRY_XTC,
               1.0, 1024, 20, "top-p", 0.9, "fused", *DRY_XTC, 1.2, 1024, 20, "min-p", 0.05, "fused", *DRY_XTC]
    bad = list(columns)
    bad[len(columns) // 4 + 2] = -1  # column B's k
    assert "Column B — Phrase guesses" in ui("/compare_run", "A harbour", 5, 150, 1.0, "2", *bad)["Compare status"]
    assert "Prompt" in ui("/compare_run", " ", 5, 150, 1.0, "2", *columns)["Compare status"]
    too_long = ui("/compare_run", "Once upon a time " * 50, 5, 32_700, 1.0, "2", *columns)["Compare status"]
    assert "Column A — Target length: prompt (202 tokens) + max_new_tokens (32700) = 32902 exceeds" in too_long
    visible = ui("/compare_columns", "3")
    assert [u.get("visible") for u in visible.values()] == [True, True, True, False]

    out = ui("/compare_run", "The storm had been building over the harbour", 5, 150, 1.0, "2", *columns)
    # A, B and one shared AR twin (they differ only in k and the drafter)
    assert "0 of 3 runs done" in out["Compare status"]
    out = ui.until("/compare_tick", lambda o: "3 of 3 runs done" in (o["Compare status"] or ""), 90)
    table = out["Results (speed from the worker's measurements; variety over the tokens written)"]
    assert not any(symbol in " ".join(table["headers"]) for symbol in ("α", "β", "Distinct"))  # plain words
    rows = {row[0]: row for row in table["data"]}
    assert rows["A"][1].startswith("✔ identical") and rows["B"][1].startswith("✔ identical")
    assert "Plain decoding of A, B" in rows
    assert rows["A"][2] == "done" and rows["A"][3] == 150  # one end-of-text rule: every run reaches its length
    assert all(0 < float(rows["A"][i]) <= 1 for i in range(9, 13))  # variety of 1..4-grams
    a, b = out["Column A"], out["Column B"]
    assert a["label"].startswith("A · penalty 1.2 · window 1024 · 20 phrase guesses")
    assert b["label"].startswith("B · penalty 1.2 · window 1024 · 4 phrase guesses")
    assert a["label"].endswith("fused drafter") and b["label"].endswith("paper drafter")
    assert value(a) and value(a) == value(b)  # k and the drafter change the speed, never the text

    remembered = next(v for v in out.values() if isinstance(v, dict) and "ts_ids" in v)  # the BrowserState
    restored = UI(app, auth=AUTH)("/compare_restore", remembered)  # a reopened tab
    assert "3 of 3 runs done" in restored["Compare status"] and value(restored["Column A"]) == value(a)
    # The comparison's runs stay with it: the Library opens on (and renames) the writer's book, not on them.
    library = ui("/library_refresh", None)
    assert library["Title"] and not library["Title"].startswith("Compare:")
    assert not any("Compare:" in label for label, _ in library["Book"]["choices"])


def test_library(ui):
    out = ui("/write_start", "Library Book", "In the library", *FORM[:1], 120, *FORM[2:])
    ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""))
    listing = ui("/library_refresh", None)
    books = listing["Book"]
    book_id = next(v for label, v in books["choices"] if "Library Book" in label)
    out = ui("/library_select_book", book_id)
    assert out["Title"] == "Library Book"
    gen_id = value(out["Draft"])
    assert ui("/library_reload", book_id, None)["Title"] == "Library Book"
    # A draft that ends in the Write tab redraws the lists but leaves the title and author boxes: the redraw comes
    # unasked, and it wrote the stored ones over what the writer (and the EPUB browser test) had typed. With no book
    # chosen, a book is drawn whole. (The confirmations it leaves open are rows, which the client does not see:
    # test_an_unasked_library_redraw_leaves_what_the_writer_is_in_the_middle_of.)
    ended = ui("/library_draft_ended", book_id, gen_id)
    assert any(row[1] == "Library Book" for row in ended["Books"]["data"])
    assert ended["Title"] == ended["Author"] == {"__type__": "update"}
    assert isinstance(ui("/library_draft_ended", None, None)["Title"], str)  # drawn, not left as it was

    assert "must not be empty" in ui("/library_rename", book_id, " ", "")["Library status"]
    out = ui("/library_rename", book_id, "The Archive", "A. Writer")
    assert "Saved" in out["Library status"] and out["Title"] == "The Archive"

    out = ui("/library_export", gen_id, "EPUB", "The Archive", "A. Writer")
    path = Path(out["Exported file"])
    assert path.name == "the-archive.epub"
    with zipfile.ZipFile(path) as epub:
        assert epub.namelist()[0] == "mimetype" and epub.read("mimetype") == b"application/epub+zip"
        assert any(b"A. Writer" in epub.read(n) for n in epub.namelist() if n.endswith(".opf"))
    for fmt, suffix in (("DOCX", ".docx"), ("Markdown", ".md"), ("TXT", ".txt")):
        assert ui("/library_export", gen_id, fmt, "The Archive", "A. Writer")["Exported file"].endswith(suffix)
    assert "choose a draft" in ui("/library_export", None, "EPUB", "", "")["Library status"]

    opened = ui("/library_open", gen_id)
    assert f"Draft #{gen_id}" in opened["Write status"] and opened["Book title"] == "The Archive"
    cont = ui("/library_continue", gen_id, 100)
    assert "Draft #" in cont["Write status"] and f"Draft #{gen_id}" not in cont["Write status"]
    assert "Target length" in ui("/library_continue", gen_id, 0)["Library status"]  # as the Write tab names it
    ui.until("/write_tick", lambda o: "Done" in (o["Write status"] or ""))

    assert "choose a draft first" in ui("/library_ask_delete_draft", book_id, None)["Library status"]
    ask = ui("/library_ask_delete_draft", book_id, gen_id)
    assert f"Delete draft **#{gen_id}** (done" in ask["Delete draft confirmation"]
    assert "continued from it keep their text" in ask["Delete draft confirmation"]
    ui("/library_cancel_delete_draft")
    assert ui("/library_ask_delete", book_id)["Delete confirmation"].count("its 2 drafts") == 1
    gone = ui("/library_delete_draft", book_id, gen_id)
    assert f"Deleted draft #{gen_id}" in gone["Library status"]
    left = [row[0] for row in gone["Drafts in this book"]["data"]]
    assert len(left) == 1 and gen_id not in left  # the continuation stays, with the whole text as its prompt
    table = gone["Drafts in this book"]
    assert table["data"][0][table["headers"].index("Prompt")] == "Continue my text"  # how the draft began
    assert ui("/library_open", left[0])["Opening / prompt"].startswith("In the library")  # standalone now

    ask = ui("/library_ask_delete", book_id)
    assert "Delete **The Archive** and its 1 draft?" in ask["Delete confirmation"]
    ui("/library_cancel_delete")
    empty = ui("/library_delete_draft", book_id, left[0])  # the last draft: the empty book is offered too
    assert "**The Archive** has no drafts left. Delete the empty book too?" in empty["Delete confirmation"]
    assert "This book has no drafts" in empty["Library hint"]
    assert any(v == book_id for _, v in ui("/library_reload", book_id, None)["Book"]["choices"])
    gone = ui("/library_delete", book_id)
    assert "Deleted" in gone["Library status"]
    assert all(v != book_id for _, v in gone["Book"]["choices"])
    assert "choose a book first" in ui("/library_ask_delete", None)["Library status"]


def test_the_plan_tabs_late_opening_keeps_the_book_made_since(ui):
    """The tab's opening, sent while the page showed another book but run after "New book" (a CI run saw a new book's
    plan saved to another book that way), shows the new book, not the one the page showed when it sent the opening."""
    def made(title: str) -> int:
        out = ui("/plan_new_book", title)
        assert f"Made “{title}”" in out["Plan status"]
        return value(out["Book"])

    other, new = made("Another Book"), made("The Late Opening")
    assert other != new
    assert value(ui("/plan_open", other)["Book"]) == new  # sent as the page showed `other`
    assert value(ui("/plan_select_book", other)["Book"]) == other
    assert value(ui("/plan_open", other)["Book"]) == other


def test_model_tab(ui, tmp_path):
    filled = ui("/model_refresh")
    assert filled["Model directory or hub id"].endswith("stories260k") and filled["Device"] == "cpu"
    msg = ui("/model_apply", str(tmp_path / "nope"), "", "cpu", "float32")["Model message"]
    assert "Model: no such model" in msg and "no folder or .gguf file" in msg
    for dtype in ("q4", "float32"):  # the q4 default once answered a wrong name with a sentence about number formats
        unknown = ui("/model_apply", "nosuch-model", "", "cpu", dtype)["Model message"]
        assert "Model: no such model 'nosuch-model'" in unknown and "q4" not in unknown
    refused = ui("/model_apply", "someone/not-cached-model", "", "cpu", "float32")
    assert "is not downloaded on this computer" in refused["Model message"]
    assert "ready" in refused["Model details"] and "Saved choice" not in refused["Model details"]  # kept
    assert "Device" in ui("/model_apply", str(need_shared()), "", "gpu", "float32")["Model message"]
    assert "has no config.json" in ui("/model_apply", str(tmp_path), "", "cpu", "float32")["Model message"]
    assert "q4 runs a .gguf file" in ui("/model_apply", str(need_shared()), "", "cpu", "q4")["Model message"]
    smaller = save_checkpoint(hf_model("llama-gqa-tied", vocab_size=256), tmp_path / "smaller", need_shared())
    refused = ui("/model_apply", str(need_shared()), "", "cpu", "float32", str(smaller))["Model message"]
    assert "Draft model:" in refused and "its vocabulary has 256 tokens, the target's 512" in refused
    ok = ui("/model_apply", str(need_shared()), "", "cpu", "float32")
    assert "the worker loads it" in ok["Model message"] and "stories260k" in ok["Model details"]


@pytest.mark.slow  # an app of its own, and a worker started later
def test_no_worker_yet_the_model_is_saved_and_prompts_are_checked(tmp_path):
    """--no-worker: a model chosen before any worker exists is kept, prompts are measured with its tokenizer,
    and a worker started later without --model loads that choice and writes the draft that waited."""
    with running_app(tmp_path, "--no-worker", ready=False) as url:
        ui = UI(url)
        assert "No worker is running" in ui("/app_status_load")["Model banner"]
        ok = ui("/model_apply", str(need_shared()), "", "cpu", "float32")
        assert "Saved" in ok["Model message"] and "No worker is running now" in ok["Model message"]
        assert "Saved choice" in ok["Model details"] and "stories260k" in ok["Model details"]
        assert "it loads **stories260k**" in ui("/app_status")["Model banner"]
        assert ui("/model_refresh")["Model directory or hub id"].endswith("stories260k")
        assert "No books yet" in ui("/library_refresh", None)["Library hint"]

        too_long = ui("/write_start", "Later", "Once upon a time", "TokenSwift", 32_765, *FORM[2:],
                      "Continue my text", "Keep writing", "Refuse")["Write status"]
        assert "prompt (5 tokens) + max_new_tokens (32765) = 32770 exceeds the model's context of 32768" in too_long
        queued = ui("/write_start", "Later", "Once upon a time", *FORM)["Write status"]
        assert "Queued" in queued and "no worker is running" in queued

        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
        # At the tests' own priority, as the app's worker (studio_app.py): under `nice` it waited behind the suite's
        # own processes (this test took 60 s in a full run, 12 s alone).
        command = [sys.executable, "-m", "worker", "--db", f"sqlite:///{tmp_path / 'studio.db'}", "--once",
                   "--threads", "1"]  # no --model: it must take the saved choice
        with open(tmp_path / "worker.log", "w") as log:
            worker = children.start(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                assert worker.wait(120) == 0, (tmp_path / "worker.log").read_text()[-3000:]
            finally:
                children.stop(worker)
        assert "Done" in ui("/write_tick")["Write status"]


def test_an_unasked_library_redraw_leaves_what_the_writer_is_in_the_middle_of(tmp_path):
    import gradio as gr

    from storage import open_store
    from ui.library import library

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    book = store.create_session("Kept", author="A. Writer").id
    with gr.Blocks():
        p = library.build()
    typing = (p.title, p.author, p.confirm, p.draft_confirm)
    assert all(part in library.listing(p, store, book) for part in typing)  # asked for: drawn whole
    unasked = library.listing(p, store, book, unasked=True)
    assert not any(part in unasked for part in typing) and unasked[p.books][0][1] == "Kept"
    assert all(part in library.listing(p, store, book + 1, unasked=True) for part in typing)  # a book gone: whole


def test_forms_charts_and_word_count_without_an_app():
    import plotly.graph_objects as go

    from storage.records import MetricPoint
    from tokenswift.settings import DraftSettings
    from ui.display import charts
    from ui.display.live import Watch
    from ui.forms.forms import SettingsForm, ar_twin, form_from_settings

    ts = SettingsForm(sampler="min-p", sampler_value=0.05, k=4, budget=256).to_settings()
    assert (ts.settings.min_p, ts.settings.top_p, ts.speed.ngram_topk, ts.speed.budget) == (0.05, 1.0, 4, 256)
    assert form_from_settings(ts.settings, ts.speed) == SettingsForm(sampler="min-p", sampler_value=0.05, k=4,
                                                                     budget=256)
    assert ar_twin(ts) == ar_twin(ts.replace(ngram_topk=20, budget=None)) != ar_twin(ts.replace(penalty=1.0))
    assert ar_twin(ts).mode == "ar" and isinstance(ar_twin(ts), DraftSettings)

    points = [MetricPoint(tokens=t, elapsed_s=t / 100, alpha=0.3, beta=0.1, ngram_hits=h, tokens_per_s=90.0,
                          time_saved_s=t / 1000) for t, h in ((256, 3), (512, 7), (768, 2))]
    assert charts.hits_per_1k(points) == ([512, 768], [1000 * 4 / 256, 1000 * 2 / 256])  # resumed: new base
    for chart in (charts.alpha_chart, charts.ngram_chart, charts.speed_chart, charts.saved_chart):
        for series in ([], [("", points)], [("A", points), ("B", points[:1])]):
            figure = go.Figure(chart(series).to_dict())  # the hand-built dicts pass plotly's own validation
            assert figure.layout.xaxis.rangemode == "tozero"  # whole tokens: no ticks at 25.5 under a first point

    watch = Watch(1, None, tail="Once")
    for text in (" upon a ti", "me there", " was a fox.\n"):  # "time" is split across two chunks
        watch._add_text(text)
    assert watch.words == 7 and watch.generated_tail == " upon a time there was a fox.\n"


def test_context_shift_choice_and_the_context_line():
    from storage.records import GenerationRecord, MetricPoint
    from tokenswift.settings import SettingsError
    from ui.forms.forms import FormError, SettingsForm, form_from_settings

    shifting = SettingsForm(target=50_000).to_settings().settings
    shifting.check_fits(5, 32_768)  # context shifting on: any length fits
    assert shifting.context_shift is None
    refuse = SettingsForm(target=500, shift="Refuse")
    asked = refuse.to_settings()
    assert form_from_settings(asked.settings, asked.speed) == refuse
    with pytest.raises(SettingsError, match=r"prompt \(5 tokens\) \+ max_new_tokens \(50000\) = 50005 exceeds the "
                                            r"model's context of 32768 tokens \(context shifting is off\)"):
        SettingsForm(target=50_000, shift="Refuse").to_settings().settings.check_fits(5, 32_768)
    record = GenerationRecord(1, 1, None, "Once", None, None, "tokenswift", 0, "{}", 100, "running", None, 50,
                              None, None, None, 0.0, None, None, None, None)
    point = MetricPoint(tokens=50, elapsed_s=1.0, context_pinned=180, context_recent=7_800, shifts=3)
    assert "context: memory 180 + last 7,800 tokens" in views.progress_line(record, 40, point)
    bare = MetricPoint(tokens=50, elapsed_s=1.0, context_pinned=0, context_recent=7_800, shifts=3)  # no Memory set
    assert "context: last 7,800 tokens" in views.progress_line(record, 40, bare)
    for target in (10**12, 0, -5):  # below 1 in the app's words too (Settings' range read "1..263-1" in Markdown)
        with pytest.raises(FormError, match=rf"Target length: must be between 1 and 10,000,000 .*not {target:,}"):
            SettingsForm(target=target).to_settings()


def test_an_edit_reads_as_saved_until_it_is_written_on():
    """A saved edit says so; an edit of a paused draft, resumed to its end, is done like any draft (it read "Your
    edit ... Continue writes on from your text" ever after)."""
    saved = _record(origin="edit", parent_id=2, status="done", finish_reason="edit", produced_tokens=0)
    assert "**Your edit** — Draft #1, your revision of #2" in views.progress_line(saved, 40, None)
    resumed = _record(origin="edit", parent_id=2, status="done", finish_reason="length", produced_tokens=100,
                      elapsed_s=3.0)
    assert "**Done** (target reached)" in views.progress_line(resumed, 40, None)
    ended = _record(origin="edit", parent_id=2, status="done", finish_reason="eos", produced_tokens=60, elapsed_s=2.0)
    assert "**Done** (the model ended the text at 60 tokens)" in views.progress_line(ended, 40, None)


def _record(**changes):
    from dataclasses import replace

    from storage.records import GenerationRecord

    record = GenerationRecord(1, 1, None, "Once", None, None, "tokenswift", 0, "{}", 100, "running", None, 50,
                              None, None, None, 0.0, None, None, None, None)
    return replace(record, **changes)


def test_charts_redraw_at_most_every_interval_while_running_and_at_once_when_stopped():
    """Four charts redrawn at every tick take the CPU the worker writes with (issue 28, item 9)."""
    from ui.display.live import Watch

    watch = Watch(1, _record(status="running"))
    assert watch.charts_now(pointed=True, every_s=2.0, now=100.0)  # the first points at once
    assert not watch.charts_now(pointed=True, every_s=2.0, now=101.0)  # new points, too soon: held
    assert not watch.charts_now(pointed=False, every_s=2.0, now=101.5)
    assert watch.charts_now(pointed=False, every_s=2.0, now=102.0)  # the held points, on time without new ones
    assert not watch.charts_now(pointed=False, every_s=2.0, now=110.0)  # nothing new: nothing to draw
    assert watch.charts_now(pointed=True, every_s=2.0, now=110.0)
    assert not watch.charts_now(pointed=True, every_s=2.0, now=110.1)  # held while running ...
    watch.record = _record(status="done")
    assert watch.charts_now(pointed=False, every_s=2.0, now=110.2)  # ... and drawn at once when it stops


def test_speed_line_is_final_when_finished_and_claims_nothing_untimed():
    """It said "so far" on a finished draft, changed its whole sentence from one update to the next, and
    counted time saved before any plain step had been timed in the run."""
    from dataclasses import replace

    from storage.records import MetricPoint

    record = _record()
    faster = MetricPoint(tokens=4000, elapsed_s=400.0, alpha=0.4, time_saved_s=180.0, plain_share=0.1,
                         ar_latency_s=0.145)
    assert views.speed_words(record, [faster]) == "TokenSwift so far: **1.45×** plain decoding, **3 min saved**."
    done = views.speed_words(replace(record, status="done"), [faster])
    assert done == ("TokenSwift on this draft (4,000 tokens in 6 min): **1.45×** plain decoding, **3 min saved**.")
    assert "so far" not in done
    assert "up to the pause" in views.speed_words(replace(record, status="paused"), [faster])
    untimed = replace(faster, ar_latency_s=0.0, time_saved_s=0.0)  # a fresh run: no plain step timed yet
    assert "timing plain decoding" in views.speed_words(record, [untimed])
    # A resumed run before its first plain step keeps the figures measured so far (the line does not flicker).
    assert views.speed_words(record, [faster, replace(untimed, tokens=4100)]) == views.speed_words(record, [faster])
    lines = [views.speed_words(record, [replace(faster, time_saved_s=s)]) for s in (-30.0, -2.0, 0.0, 30.0, 180.0)]
    assert all(line.startswith("TokenSwift so far: **") and "×** plain decoding, " in line for line in lines)
    behind = views.speed_words(record, [replace(faster, time_saved_s=-30.0, alpha=0.05)])
    assert "0.93×" in behind and "30 s behind" in behind and "5% of its guesses" in behind and "α" not in behind
    plain_gear = views.speed_words(record, [replace(faster, time_saved_s=-2.0, plain_share=0.9)])
    assert "plain steps are faster for this model here" in plain_gear.lower()
    assert views.speed_words(replace(record, status="done"), []) == ""  # e.g. a writer's edit: nothing timed
    assert "AR mode" in views.speed_words(replace(record, mode="ar"), [faster])


def test_why_a_run_ended_early():
    assert views.why_ended(_record(status="done", finish_reason="eos", produced_tokens=164, target_tokens=500)) == (
        "the model ended the text at 164 tokens")
    assert views.why_ended(_record(status="done", finish_reason="length", produced_tokens=500,
                                   target_tokens=500)) == ""
    assert views.why_ended(_record(status="cancelled", produced_tokens=12)) == "stopped by you at 12 tokens"
    assert views.why_ended(_record(status="running")) == ""
    line = views.progress_line(_record(status="done", finish_reason="eos", produced_tokens=164, target_tokens=500),
                               120, None)
    assert "Done** (the model ended the text at 164 tokens)" in line


def test_compare_and_charts_name_each_side_in_plain_words():
    from storage.records import MetricPoint
    from ui.compare import compare
    from ui.display import charts
    from ui.display.live import Watch

    assert not any(symbol in " ".join(compare.HEADERS) for symbol in ("α", "β", "Distinct"))
    assert all(header in compare.TIPS for header in compare.HEADERS[4:13] if header != "Tokens/s")
    assert compare.TIPS["Guesses accepted"].startswith("α") and compare.TIPS["Reused from the text"].startswith("β")
    points = [MetricPoint(tokens=t, elapsed_s=1.0, alpha=0.3, beta=0.1, ngram_hits=t, tokens_per_s=9.0)
              for t in (100, 200)]
    for chart in (charts.alpha_chart, charts.ngram_chart, charts.speed_chart):
        figure = chart([("A TokenSwift", points), ("A, B plain", points)]).to_dict()["layout"]
        assert not any(symbol in figure["title"]["text"] for symbol in ("α", "β"))
        # The legend sits under the plot: above it, the legend of several runs ran into the title.
        assert figure["legend"]["y"] < 0 and figure["legend"]["yanchor"] == "top"
    watches = {gid: Watch(gid, None, points=points) for gid in (1, 2, 3)}
    ts, plain = compare.chart_series(compare.Runs(["A", "B"], ["", ""], [1, 2], [3, 3], watches))
    speed = charts.speed_chart(ts + plain).to_dict()["data"]
    assert [t["name"] for t in speed] == ["A TokenSwift", "B TokenSwift", "A, B plain"]  # it said "AR" for each


def test_banner_without_worker_says_what_to_do():
    from storage.records import ModelSpec

    hint = "The app runs without one (--no-worker): start `python -m worker --db <same url>`."
    banner = views.model_banner([], None, hint)
    assert "No worker is running" in banner and "--no-worker" in banner and "loads" not in banner
    saved = views.model_banner([], ModelSpec("../shared/models/stories260k"), hint)
    assert "--no-worker" in saved and "it loads **stories260k** (saved in the Model tab)" in saved
    details = views.model_details([], ModelSpec("org/name", None, "cuda", "bfloat16"), 2)
    assert "Saved choice: `org/name` (cuda/bfloat16)" in details and "2 drafts waiting" in details


def test_a_failed_load_is_told_plainly_and_points_at_the_default_model():
    """The banner showed the loader's exception in red and advised the 260K-parameter test model."""
    from storage.records import ModelSpec, WorkerStatus, utcnow

    error = "ModelLoadError: model 'org/name' not found: OSError(2, 'No such file')"
    worker = WorkerStatus("w", "host", 1, utcnow(), utcnow(), "org/name", None, "cpu", "float32", "failed", error,
                          None, None, None)
    banner = views.model_banner([worker], ModelSpec("org/name"), "")
    assert "org/name could not be loaded" in banner and "Default model" in banner
    assert "OSError" not in banner and "stories260k" not in banner and "260K" not in banner
    assert "not found: OSError" in views.model_details([worker], ModelSpec("org/name"), 0)  # the reason: Model tab


@pytest.mark.slow
def test_a_model_that_cannot_load_is_refused_before_anything_changes(tmp_path, monkeypatch):
    """A hub id that was not downloaded used to be saved (the worker unloaded the working model and failed, and
    the banner advised the 260K test model). Now it is refused here, offline, with one sentence on how to get
    it, and Default model is offered."""
    import gradio as gr
    import huggingface_hub.constants

    from storage import open_store
    from storage.records import ModelSpec
    from tokenswift.model.default_model import default_model_path
    from ui.model import model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # online: it used to say "the worker will download it"
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    working = ModelSpec(str(need_shared()), None, "cpu", "float32")
    store.set_desired_model(working)
    with gr.Blocks() as blocks, gr.Tab("Model") as tab:
        parts = model.build()
        model.wire(parts, store, tab)
    handler = {f.api_name: f.fn for f in blocks.fns.values()}
    parts_of = {parts.message: "message", parts.model: "model"}

    def call(name, *args):
        return {parts_of[k]: v for k, v in handler[name](*args).items() if k in parts_of}

    refused = call("model_apply", "someone/not-downloaded", "", "cpu", "float32")["message"]
    assert "is not downloaded on this computer" in refused
    assert "huggingface-cli download someone/not-downloaded" in refused
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    assert "has no weights and no tokenizer files" in call("model_apply", str(tmp_path / "half"), "", "cpu",
                                                           "float32")["message"]
    assert store.desired_model() == working  # nothing saved: the worker keeps the model it has
    chosen = call("model_default", "cpu", "bfloat16")
    assert chosen["model"] == str(default_model_path()) == store.desired_model().model
    for text in (model.HELP, views.HOW_TO_POINT, parts.model.placeholder, refused, chosen["message"]):
        assert "stories260k" not in text and "260K" not in text
    store.close()


def test_what_the_model_sees_shows_chat_turns_as_labels_not_tokens():
    """An instruction draft's turns read "You: Write …", not "<|im_start|>user"; story text is shown as written."""
    from ui.write import seen

    pieces = [("frame", "<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\nWrite a "
                        "tale<|im_end|>\n<|im_start|>assistant\n", 30),
              ("story", "The keeper <s> climbed.", 6),
              ("note", "<|im_end|>\n<|im_start|>user\nGo on. Author's note: rain.<|im_end|>\n", 12)]
    view = seen._render(pieces)
    assert "im_start" not in view and "im_end" not in view
    assert '<b class="ts-turn">You:</b> Write a tale' in view and '<b class="ts-turn">Model:</b> ' in view
    assert '<b class="ts-turn">System:</b> You are a helpful AI assistant' in view
    assert "The keeper &lt;s&gt; climbed." in view  # the writer's own text is never taken for a marker
