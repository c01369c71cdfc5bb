"""The Write tab's components (build) and the groups of them that handlers update (WriteParts).

Handlers live in ui/write/write.py (start, control, ticks, page load) and ui/write/edit.py (edit and continue); what
the tab shows for a draft in ui/write/write_view.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from tokenswift.settings.phrases import STARTER_BANS
from tokenswift.text.writing_presets import built_in
from ui.display import charts, views
from ui.display.live import TAIL_CHARS
from ui.forms import samplers_panel
from ui.forms.boxes import box
from ui.forms.forms import (
    CONTEXT_SHIFT,
    MODES,
    PAST_EOS,
    PROMPT_FORMATS,
    QUICK_LENGTHS,
    ROWS,
    SAMPLERS,
    TARGET_LABEL,
    SettingsForm,
)
from ui.forms.samplers_panel import SamplerParts
from ui.write import world_info_panel, write_branches

TICK_S = 1.0
CHART_S = 2.0  # the charts redraw at most this often while a draft runs (ui/display/live.Watch.charts_now)
CHART_HELP = """\
**How to read these charts.** TokenSwift guesses several words ahead and the model checks the guesses
in one step; the text is exactly what plain decoding would write, only sooner.
- **Guesses accepted (α)**: the share of guessed tokens the model kept. Higher is faster.
- **Reused from the text so far (β, n-grams)**: guesses taken from phrases already in the draft (names,
  repeated turns of phrase): β is their share of the guesses kept; the dotted line counts such tokens per
  1,000 written.
- **Speed**: tokens written per second. **Time saved**: the time plain decoding would have taken for the same
  tokens, minus the time taken; below zero means TokenSwift has cost time so far (the line above says why).
"""


@dataclass
class WriteParts:
    watch: gr.State  # Watch | None: the draft on screen
    book: gr.State  # session id that new drafts go into (None: a new book)
    remembered: gr.BrowserState  # the draft id, so a reopened tab shows it again
    full_shown: gr.State
    # "id:status:tokens" of the last draft seen to stop: the lists that show it refresh on a change. A hidden box, not
    # a State: the page fires a State's change listeners only after a queued event, and the tick that sets it is not.
    ended: gr.Textbox
    title: gr.Textbox
    prompt: gr.Textbox
    upload: gr.UploadButton
    prompt_format: gr.Radio
    past_eos: gr.Radio
    shift: gr.Radio  # past the model's context: shift it or refuse
    memory: gr.Textbox  # pinned at the top of the model's context
    note: gr.Textbox  # the Author's Note, inserted near the end of the context
    save_context: gr.Button  # store an edited Memory / note on the open draft
    world: world_info_panel.WorldInfoParts  # World Info (lorebook) as JSON, imported and exported
    target: gr.Number
    quick: gr.Radio
    limit: gr.Markdown
    mode: gr.Radio
    penalty: gr.Number
    penalty_window: gr.Number
    k: gr.Number
    sampler: gr.Radio
    sampler_value: gr.Number
    temperature: gr.Slider
    seed: gr.Number
    budget: gr.Number
    samplers: SamplerParts  # the table's panel rows: DRY, XTC, no copied runs, top-nσ, Adaptive-P
    ban: gr.Textbox  # banned phrases, one a line (tokenswift/sampling/banned.py)
    preset: gr.Dropdown  # the built-in presets (ui/write/presets.py)
    save_preset: gr.Button
    preset_file: gr.File  # the saved preset, to download
    load_preset: gr.UploadButton
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
    full: gr.HTML
    alpha: gr.Plot
    ngram: gr.Plot
    speed: gr.Plot
    saved: gr.Plot
    timer: gr.Timer
    speed_line: gr.Markdown
    offer: gr.Row  # the paused (or running) draft offered on page load
    offer_text: gr.Markdown
    offer_resume: gr.Button
    offer_open: gr.Button
    offered: gr.State  # its id
    edit: gr.Button
    editor: gr.Textbox
    edit_row: gr.Row
    save_edit: gr.Button
    cancel_edit: gr.Button
    restore: gr.Button
    reflow: gr.Checkbox
    seen_show: gr.Button  # "What the model sees" (ui/write/seen.py)
    seen: gr.HTML
    branching: write_branches.BranchParts  # alternatives and branches (ui/write/write_branches.py)

    @property
    def form(self) -> list:
        """In SettingsForm's field order."""
        return [self.mode, self.target, self.penalty, self.penalty_window, self.k, self.sampler, self.sampler_value,
                self.temperature, self.seed, self.budget, self.prompt_format, self.past_eos, self.shift,
                *self.samplers.fields, self.ban]

    @property
    def view(self) -> list:
        """Everything a change of the draft on screen may update."""
        return [self.watch, self.book, self.remembered, self.status, self.bar, self.text, self.alpha, self.ngram,
                self.speed, self.saved, self.timer, self.pause, self.resume, self.stop, self.cont, self.full,
                self.full_shown, self.show_all, self.speed_line, self.edit, self.editor, self.edit_row,
                self.restore, self.offer, self.save_context, self.seen, self.ended]

    @property
    def opened(self) -> list:
        """view + the form fields a stored draft fills in."""
        return [*self.view, self.title, self.prompt, *self.form, self.memory, self.note, self.world.editor]


