"""Write tab: prompt and settings in, a generation queued in the store, its text and charts polled back.

Closing the tab never stops a draft: the worker runs it; this tab only reads the store (a gr.Timer at
2 Hz while the draft is queued or running) and writes control requests (pause, resume, stop).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from storage import Conflict, NotFound, Store, StoreError
from storage.records import GenerationRecord
from tokenswift.settings import Settings
from ui import charts, views
from ui.forms import MODES, QUICK_LENGTHS, SAMPLERS, FormError, SettingsForm, form_from_settings, parse_target
from ui.live import ACTIVE, TAIL_CHARS, Watch, whole_text
from ui.tokens import PromptTokens

TICK_S = 0.5
MAX_UPLOAD_BYTES = 8 * 1024 * 1024


@dataclass
class WriteParts:
    watch: gr.State  # Watch | None: the draft on screen
    book: gr.State  # session id that new drafts go into (None: a new book)
    remembered: gr.BrowserState  # the draft id, so a reopened tab shows it again
    full_shown: gr.State
    title: gr.Textbox
    prompt: gr.Textbox
    upload: gr.UploadButton
    target: gr.Number
    quick: gr.Radio
    limit: gr.Markdown
    mode: gr.Radio
    theta: gr.Number
    window: gr.Number
    k: gr.Number
    sampler: gr.Radio
    sampler_value: gr.Number
    temperature: gr.Slider
    seed: gr.Number
    budget: gr.Number
    start: gr.Button
    pause: gr.Button
    resume: gr.Button
    stop: gr.Button
    cont: gr.Button
    new_book: gr.Button
    status: gr.Markdown
    bar: gr.HTML
    text: gr.Textbox
    show_all: gr.Button
    full: gr.Textbox
    alpha: gr.Plot
    ngram: gr.Plot
    speed: gr.Plot
    saved: gr.Plot
    timer: gr.Timer

    @property
    def form(self) -> list:
        """In SettingsForm's field order."""
        return [self.mode, self.target, self.theta, self.window, self.k, self.sampler, self.sampler_value,
                self.temperature, self.seed, self.budget]

    @property
    def view(self) -> list:
        """Everything a change of the draft on screen may update."""
        return [self.watch, self.book, self.remembered, self.status, self.bar, self.text, self.alpha, self.ngram,
                self.speed, self.saved, self.timer, self.pause, self.resume, self.stop, self.cont, self.full,
                self.full_shown, self.show_all]

    @property
    def opened(self) -> list:
        """view + the form fields a stored draft fills in."""
        return [*self.view, self.title, self.prompt, *self.form]


