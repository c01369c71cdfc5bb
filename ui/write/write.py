"""Write tab: prompt and settings in, a generation queued in the store, its text and charts polled back.

Closing the tab never stops a draft: the worker runs it; this tab only reads the store (a gr.Timer at
1 Hz while the draft is queued or running) and writes control requests (pause, resume, stop). On page load,
from any browser, the draft being written (or the last one paused) is offered. Editing: ui/write/edit.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import gradio as gr

from storage import Conflict, NotFound, StoreError
from tokenswift.settings import SettingsError
from ui.display import views
from ui.display.live import ACTIVE, POLL, Watch
from ui.drafts.drafts import Context, DraftService
from ui.drafts.limits import unicode_problem
from ui.drafts.texts import DraftTexts
from ui.drafts.tokens import PromptTokens
from ui.forms.forms import SAMPLERS, FormError, SettingsForm, labelled, parse_target
from ui.write import edit, seen, write_branch_events
from ui.write.store_ops import WriteStore
from ui.write.world_info_panel import stored
from ui.write.write_parts import CHART_S, WriteParts
from ui.write.write_view import limit_line, no_model_problem, problem, render, show_generation, whole

MAX_UPLOAD_BYTES = 8 * 1024 * 1024


class WriteEvents:
    """The Write tab's handlers: each returns the components it redraws. `wire` binds them to the page's events."""

    def __init__(self, p: WriteParts, store: WriteStore, tokens: PromptTokens, texts: DraftTexts) -> None:
        self.p, self.store, self.texts = p, store, texts
        self.drafts = DraftService(store, tokens)

    def start(self, title, prompt, book, *rest):
        *form, memory, note, world = rest
        if not (prompt or "").strip():
            return problem(self.p, "Prompt: write or load the opening of your story first.")
        if reason := unicode_problem(title or ""):
            return problem(self.p, f"Book title: {reason}.")
        if reason := no_model_problem(self.store):
            return problem(self.p, reason)
        title = (title or "").strip() or "Untitled"
        try:
            settings, context = SettingsForm(*form).to_settings(), Context(memory or "", note or "", stored(world))
            try:
                gen = self.drafts.start(prompt, settings, book=lambda: self._book(title, book), context=context)
            except NotFound:  # the book was deleted in the Library meanwhile: start a new one
                gen = self.drafts.start(prompt, settings, book=lambda: self.store.create_session(title).id,
                                        context=context)
        except FormError as error:
            return problem(self.p, str(error))
        except SettingsError as error:
            return problem(self.p, f"{labelled(error)}.")
        except StoreError as error:
            return problem(self.p, str(error))
        return show_generation(self.p, self.store, gen.id, fill_form=False)

    def _book(self, title: str, book: int | None) -> int:
        """The book a new draft goes in, once it passed its checks: the tab's, renamed to `title`, or a new one."""
        if book is None:
            return self.store.create_session(title).id
        if self.store.get_session(book).title != title:
            self.store.rename_session(book, title=title)
        return book

    def control(self, verb):
        p, store = self.p, self.store
        request = {"pause": store.request_pause, "resume": store.request_resume, "stop": store.request_cancel}[verb]

        def handler(watch: Watch | None):
            if watch is None:
                return problem(p, f"{verb.title()}: no draft is open.")
            try:
                request(watch.gen_id)
            except (Conflict, NotFound, StoreError) as error:
                return problem(p, f"{verb.title()}: {error}")
            watch.refresh(store)
            return render(p, store, watch, text=False, charts_too=False)

        return handler

    def continue_draft(self, watch: Watch | None, *rest):
        *form, memory, note, world = rest
        if watch is None:
            return problem(self.p, "Continue: open a finished draft first (Library tab, or Start one).")
        try:
            context = Context(memory or "", note or "", stored(world))  # as the boxes show them
            gen = self.drafts.continue_from(watch.gen_id, SettingsForm(*form).to_settings(), context=context)
        except FormError as error:
            return problem(self.p, str(error))
        except SettingsError as error:
            return problem(self.p, f"{labelled(error)}.")
        except (Conflict, NotFound, StoreError) as error:
            return problem(self.p, f"Continue: {error}")
        return show_generation(self.p, self.store, gen.id, fill_form=False)

    def save_context(self, watch: Watch | None, memory, note, world):
        p = self.p
        if watch is None:
            return problem(p, "Memory: open a draft first.")
        try:
            self.drafts.set_context(watch.gen_id, Context(memory or "", note or "", stored(world)))
        except FormError as error:
            return problem(p, f"{error}. Nothing was saved.")
        except SettingsError as error:
            return problem(p, f"{labelled(error)}.")
        except (NotFound, StoreError) as error:
            return problem(p, f"Memory: {error}")
        when = "from its next context shift or resume" if watch.record.status in ("queued", "running", "paused") \
            else "to Continue from it"
        return {p.status: f"{views.dot('ok')} Memory, Author's Note and World Info saved to Draft #{watch.gen_id}: "
                          f"they apply {when}."}

    def tick(self, watch: Watch | None):
        p, store = self.p, self.store
        if watch is None:
            return {p.timer: gr.Timer(active=False)}
        try:
            moved, texted, pointed = watch.refresh(store, self.texts.changes)  # no store read between commits
        except NotFound:  # deleted from the Library while we watched
            return {**render(p, store, None), p.status: "This draft was deleted."}
        charts_too = watch.charts_now(pointed, CHART_S, time.monotonic())
        # A stopped draft's timer runs only when a click's answer, computed before the draft stopped but delivered
        # after the tick that showed it stopped, switched it back on (a Pause click beside the worker's last
        # flush): that answer's stale line ("Pausing…") must not stay, so the stopped view is sent again.
        changed = moved or texted or charts_too or not watch.active
        out = render(p, store, watch, text=texted, charts_too=charts_too) if changed else {p.status: gr.skip()}
        if not watch.active:
            out[p.timer] = gr.Timer(active=False)
            record = watch.record
            out[p.ended] = f"{record.id}:{record.status}:{record.produced_tokens}"
        return out

    def attach(self, remembered):
        """On page load: the draft this browser last showed, else the one the worker is busy with; and,
        whatever this browser remembers, the draft being written or last paused is offered."""
        gen_id = remembered
        try:
            if gen_id is not None:
                self.store.get_generation(gen_id, with_text=False)
        except NotFound:
            gen_id = None
        offer = self.store.resumable()
        if gen_id is None and offer is not None and offer.status in ACTIVE:
            gen_id = offer.id
        out = show_generation(self.p, self.store, gen_id) if gen_id is not None else {}
        return {**out, **_offer(self.p, self.store, offer, shown=gen_id), self.p.limit: limit_line(self.store)}

    def take_offer(self, resume: bool):
        p, store = self.p, self.store
        def handler(offered):
            if offered is None:
                return {p.offer: gr.Row(visible=False)}
            try:
                if resume:
                    store.request_resume(offered)
                return {**show_generation(p, store, offered), p.offer: gr.Row(visible=False)}
            except (Conflict, NotFound, StoreError) as error:
                return {**problem(p, f"{'Resume' if resume else 'Open'}: {error}"), p.offer: gr.Row(visible=False)}

        return handler

    def new_book(self):
        p, store = self.p, self.store
        return {**render(p, store, None, full=True), p.book: None, p.remembered: None, p.title: "Untitled",
                p.status: "New book: write an opening and press **Start**."}

    def upload(self, file):
        path = Path(file if isinstance(file, str) else file.name)
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            return problem(self.p, f"Load .txt: {path.name} is larger than {MAX_UPLOAD_BYTES // 2**20} MB.")
        try:
            content = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError:
            return problem(self.p, f"Load .txt: {path.name} is not UTF-8 text; save it as UTF-8 and try again.")
        return {self.p.prompt: content, self.p.status: f"Loaded {path.name}: {len(content.split()):,} words."}

    def quick_pick(self, choice):
        value = parse_target(choice)
        return gr.skip() if value is None else value

    def sampler_changed(self, choice):
        if choice not in SAMPLERS:
            return gr.skip()
        _, default, label = SAMPLERS[choice]
        return gr.Number(default, label=label)

    def toggle_full(self, watch: Watch | None, shown: bool, reflow: bool):
        p, store = self.p, self.store
        if shown or watch is None:
            return {p.full: gr.HTML(visible=False, value=""), p.full_shown: False, p.show_all: "Show whole text"}
        words = len(self.texts.whole(watch.gen_id).split())
        label = f"Whole text ({words:,} words, snapshot at {watch.record.produced_tokens:,} tokens)"
        return {p.full: gr.HTML(whole(store, watch.gen_id, reflow), visible=True, label=label), p.full_shown: True,
                p.show_all: "Hide whole text"}

    def reflowed(self, watch: Watch | None, shown: bool, reflow: bool):
        return whole(self.store, watch.gen_id, reflow) if shown and watch is not None else gr.skip()