def build() -> WriteParts:
    d = SettingsForm()
    with gr.Row(visible=False, elem_id="write-offer") as offer:
        offer_text = gr.Markdown("", label="Draft on offer", elem_id="write-offer-text")
        offer_resume = gr.Button("Resume", variant="primary", size="sm", elem_id="write-offer-resume", scale=0)
        offer_open = gr.Button("Open", size="sm", elem_id="write-offer-open", scale=0)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=340):
            form = _form(d)
        with gr.Column(scale=3, min_width=420):
            view = _view()
    return WriteParts(
        watch=gr.State(None), book=gr.State(None), remembered=gr.BrowserState(None, storage_key="tokenswift-draft"),
        full_shown=gr.State(False), ended=gr.Textbox(visible=False, label="Last draft seen to stop"),
        timer=gr.Timer(TICK_S, active=False), offer=offer, offer_text=offer_text, offer_resume=offer_resume,
        offer_open=offer_open, offered=gr.State(None), **form, **view,
    )


def _form(d: SettingsForm) -> dict:
    """The left column: title, opening, length, settings and the buttons that start and steer a draft."""
    title = gr.Textbox("Untitled", label="Book title", elem_id="write-title", max_lines=1)
    prompt = gr.Textbox(label="Opening / prompt", lines=9, max_lines=18, elem_id="write-prompt",
                        placeholder="Once upon a time, in a lighthouse at the edge of the map, …  "
                                    "(type or load a .txt; Ctrl+Enter starts)")
    upload = gr.UploadButton("Load .txt…", file_types=[".txt"], size="sm", elem_id="write-upload")
    with gr.Row():
        prompt_format = gr.Radio(list(PROMPT_FORMATS), value=d.prompt_format, label="The prompt is",
                                 elem_id="write-prompt-format", scale=2,
                                 info="An opening the model continues, or an instruction it follows "
                                      "(\"Write the first chapter of a gothic novel set in a Cornish harbour town\").")
        past_eos = gr.Radio(list(PAST_EOS), value=d.past_eos, label="When the model wants to end the text",
                            elem_id="write-past-eos", scale=2,
                            info="Keep writing bans the end-of-text token, so the draft reaches its length "
                                 "(as the API and the command line do); Stop there ends it where the model does.")
    with gr.Row():
        target = gr.Number(d.target, label=TARGET_LABEL, precision=0, elem_id="write-target", scale=2,
                           info="About ¾ of a word each: 1,000 tokens ≈ 750 words.")
        mode = gr.Radio(list(MODES), value=d.mode, label="Mode", elem_id="write-mode", scale=2,
                        info="TokenSwift writes the very same text as plain decoding (AR), faster (on a GPU, in "
                             "16-bit or float32 numbers, a near tie can part them: the model notice says so).")
    quick = gr.Radio(list(QUICK_LENGTHS), value=None, label="Quick picks", elem_id="write-quick")
    limit = gr.Markdown("Model limit: waiting for the worker…", label="Model limit", elem_id="write-limit")
    with gr.Accordion("Memory and Author's Note", open=False, elem_id="write-context"):
        memory = gr.Textbox("", label="Memory (always at the top of what the model sees)", lines=3, max_lines=8,
                            elem_id="write-memory", placeholder="The premise, the characters, the setting…",
                            info="However long the draft grows, the model keeps reading this (an instruction "
                                 "draft as its system message). \"What the model sees\" shows where both sit.")
        note = gr.Textbox("", label="Author's Note (a few hundred tokens before the end)", lines=2, max_lines=5,
                          elem_id="write-note", placeholder="Style, mood, what happens next…",
                          info="Steers the next pages (an instruction draft gets it as your message just before "
                               "its latest lines). Saved edits apply from the next context shift or resume.")
        shift = gr.Radio(list(CONTEXT_SHIFT), value=d.shift, label="Past the model's context",
                         elem_id="write-shift",
                         info="Shift: drop the oldest text, keep Memory and the latest pages (any length). "
                              "Refuse: targets must fit the model's context.")
        save_context = gr.Button("Save Memory and Note to this draft", size="sm", interactive=False,
                                 elem_id="write-save-context")
    world = world_info_panel.build()
    settings = _settings(d)
    with gr.Row():
        start = gr.Button("▶ Start", variant="primary", elem_id="write-start", scale=2)
        cont = gr.Button("Continue", interactive=False, elem_id="write-continue")
    with gr.Row():
        pause = gr.Button("Pause", interactive=False, elem_id="write-pause", size="sm")
        resume = gr.Button("Resume", interactive=False, elem_id="write-resume", size="sm")
        stop = gr.Button("■ Stop", variant="stop", interactive=False, elem_id="write-stop", size="sm")
        new_book = gr.Button("New book", elem_id="write-new", size="sm")
    return dict(title=title, prompt=prompt, upload=upload, prompt_format=prompt_format, past_eos=past_eos,
                target=target, quick=quick, limit=limit, mode=mode, shift=shift, memory=memory, note=note,
                save_context=save_context, world=world, **settings, start=start, pause=pause, resume=resume, stop=stop,
                cont=cont, new_book=new_book)