def build() -> WriteParts:
    d = SettingsForm()
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=340):
            title = gr.Textbox("Untitled", label="Book title", elem_id="write-title", max_lines=1)
            prompt = gr.Textbox(label="Opening / prompt", lines=9, max_lines=18, elem_id="write-prompt",
                                placeholder="Once upon a time, in a lighthouse at the edge of the map, …  "
                                            "(type or load a .txt; Ctrl+Enter starts)")
            upload = gr.UploadButton("Load .txt…", file_types=[".txt"], size="sm", elem_id="write-upload")
            with gr.Row():
                target = gr.Number(d.target, label="Target length (new tokens)", precision=0,
                                   elem_id="write-target", scale=2)
                mode = gr.Radio(list(MODES), value=d.mode, label="Mode", elem_id="write-mode", scale=2)
            quick = gr.Radio(list(QUICK_LENGTHS), value=None, label="Quick picks", elem_id="write-quick")
            limit = gr.Markdown("Model limit: waiting for the worker…", label="Model limit", elem_id="write-limit")
            with gr.Accordion("Settings (θ, W, k, sampler)", open=False, elem_id="write-settings"):
                with gr.Row():
                    theta = gr.Number(d.theta, label="θ (penalty, 1 = off)", step=0.05,
                                      elem_id="write-theta")
                    window = gr.Number(d.window, label="W (penalty window)", precision=0, elem_id="write-w")
                    k = gr.Number(d.k, label="k (n-gram top-k)", precision=0,
                                  elem_id="write-k")
                with gr.Row():
                    sampler = gr.Radio(list(SAMPLERS), value=d.sampler, label="Sampler", elem_id="write-sampler")
                    sampler_value = gr.Number(d.sampler_value, label=SAMPLERS[d.sampler][2], step=0.01,
                                              elem_id="write-sampler-value")
                with gr.Row():
                    temperature = gr.Slider(0, 2, value=d.temperature, step=0.05, label="Temperature (0 = greedy)",
                                            elem_id="write-temperature")
                    seed = gr.Number(d.seed, label="Seed", precision=0, elem_id="write-seed")
                    budget = gr.Number(d.budget, label="Partial-cache budget (0 = auto)", precision=0,
                                       elem_id="write-budget")
            with gr.Row():
                start = gr.Button("▶ Start", variant="primary", elem_id="write-start", scale=2)
                cont = gr.Button("Continue", interactive=False, elem_id="write-continue")
            with gr.Row():
                pause = gr.Button("Pause", interactive=False, elem_id="write-pause", size="sm")
                resume = gr.Button("Resume", interactive=False, elem_id="write-resume", size="sm")
                stop = gr.Button("■ Stop", variant="stop", interactive=False, elem_id="write-stop", size="sm")
                new_book = gr.Button("New book", elem_id="write-new", size="sm")
        with gr.Column(scale=3, min_width=420):
            status = gr.Markdown("Write or load an opening, pick a length, press **Start** (Ctrl+Enter). "
                                 "The draft keeps going if you close this tab.", label="Write status",
                                 elem_id="write-status")
            bar = gr.HTML(views.progress_bar(None), label="Progress", elem_id="write-bar")
            text = gr.Textbox(label=f"Draft (live: last {TAIL_CHARS:,} characters)", lines=16, max_lines=16,
                              interactive=False, autoscroll=False, elem_id="write-text",
                              elem_classes=["ts-draft", "ts-follow"], buttons=["copy"])
            show_all = gr.Button("Show whole text", size="sm", elem_id="write-show-all")
            full = gr.Textbox(label="Whole text", lines=20, max_lines=40, interactive=False, visible=False,
                              elem_id="write-full", elem_classes="ts-draft", buttons=["copy"])
            with gr.Row():
                alpha = gr.Plot(charts.alpha_chart([]), label="α chart", elem_id="chart-alpha", show_label=False)
                ngram = gr.Plot(charts.ngram_chart([]), label="n-gram chart", elem_id="chart-ngram", show_label=False)
            with gr.Row():
                speed = gr.Plot(charts.speed_chart([]), label="speed chart", elem_id="chart-speed", show_label=False)
                saved = gr.Plot(charts.saved_chart([]), label="time-saved chart", elem_id="chart-saved",
                                show_label=False)
    return WriteParts(
        watch=gr.State(None), book=gr.State(None), remembered=gr.BrowserState(None, storage_key="tokenswift-draft"),
        full_shown=gr.State(False), title=title, prompt=prompt, upload=upload, target=target, quick=quick,
        limit=limit, mode=mode, theta=theta, window=window, k=k, sampler=sampler, sampler_value=sampler_value,
        temperature=temperature, seed=seed, budget=budget, start=start, pause=pause, resume=resume, stop=stop,
        cont=cont, new_book=new_book, status=status, bar=bar, text=text, show_all=show_all, full=full,
        alpha=alpha, ngram=ngram, speed=speed, saved=saved, timer=gr.Timer(TICK_S, active=False),
    )


# --- what the tab shows for a draft (also used by the Library tab's Open and Continue) -----------------

def model_limit(store: Store) -> int | None:
    worker = views.live_worker(store.list_workers())
    return worker.max_context if worker else None


def prompt_budget(store: Store, tokens: PromptTokens, prompt: str) -> tuple[int | None, int]:
    """(context, prompt tokens) for a new draft: the prompt counted with the model's tokenizer when this
    process can load it; else 0 tokens against the worker's context, and the worker checks the prompt."""
    measured = tokens.measure(prompt)
    if measured is None:
        return model_limit(store), 0
    return measured.context or model_limit(store), measured.tokens


def limit_line(store: Store) -> str:
    limit = model_limit(store)
    if limit:
        return f"Model limit: **{limit:,} tokens** (opening + draft). 100K tokens ≈ 75K words."
    return "Model limit: shown once a model is loaded (see the banner above)."


def render(p: WriteParts, store: Store, watch: Watch | None, *, text=True, charts_too=True, full=False) -> dict:
    """Updates for the view of `watch` (None: an empty page)."""
    if watch is None:
        empty = {p.alpha: charts.alpha_chart([]), p.ngram: charts.ngram_chart([]), p.speed: charts.speed_chart([]),
                 p.saved: charts.saved_chart([])}
        return {p.watch: None, p.status: "No draft open.", p.bar: views.progress_bar(None), p.text: "",
                p.timer: gr.Timer(active=False), **_buttons(p, None), **empty}
    out = {p.watch: watch, p.status: _status(store, watch), p.bar: views.progress_bar(watch.record),
           p.timer: gr.Timer(active=watch.active), **_buttons(p, watch.record)}
    if text:
        out[p.text] = watch.tail
    if charts_too:
        series = [("", watch.points)]
        out.update({p.alpha: charts.alpha_chart(series), p.ngram: charts.ngram_chart(series),
                    p.speed: charts.speed_chart(series), p.saved: charts.saved_chart(series)})
    if full:
        out.update({p.full: gr.Textbox(visible=False, value=""), p.full_shown: False, p.show_all: "Show whole text"})
    return out


