"""What the Write tab shows for a draft (also used by the Library tab's Open and Continue): status, progress,
speed in words, the live text, charts and which buttons apply. Functions return {component: update}.
"""

from __future__ import annotations

import gradio as gr

from storage.records import GenerationRecord
from tokenswift.settings import DraftSettings
from ui.display import charts, views
from ui.display.live import ACTIVE, Watch
from ui.forms.forms import SAMPLERS, form_from_settings
from ui.write import wholetext
from ui.write.store_ops import WriteStore
from ui.write.world_info_panel import shown
from ui.write.write_parts import WriteParts

STOPPED = ("paused", "done", "cancelled", "failed")


def limit_line(store: WriteStore) -> str:
    """The model notice (what the model is) and the length limit it sets."""
    worker = views.live_worker(store.list_workers())
    notice = views.model_notice(worker)
    if worker and worker.max_context:
        return (f"{notice}  \nContext: **{worker.max_context:,} tokens** in view at a time; a longer draft shifts "
                "it (Memory stays, the oldest text drops out). 100K tokens ≈ 75K words.")
    return notice


def render(p: WriteParts, store: WriteStore, watch: Watch | None, *, text=True, charts_too=True, full=False) -> dict:
    """Updates for the view of `watch` (None: an empty page). full: close the whole-text view and the editor."""
    if watch is None:
        empty = {p.alpha: charts.alpha_chart([]), p.ngram: charts.ngram_chart([]), p.speed: charts.speed_chart([]),
                 p.saved: charts.saved_chart([])}
        return {p.watch: None, p.status: "No draft open.", p.bar: views.progress_bar(None), p.speed_line: "",
                p.timer: gr.Timer(active=False), **_buttons(p, None), **empty, **_closed(p), **editing(p, None, "")}
    out = {p.watch: watch, p.status: _status(store, watch), p.bar: views.progress_bar(watch.record),
           p.speed_line: views.speed_words(watch.record, watch.points), p.timer: gr.Timer(active=watch.active),
           **_buttons(p, watch.record)}
    if text:
        out[p.text] = watch.tail
    if charts_too:
        series = [("", watch.points)]
        out.update({p.alpha: charts.alpha_chart(series), p.ngram: charts.ngram_chart(series),
                    p.speed: charts.speed_chart(series), p.saved: charts.saved_chart(series)})
    if full:
        out.update({**_closed(p), **editing(p, None, watch.tail)})
    return out


def editing(p: WriteParts, text: str | None, live: str | None = None) -> dict:
    """The editor open on `text`; or (None) closed, the live view back (showing `live` if given)."""
    on = text is not None
    live_view = gr.Textbox(visible=not on) if live is None else gr.Textbox(visible=not on, value=live)
    return {p.editor: gr.Textbox(visible=on, value=text or ""), p.edit_row: gr.Row(visible=on), p.text: live_view}


def _closed(p: WriteParts) -> dict:
    """The whole text closed, and what the model saw of the draft shown before cleared."""
    return {p.full: gr.HTML(visible=False, value=""), p.full_shown: False, p.show_all: "Show whole text", p.seen: ""}


def whole(store: WriteStore, gen_id: int, reflow: bool) -> str:
    return wholetext.render(store.text_sources(gen_id), reflow=reflow, instruction=store.instruction(gen_id))


def show_generation(p: WriteParts, store: WriteStore, gen_id: int, *, fill_form: bool = True) -> dict:
    """Open a stored draft: its view, its book, and (fill_form) the prompt and settings it was made with."""
    watch = Watch.open(store, gen_id)
    out = {**render(p, store, watch, full=True), p.book: watch.record.session_id, p.remembered: gen_id}
    if fill_form:
        record = watch.record
        out[p.title] = store.get_session(record.session_id).title
        if record.parent_id is None:  # a continuation's prompt is the whole earlier book: leave the box alone
            out[p.prompt] = record.prompt_text
        asked = DraftSettings.from_json(record.settings_json)
        form = form_from_settings(asked.settings, asked.speed)
        out.update(dict(zip(p.form, form.panel(), strict=True)))
        out.update(p.samplers.show(form))
        out.update({p.memory: record.memory, p.note: record.authors_note, p.world.editor: shown(record.world_info)})
        out[p.sampler_value] = gr.Number(form.sampler_value, label=SAMPLERS[form.sampler][2])
    return out


def _status(store: WriteStore, watch: Watch) -> str:
    record, ahead, note = watch.record, 0, ""
    if record.status == "queued":
        ahead = sum(1 for g in store.list_generations(statuses=("queued", "running")) if g.id < record.id)
        if views.live_worker(store.list_workers()) is None:
            note = " · **no worker is running** (start `python -m worker --db …` or restart the app)"
    if record.status == "paused" and record.origin != "edit":
        note = views.resume_caveat(views.live_worker(store.list_workers()))
    return views.progress_line(record, watch.words, watch.latest, ahead, note)


def _buttons(p: WriteParts, record: GenerationRecord | None) -> dict:
    status = record.status if record else None
    extendable = status in ("done", "cancelled") or (status == "failed" and record.produced_tokens > 0)
    revision = record is not None and record.origin == "edit"
    return {p.pause: gr.Button(interactive=status in ACTIVE), p.resume: gr.Button(interactive=status == "paused"),
            p.stop: gr.Button(interactive=status in (*ACTIVE, "paused")), p.cont: gr.Button(interactive=extendable),
            p.edit: gr.Button(interactive=status in STOPPED), p.restore: gr.Button(visible=revision),
            p.save_context: gr.Button(interactive=record is not None)}


def no_model_problem(store: WriteStore) -> str | None:
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