def _settings(d: SettingsForm) -> dict:
    """The settings accordion: presets, the repetition penalty, the sampler, speed, DRY and XTC, banned phrases. The
    boxes of the settings table's rows are built from it (ui/forms/boxes.py); the speed knobs and the seed are not
    its rows."""
    with gr.Accordion("Settings (presets, repetition, sampler, speed, DRY, XTC)", open=False,
                      elem_id="write-settings"):
        presets = _presets()
        with gr.Row():
            penalty = box(ROWS["penalty"], d.penalty, "write-theta")
            penalty_window = box(ROWS["penalty_window"], d.penalty_window, "write-w")
            k = gr.Number(d.k, label="Phrase guesses", precision=0, elem_id="write-k",
                          info="How many phrases from the text so far are tried as guesses (k, the n-gram top-k; "
                               "speed only, the text stays the same).")
        with gr.Row():
            sampler = gr.Radio(list(SAMPLERS), value=d.sampler, label="Sampler", elem_id="write-sampler",
                               info="How the next word is drawn from the likely ones.")
            # The chosen sampler's box (its label follows the choice: ui/write/write.py); its row's help would be
            # wrong once another is chosen.
            sampler_value = box(ROWS[SAMPLERS[d.sampler][0]], d.sampler_value, "write-sampler-value", helped=False)
        with gr.Row():
            temperature = box(ROWS["temperature"], d.temperature, "write-temperature")
            seed = gr.Number(d.seed, label="Seed", precision=0, elem_id="write-seed",
                             info="The same seed and settings write the same text again.")
            budget = gr.Number(d.budget, label="Guessing context (0 = auto)", precision=0, elem_id="write-budget",
                               info="Tokens of the story the guessing step reads (the partial-cache budget; speed "
                                    "only, the text stays the same; 0 picks it for you).")
        with gr.Accordion("Repetition and stock phrases (DRY, XTC)", open=False, elem_id="write-dry-xtc"):
            samplers = samplers_panel.build(d, "write")
        with gr.Accordion("Banned phrases", open=False, elem_id="write-ban-box"):
            # A new draft starts with the stock phrases, on view and editable (the API and CLI ban none unless asked).
            ban = gr.Textbox("\n".join(STARTER_BANS), label="Banned phrases (one a line)", lines=6, max_lines=16,
                             elem_id="write-ban",
                             info="The draft never contains these, in any case: where one would be completed, the "
                                  "model goes back to where it began and writes it another way (the same text in "
                                  "TokenSwift and AR). Starts with stock phrases; edit freely.")
    return dict(penalty=penalty, penalty_window=penalty_window, k=k, sampler=sampler, sampler_value=sampler_value,
                temperature=temperature, seed=seed, budget=budget, samplers=samplers, ban=ban, **presets)