def wire(p: WriteParts, store: WriteStore, page: gr.Blocks, tokens: PromptTokens, texts: DraftTexts) -> None:
    """`page`: the Blocks, whose load event reattaches a reopened tab to its draft. `tokens`: the app's
    tokenizer cache, to refuse a prompt + target beyond the model's context before queueing it. `texts`: the
    app's cache of whole texts ("Show whole text")."""
    fast = {"concurrency_limit": None}  # handlers only read or write the store; the GPU is the worker's
    on = WriteEvents(p, store, tokens, texts)
    context = [p.memory, p.note, p.world.editor]
    p.start.click(on.start, [p.title, p.prompt, p.book, *p.form, *context], p.opened, api_name="write_start", **fast)
    p.pause.click(on.control("pause"), p.watch, p.view, api_name="write_pause", **fast)
    p.resume.click(on.control("resume"), p.watch, p.view, api_name="write_resume", **fast)
    p.stop.click(on.control("stop"), p.watch, p.view, api_name="write_stop", **fast)
    p.cont.click(on.continue_draft, [p.watch, *p.form, *context], p.opened, api_name="write_continue", **fast)
    p.save_context.click(on.save_context, [p.watch, *context], p.status, api_name="write_save_context", **fast)
    p.timer.tick(on.tick, p.watch, p.view, api_name="write_tick", **POLL)
    p.new_book.click(on.new_book, None, p.opened, api_name="write_new_book", **fast)
    p.upload.upload(on.upload, p.upload, [p.prompt, p.status], api_name="write_upload", **fast)
    p.quick.input(on.quick_pick, p.quick, p.target, api_name="write_quick_length", **fast)
    p.sampler.input(on.sampler_changed, p.sampler, p.sampler_value, api_name="write_sampler", **fast)
    p.show_all.click(on.toggle_full, [p.watch, p.full_shown, p.reflow], [p.full, p.full_shown, p.show_all],
                     api_name="write_show_all", **fast)
    p.reflow.input(on.reflowed, [p.watch, p.full_shown, p.reflow], p.full, api_name="write_reflow", **fast)
    p.seen_show.click(lambda watch: seen.context_html(store, tokens, watch.gen_id) if watch is not None
                      else "<p>Open a draft first (Library tab, or Start one).</p>", p.watch, p.seen,
                      api_name="write_seen", **fast)
    offer_out = [*p.opened, p.offer]
    p.offer_resume.click(on.take_offer(True), p.offered, offer_out, api_name="write_offer_resume", **fast)
    p.offer_open.click(on.take_offer(False), p.offered, offer_out, api_name="write_offer_open", **fast)
    page.load(on.attach, p.remembered, [*p.opened, p.limit, p.offer, p.offer_text, p.offered], api_name="write_attach",
              **fast)
    edit.wire(p, store, on.drafts)
    write_branch_events.wire(p, store, tokens, on.drafts)


def _offer(p: WriteParts, store: WriteStore, offer, shown: int | None) -> dict:
    """The offer row: the draft being written or last paused ("Paused — Draft #3 of The Harbour, 4,192 /
    20,000 tokens"), unless it is the one already on screen."""
    if offer is None or offer.id == shown:
        return {p.offer: gr.Row(visible=False), p.offer_text: "", p.offered: None}
    state = {"running": "Writing", "queued": "Queued", "paused": "Paused"}[offer.status]
    title = store.get_session(offer.session_id).title
    text = (f"{views.dot('wait' if offer.status == 'paused' else 'run')} **{state}** — Draft #{offer.id} of "
            f"*{title}*, {offer.produced_tokens:,} / {offer.target_tokens:,} tokens")
    return {p.offer: gr.Row(visible=True), p.offer_text: text, p.offered: offer.id}