def show_generation(p: WriteParts, store: Store, gen_id: int, *, fill_form: bool = True) -> dict:
    """Open a stored draft: its view, its book, and (fill_form) the prompt and settings it was made with."""
    watch = Watch.open(store, gen_id)
    out = {**render(p, store, watch, full=True), p.book: watch.record.session_id, p.remembered: gen_id}
    if fill_form:
        record = watch.record
        out[p.title] = store.get_session(record.session_id).title
        if record.parent_id is None:  # a continuation's prompt is the whole earlier book: leave the box alone
            out[p.prompt] = record.prompt_text
        form = form_from_settings(Settings.from_json(record.settings_json))
        out.update(dict(zip(p.form, [form.mode, form.target, form.theta, form.window, form.k, form.sampler,
                                     form.sampler_value, form.temperature, form.seed, form.budget], strict=True)))
        out[p.sampler_value] = gr.Number(form.sampler_value, label=SAMPLERS[form.sampler][2])
    return out


def _status(store: Store, watch: Watch) -> str:
    record, ahead, note = watch.record, 0, ""
    if record.status == "queued":
        ahead = sum(1 for g in store.list_generations(statuses=("queued", "running")) if g.id < record.id)
        if views.live_worker(store.list_workers()) is None:
            note = " · **no worker is running** (start `python -m worker --db …` or restart the app)"
    return views.progress_line(record, watch.words, watch.latest, ahead, note)


def _buttons(p: WriteParts, record: GenerationRecord | None) -> dict:
    status = record.status if record else None
    extendable = status in ("done", "cancelled") or (status == "failed" and record.produced_tokens > 0)
    return {p.pause: gr.Button(interactive=status in ACTIVE), p.resume: gr.Button(interactive=status == "paused"),
            p.stop: gr.Button(interactive=status in (*ACTIVE, "paused")), p.cont: gr.Button(interactive=extendable)}


def no_model_problem(store: Store) -> str | None:
    """Why a draft started now could not run, if the worker says so (no model chosen, or it failed to load)."""
    worker = views.live_worker(store.list_workers())
    if worker is None or worker.load_status in ("ready", "loading"):
        return None  # no worker: the draft waits in the queue (the status line says so)
    desired = store.desired_model()
    if desired is None:
        return f"Model: no model chosen yet. {views.HOW_TO_POINT}"
    if worker.load_status == "failed" and desired.model == worker.model:
        return f"Model: {worker.load_error} — choose another in the Model tab."
    return None


def problem(p: WriteParts, message: str) -> dict:
    """A readable message in the status line (and a toast); nothing else changes."""
    gr.Warning(views.plain(message))
    return {p.status: f"{views.dot('bad')} {message}"}


# --- wiring ---------------------------------------------------------------------------------------------