def _presets() -> dict:
    """A built-in preset to choose, or the writer's own saved to / loaded from a JSON file."""
    with gr.Row():
        preset = gr.Dropdown(list(built_in()), value=None, label="Preset", elem_id="write-preset", scale=3,
                             info="Fills the sampler, penalty, DRY, XTC and end-of-text settings below; the length, "
                                  "seed and speed settings stay as they are.")
        with gr.Column(scale=2, min_width=140):
            save_preset = gr.Button("Save preset", size="sm", elem_id="write-save-preset")
            load_preset = gr.UploadButton("Load preset…", file_types=[".json"], size="sm", elem_id="write-load-preset")
    preset_file = gr.File(label="Saved preset", interactive=False, visible=False, elem_id="write-preset-file")
    return dict(preset=preset, save_preset=save_preset, preset_file=preset_file, load_preset=load_preset)


def _view() -> dict:
    """The right column: status, the draft (live, whole, or in the editor) and the speed charts."""
    status = gr.Markdown("Write or load an opening, pick a length, press **Start** (Ctrl+Enter). "
                         "The draft keeps going if you close this tab.", label="Write status", elem_id="write-status")
    bar = gr.HTML(views.progress_bar(None), label="Progress", elem_id="write-bar")
    speed_line = gr.Markdown("", label="Speed in words", elem_id="write-speed")
    text = gr.Textbox(label=f"Draft (live: last {TAIL_CHARS:,} characters)", lines=16, max_lines=16,
                      interactive=False, autoscroll=False, elem_id="write-text",
                      elem_classes=["ts-draft", "ts-follow"], buttons=["copy"])
    editor = gr.Textbox(label="Your edit of the whole draft", lines=20, max_lines=40, interactive=True,
                        visible=False, elem_id="write-editor", elem_classes="ts-draft")
    with gr.Row(visible=False) as edit_row:
        save_edit = gr.Button("Save as a new revision", variant="primary", size="sm", elem_id="write-save-edit")
        cancel_edit = gr.Button("Cancel", size="sm", elem_id="write-cancel-edit")
    with gr.Row():
        show_all = gr.Button("Show whole text", size="sm", elem_id="write-show-all")
        edit = gr.Button("✎ Edit", size="sm", interactive=False, elem_id="write-edit")
        restore = gr.Button("Restore the model's version", size="sm", visible=False, elem_id="write-restore")
        reflow = gr.Checkbox(False, label="Reading view: join wrapped lines into paragraphs", elem_id="write-reflow")
    full = gr.HTML("", label="Whole text", visible=False, elem_id="write-full", elem_classes="ts-draft")
    with gr.Accordion("What the model sees", open=False, elem_id="write-seen-box"):
        seen_show = gr.Button("Show what the model sees now", size="sm", elem_id="write-seen-show")
        seen = gr.HTML("", label="What the model sees", elem_id="write-seen")
    branching = write_branches.build()
    with gr.Row():
        alpha = gr.Plot(charts.alpha_chart([]), label="α chart", elem_id="chart-alpha", show_label=False)
        ngram = gr.Plot(charts.ngram_chart([]), label="n-gram chart", elem_id="chart-ngram", show_label=False)
    with gr.Row():
        speed = gr.Plot(charts.speed_chart([]), label="speed chart", elem_id="chart-speed", show_label=False)
        saved = gr.Plot(charts.saved_chart([]), label="time-saved chart", elem_id="chart-saved", show_label=False)
    with gr.Accordion("How to read these charts", open=False, elem_id="write-chart-help"):
        gr.Markdown(CHART_HELP)
    return dict(status=status, bar=bar, speed_line=speed_line, text=text, editor=editor, edit_row=edit_row,
                save_edit=save_edit, cancel_edit=cancel_edit, show_all=show_all, edit=edit, restore=restore,
                reflow=reflow, full=full, seen_show=seen_show, seen=seen, branching=branching, alpha=alpha,
                ngram=ngram, speed=speed, saved=saved)