def wire(p: WriteParts, store: Store, page: gr.Blocks, tokens: PromptTokens) -> None:
    """`page`: the Blocks, whose load event reattaches a reopened tab to its draft. `tokens`: the app's
    tokenizer cache, to refuse a prompt + target beyond the model's context before queueing it."""
    fast = {"concurrency_limit": None}  # handlers only read or write the store; the GPU is the worker's

    def start(title, prompt, book, *form):
        if not (prompt or "").strip():
            return problem(p, "Prompt: write or load the opening of your story first.")
        if reason := no_model_problem(store):
            return problem(p, reason)
        try:
            limit, prompt_tokens = prompt_budget(store, tokens, prompt)
            settings = SettingsForm(*form).to_settings(limit=limit, prompt_tokens=prompt_tokens)
            title = (title or "").strip() or "Untitled"
            if book is None:
                book = store.create_session(title).id
            elif store.get_session(book).title != title:
                store.rename_session(book, title=title)
            gen = store.enqueue_generation(prompt, settings, session_id=book)
        except FormError as error:
            return problem(p, str(error))
        except NotFound:  # the book was deleted in the Library meanwhile: start a new one
            gen = store.enqueue_generation(prompt, settings, session_id=store.create_session(title).id)
        except StoreError as error:
            return problem(p, str(error))
        return show_generation(p, store, gen.id, fill_form=False)

    def control(verb):
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

    def continue_draft(watch: Watch | None, *form):
        if watch is None:
            return problem(p, "Continue: open a finished draft first (Library tab, or Start one).")
        try:
            existing = len(store.get_tokens(watch.gen_id).prompt_ids) + watch.record.produced_tokens
            settings = SettingsForm(*form).to_settings(limit=model_limit(store), prompt_tokens=existing,
                                                       prompt_label="existing text")
            gen = store.continue_generation(watch.gen_id, settings)
        except (FormError, Conflict, NotFound, StoreError) as error:
            return problem(p, f"Continue: {error}" if not isinstance(error, FormError) else str(error))
        return show_generation(p, store, gen.id, fill_form=False)

    def tick(watch: Watch | None):
        if watch is None:
            return {p.timer: gr.Timer(active=False)}
        try:
            moved, texted, pointed = watch.refresh(store)
        except NotFound:  # deleted from the Library while we watched
            return {**render(p, store, None), p.status: "This draft was deleted."}
        changed = moved or texted or pointed
        out = render(p, store, watch, text=texted, charts_too=pointed) if changed else {p.status: gr.skip()}
        if not watch.active:
            out[p.timer] = gr.Timer(active=False)
        return out

    def attach(remembered):
        """On page load: the draft this browser last showed, else the one the worker is busy with."""
        gen_id = remembered
        try:
            if gen_id is not None:
                store.get_generation(gen_id, with_text=False)
        except NotFound:
            gen_id = None
        if gen_id is None:
            busy = store.list_generations(statuses=ACTIVE)
            running = [g for g in busy if g.status == "running"]
            gen_id = (running or busy[-1:] or [None])[0]
            gen_id = gen_id.id if gen_id is not None else None
        out = show_generation(p, store, gen_id) if gen_id is not None else {}
        return {**out, p.limit: limit_line(store)}

    def new_book():
        return {**render(p, store, None, full=True), p.book: None, p.remembered: None, p.title: "Untitled",
                p.status: "New book: write an opening and press **Start**."}

    def upload(file):
        path = Path(file if isinstance(file, str) else file.name)
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            return problem(p, f"Load .txt: {path.name} is larger than {MAX_UPLOAD_BYTES // 2**20} MB.")
        try:
            content = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError:
            return problem(p, f"Load .txt: {path.name} is not UTF-8 text; save it as UTF-8 and try again.")
        return {p.prompt: content, p.status: f"Loaded {path.name}: {len(content.split()):,} words."}

    def quick_pick(choice):
        value = parse_target(choice)
        return gr.skip() if value is None else value

    def sampler_changed(choice):
        if choice not in SAMPLERS:
            return gr.skip()
        _, default, label = SAMPLERS[choice]
        return gr.Number(default, label=label)

    def toggle_full(watch: Watch | None, shown: bool):
        if shown or watch is None:
            return {p.full: gr.Textbox(visible=False, value=""), p.full_shown: False, p.show_all: "Show whole text"}
        text = whole_text(store, watch.gen_id)
        label = f"Whole text ({len(text.split()):,} words, snapshot at {watch.record.produced_tokens:,} tokens)"
        return {p.full: gr.Textbox(visible=True, value=text, label=label), p.full_shown: True,
                p.show_all: "Hide whole text"}

    p.start.click(start, [p.title, p.prompt, p.book, *p.form], p.opened, api_name="write_start", **fast)
    p.pause.click(control("pause"), p.watch, p.view, api_name="write_pause", **fast)
    p.resume.click(control("resume"), p.watch, p.view, api_name="write_resume", **fast)
    p.stop.click(control("stop"), p.watch, p.view, api_name="write_stop", **fast)
    p.cont.click(continue_draft, [p.watch, *p.form], p.opened, api_name="write_continue", **fast)
    p.timer.tick(tick, p.watch, p.view, api_name="write_tick", show_progress="hidden", **fast)
    p.new_book.click(new_book, None, p.opened, api_name="write_new_book", **fast)
    p.upload.upload(upload, p.upload, [p.prompt, p.status], api_name="write_upload", **fast)
    p.quick.input(quick_pick, p.quick, p.target, api_name="write_quick_length", **fast)
    p.sampler.input(sampler_changed, p.sampler, p.sampler_value, api_name="write_sampler", **fast)
    p.show_all.click(toggle_full, [p.watch, p.full_shown], [p.full, p.full_shown, p.show_all],
                     api_name="write_show_all", **fast)
    page.load(attach, p.remembered, [*p.opened, p.limit], api_name="write_attach", **fast)
