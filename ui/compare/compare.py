"""Compare tab: one prompt and seed, 2-4 columns of penalty, its window, k and sampler, run side by side.

Every distinct sampling setting (seed, sampler, penalty and its window) also gets one AR run: TokenSwift is lossless, so
each column's token ids must equal its AR twin's. Columns that differ only in k (or the cache budget)
share a twin, and the table shows that changing k changed the speed, never the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from storage import NotFound, StoreError
from storage.changes import Changes
from storage.models import COMPARISON
from storage.records import GenerationRecord
from tokenswift.decode.metrics import distinct
from tokenswift.settings import DRAFTERS, DraftSettings, Settings, SettingsError, Speculation
from ui.compare.store_ops import CompareStore
from ui.display import charts, views
from ui.display.live import POLL, Watch
from ui.drafts.drafts import DraftService
from ui.drafts.tokens import PromptTokens
from ui.forms import boxes, samplers_panel
from ui.forms.forms import DEFAULTS, ROWS, SAMPLERS, FormError, SettingsForm, ar_twin, labelled
from ui.forms.samplers_panel import SamplerParts

LETTERS = "ABCD"
TICK_S = 1.0
TEXT_CHARS = 4_000
# Column defaults: A is the Write tab's defaults; B differs from A only in the drafter (the heads against the draft
# layer that auto picks on a CPU: same text, other speed); C turns the penalty off; D is top-p 0.9 (what the app
# used to start with).
_A = {"penalty": DEFAULTS["penalty"], "penalty_window": DEFAULTS["penalty_window"], "k": DEFAULTS["k"],
      "sampler": DEFAULTS["sampler"], "value": SAMPLERS[DEFAULTS["sampler"]][1], "drafter": Speculation.drafter}
PRESETS = [_A, {**_A, "drafter": "fused"}, {**_A, "penalty": 1.0},
           {"penalty": 1.2, "penalty_window": 1024, "k": 20, "sampler": "top-p", "value": 0.9,
            "drafter": Speculation.drafter}]
DRAFTER_HELP = ("auto: the draft layer on a CPU where the model has one, else fused; fused: drafts from the "
                "verification pass's own states (one pass per step); paper: a draft pass over the partial cache "
                "first; layer: a small draft layer guesses one token at a time, each knowing the one before. Speed "
                "only: the text is the same.")
FIELDS = 6 + len(samplers_panel.NAMES)  # form values per column: ColumnParts.fields
# Plain words on first sight; the paper's symbol and what a number means in a tooltip (ui/page.py sets them).
TIPS = {
    "Same text as plain decoding": "TokenSwift is lossless: its text must equal the plain (AR) run's, token for token",
    "Guesses accepted": "α: the share of drafted tokens the model accepted",
    "Reused from the text": "β: the share of drafted tokens accepted that came from phrases already in the text",
    "Tokens per step": "tokens written per model pass (1 for plain decoding)",
    "Speed-up vs plain": "tokens/s against the plain (AR) run of the same settings, on this machine",
    "Word variety": "distinct-1: different tokens / all tokens (1 = no token repeats)",
    "Pair variety": "distinct-2: different token pairs / all pairs",
    "3-gram variety": "distinct-3: different runs of 3 tokens / all of them",
    "4-gram variety": "distinct-4: different runs of 4 tokens / all of them (low = loops)",
    ROWS["penalty"].knob.label: "θ: how strongly tokens already in the window are pushed down (1 = off)",
    ROWS["penalty_window"].knob.label: "W: how many recent tokens the penalty looks at",
    "Phrase guesses": "k: how many phrases from the text so far are tried as guesses (speed only)",
}
PLAIN = {"helped": False, "hinted": False}  # the table's boxes in a column: their plain names, which TIPS explain
HEADERS = ["Run", "Same text as plain decoding", "Status", "Tokens", "Guesses accepted", "Reused from the text",
           "Tokens per step", "Tokens/s", "Speed-up vs plain", "Word variety", "Pair variety", "3-gram variety",
           "4-gram variety", "Settings"]


@dataclass
class ColumnParts:
    box: gr.Column
    penalty: gr.Number
    penalty_window: gr.Number
    k: gr.Number
    sampler: gr.Radio
    value: gr.Number
    drafter: gr.Radio
    samplers: SamplerParts

    @property
    def fields(self) -> list:
        return [self.penalty, self.penalty_window, self.k, self.sampler, self.value, self.drafter,
                *self.samplers.fields]


@dataclass
class CompareParts:
    runs: gr.State  # Runs | None
    remembered: gr.BrowserState  # the last comparison's ids, so a reopened tab shows it again
    prompt: gr.Textbox
    seed: gr.Number
    target: gr.Number
    temperature: gr.Slider
    count: gr.Radio
    columns: list[ColumnParts]
    run: gr.Button
    status: gr.Markdown
    texts: list[gr.Textbox]
    table: gr.Dataframe
    alpha: gr.Plot
    speed: gr.Plot
    timer: gr.Timer

    @property
    def column_fields(self) -> list:
        return [f for c in self.columns for f in c.fields]

    @property
    def view(self) -> list:
        return [self.runs, self.remembered, self.status, *self.texts, self.table, self.alpha, self.speed, self.timer]


@dataclass
class Runs:
    """One comparison: the TokenSwift run of each column and the AR twin each one is checked against."""

    labels: list[str]
    settings: list[str]  # a short description per column
    ts_ids: list[int]
    twin_ids: list[int]  # per column
    watches: dict[int, Watch] = field(default_factory=dict)
    finished: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)  # ids, distinct-1..4

    def key(self) -> dict:
        return {"labels": self.labels, "settings": self.settings, "ts_ids": self.ts_ids, "twin_ids": self.twin_ids}

    @property
    def ar_ids(self) -> list[int]:
        return list(dict.fromkeys(self.twin_ids))

    @property
    def active(self) -> bool:
        return any(w.active for w in self.watches.values())


def kept() -> tuple[gr.BrowserState, gr.Timer]:
    """The comparison's memory in this browser and its timer: made outside the tabs (ui/page.py), because a tab's
    components are mounted when it is first shown, and a reloaded page opens on the Write tab. Made inside, the
    remembered ids were read as None on load and Compare came back empty."""
    return gr.BrowserState(None, storage_key="tokenswift-compare"), gr.Timer(TICK_S, active=False)


def build(remembered: gr.BrowserState, timer: gr.Timer) -> CompareParts:
    """remembered, timer: kept()'s, made outside the tabs."""
    gr.Markdown("Same prompt and seed, different settings. Each distinct sampling setting also runs once with "
                "plain decoding: TokenSwift must write exactly the plain text, whatever its settings cost in "
                "speed. Hover over a name for its symbol and meaning.")
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", lines=3, scale=3, elem_id="compare-prompt",
                            placeholder="The storm had been building over the harbour for three days…")
        with gr.Column(scale=1, min_width=220):
            seed = gr.Number(0, label="Seed", precision=0, elem_id="compare-seed")
            target = gr.Number(500, label="Tokens per run", precision=0, elem_id="compare-target")
            temperature = boxes.box(ROWS["temperature"], DEFAULTS["temperature"], "compare-temperature", **PLAIN)
    count = gr.Radio(["2", "3", "4"], value="2", label="Columns", elem_id="compare-count")
    columns, texts = [], []
    with gr.Row():
        for i, preset in enumerate(PRESETS):
            with gr.Column(visible=i < 2, min_width=200, elem_classes="ts-column") as box:
                gr.Markdown(f"**Column {LETTERS[i]}**")
                penalty = boxes.box(ROWS["penalty"], preset["penalty"], f"compare-theta-{i}", **PLAIN)
                penalty_window = boxes.box(ROWS["penalty_window"], preset["penalty_window"], f"compare-w-{i}", **PLAIN)
                k = gr.Number(preset["k"], label="Phrase guesses", precision=0,
                              elem_id=f"compare-k-{i}")
                sampler = gr.Radio(list(SAMPLERS), value=preset["sampler"], label="Sampler",
                                   elem_id=f"compare-sampler-{i}")
                value = gr.Number(preset["value"], label="Sampler value", step=0.01, elem_id=f"compare-value-{i}")
                drafter = gr.Radio(list(DRAFTERS), value=preset["drafter"], label="Drafter", info=DRAFTER_HELP,
                                   elem_id=f"compare-drafter-{i}")
                with gr.Accordion("DRY and XTC", open=False, elem_id=f"compare-dry-xtc-{i}"):
                    samplers = samplers_panel.build(SettingsForm(), f"compare-{i}", helped=False)
                columns.append(ColumnParts(box, penalty, penalty_window, k, sampler, value, drafter, samplers))
    run = gr.Button("Run comparison", variant="primary", elem_id="compare-run")
    status = gr.Markdown("", label="Compare status", elem_id="compare-status")
    with gr.Row():
        for i in range(len(PRESETS)):
            texts.append(gr.Textbox(label=f"Column {LETTERS[i]}", lines=12, max_lines=12, interactive=False,
                                    visible=i < 2, elem_id=f"compare-text-{i}", elem_classes=["ts-draft", "ts-follow"]))
    widths = ["120px", "190px", "110px", "75px", "95px", "95px", "95px", "85px", "95px", *["90px"] * 4, "330px"]
    table = gr.Dataframe(headers=HEADERS, value=[], interactive=False, wrap=True, elem_id="compare-table",
                         column_widths=widths,
                         label="Results (speed from the worker's measurements; variety over the tokens written)")
    with gr.Row():
        alpha = gr.Plot(charts.alpha_chart([]), label="guesses overlay", show_label=False, elem_id="compare-alpha")
        speed = gr.Plot(charts.speed_chart([]), label="speed overlay", show_label=False, elem_id="compare-speed")
    return CompareParts(gr.State(None), remembered, prompt, seed, target, temperature, count, columns, run, status,
                        texts, table, alpha, speed, timer)


def describe(asked: DraftSettings) -> str:
    s, speed = asked.settings, asked.speed
    sampler = next((f"{name} {getattr(s, f):g}" for name, (f, _, _) in SAMPLERS.items()
                    if getattr(s, f) != getattr(Settings, f)), "no filter")
    drafter = f" · {speed.drafter} drafter" if speed.mode == "tokenswift" else ""
    dry = f" · DRY {s.dry_multiplier:g}" if s.dry_multiplier else ""
    xtc = f" · XTC {s.xtc_probability:g} above {s.xtc_threshold:g}" if s.xtc_probability else ""
    return (f"penalty {s.penalty:g} · window {s.penalty_window} · {speed.ngram_topk} phrase guesses · {sampler} · "
            f"temperature {s.temperature:g}{dry}{xtc}{drafter}")


def queue_runs(drafts: DraftService, prompt: str, seed, target, temperature, count: int, values: list) -> Runs:
    """Validate every column, then queue the TokenSwift runs and one AR twin per distinct sampling setting, all through
    the drafts service (the prompt counted once, for every column)."""
    budget = drafts.budget(prompt)
    settings = []
    for i in range(count):
        penalty, penalty_window, k, sampler, value, drafter, *boxes = values[FIELDS * i:FIELDS * (i + 1)]
        knobs = dict(zip(samplers_panel.NAMES, boxes, strict=True))
        # Compare measures settings side by side within one context: it keeps refusing longer targets.
        form = SettingsForm(mode="TokenSwift", target=target, penalty=penalty, penalty_window=penalty_window, k=k,
                            sampler=sampler, sampler_value=value, temperature=temperature, seed=seed, budget=0,
                            drafter=drafter, shift="Refuse", **knobs)
        try:
            settings.append(form.to_settings())
            drafts.check(settings[-1], budget=budget)
        except (FormError, SettingsError) as error:
            message = labelled(error) if isinstance(error, SettingsError) else str(error)
            raise FormError(f"Column {LETTERS[i]} — {message}") from None
    book = drafts.store.create_session(f"Compare: {' '.join(prompt.split()[:6])}…", "", kind=COMPARISON).id
    ts_ids = [drafts.start(prompt, s, book=book, budget=budget).id for s in settings]
    twins: dict[DraftSettings, int] = {}
    for s in settings:
        twin = ar_twin(s)
        if twin not in twins:
            twins[twin] = drafts.start(prompt, twin, book=book, budget=budget).id
    return Runs(list(LETTERS[:count]), [describe(s) for s in settings], ts_ids,
                [twins[ar_twin(s)] for s in settings])


def results(store: CompareStore, runs: Runs) -> list[list]:
    """The table: one row per column, then one per AR twin."""
    ar_speed = {gid: _speed(runs.watches[gid]) for gid in runs.ar_ids}
    rows = []
    for label, desc, gid, twin in zip(runs.labels, runs.settings, runs.ts_ids, runs.twin_ids, strict=True):
        w = runs.watches[gid]
        m = w.latest
        speed, base = _speed(w), ar_speed.get(twin)
        speedup = f"{speed / base:.2f}×" if speed and base else "…"
        rows.append([label, _same(store, runs, gid, twin), _status(w.record), w.record.produced_tokens,
                     _f(m and m.alpha), _f(m and m.beta), _f(m and m.tokens_per_step), _f(speed, 1), speedup,
                     *_distinct(store, runs, gid), desc])
    for gid in runs.ar_ids:
        w, of = runs.watches[gid], _twin_of(runs, gid)
        rows.append([f"Plain decoding of {of}", "–", _status(w.record), w.record.produced_tokens, "–", "–",
                     _f(w.latest and w.latest.tokens_per_step), _f(ar_speed[gid], 1),
                     "1.00×" if ar_speed[gid] else "…", *_distinct(store, runs, gid),
                     describe(DraftSettings.from_json(w.record.settings_json))])
    return rows


def _status(record: GenerationRecord) -> str:
    """The run's status, and why it ended where it did when that was before its target."""
    ended = views.why_ended(record)
    return f"{record.status}: {ended}" if ended else record.status


def _twin_of(runs: Runs, gid: int) -> str:
    """The columns a plain run is the twin of: "A" or "A, B"."""
    return ", ".join(label for label, twin in zip(runs.labels, runs.twin_ids, strict=True) if twin == gid)


def _speed(w: Watch) -> float | None:
    return w.latest.tokens_per_s if w.latest and w.latest.tokens_per_s else None


def _f(x: float | None, digits: int = 3) -> str:
    return "…" if x is None else f"{x:.{digits}f}"


def _finished_ids(store: CompareStore, runs: Runs, gid: int) -> tuple[list[int], list[float]] | None:
    if gid not in runs.finished and runs.watches[gid].record.status == "done":
        ids = store.get_tokens(gid).generated_ids
        runs.finished[gid] = (ids, distinct(ids))
    return runs.finished.get(gid)


def _distinct(store: CompareStore, runs: Runs, gid: int) -> list[str]:
    done = _finished_ids(store, runs, gid)
    return [f"{d:.3f}" for d in done[1]] if done else ["…"] * 4


def _same(store: CompareStore, runs: Runs, gid: int, twin: int) -> str:
    mine, theirs = _finished_ids(store, runs, gid), _finished_ids(store, runs, twin)
    if mine is None or theirs is None:
        return "…"
    a, b = mine[0], theirs[0]
    if a == b:
        return f"✔ identical ({len(a):,} tokens)"
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"✘ differs from token {first:,}"


def chart_series(runs: Runs) -> tuple[charts.Series, charts.Series]:
    """(TokenSwift runs, plain runs), each named for the legend: "A TokenSwift", "A, B plain"."""
    ts = [(f"{label} TokenSwift", runs.watches[gid].points) for label, gid in zip(runs.labels, runs.ts_ids,
                                                                                  strict=True)]
    return ts, [(f"{_twin_of(runs, gid)} plain", runs.watches[gid].points) for gid in runs.ar_ids]


def render(p: CompareParts, store: CompareStore, runs: Runs) -> dict:
    out = {p.runs: runs, p.remembered: runs.key(), p.table: results(store, runs), p.timer: gr.Timer(active=runs.active)}
    for i, text in enumerate(p.texts):
        if i < len(runs.ts_ids):
            w = runs.watches[runs.ts_ids[i]]
            ended = views.why_ended(w.record)
            out[text] = gr.Textbox(value=w.generated_tail[-TEXT_CHARS:], visible=True,
                                   label=f"{runs.labels[i]} · {runs.settings[i]}" + (f" · {ended}" if ended else ""))
        else:
            out[text] = gr.Textbox(visible=False)
    ts, ar = chart_series(runs)
    out[p.alpha] = charts.alpha_chart(ts)
    out[p.speed] = charts.speed_chart(ts + ar)
    done = sum(w.record.status == "done" for w in runs.watches.values())
    total = len(runs.watches)
    state = "running" if runs.active else "finished"
    out[p.status] = f"Comparison {state}: {done} of {total} runs done (runs go through the worker's queue in turn)."
    return out


def wire(p: CompareParts, store: CompareStore, page: gr.Blocks, tokens: PromptTokens,
         changes: Changes | None = None) -> None:
    """changes: the store's commit counter, so ticks read nothing while nothing was committed (ui/display/live.py)."""
    fast = {"concurrency_limit": None}
    drafts = DraftService(store, tokens)

    def watch_all(runs: Runs) -> Runs:
        for gid in runs.ts_ids + runs.ar_ids:
            runs.watches[gid] = Watch.open(store, gid)
        return runs

    def run(prompt, seed, target, temperature, count, *values):
        if not (prompt or "").strip():
            gr.Warning("Prompt: write the prompt to compare on first.")
            return {p.status: f"{views.dot('bad')} Prompt: write the prompt to compare on first."}
        try:
            runs = queue_runs(drafts, prompt, seed, target, temperature, int(count), list(values))
        except (FormError, StoreError) as error:
            gr.Warning(views.plain(str(error)))
            return {p.status: f"{views.dot('bad')} {error}"}
        return render(p, store, watch_all(runs))

    def tick(runs: Runs | None):
        if runs is None:
            return {p.timer: gr.Timer(active=False)}
        try:
            changed = [any(w.refresh(store, changes)) for w in runs.watches.values()]
        except NotFound:
            return {p.runs: None, p.timer: gr.Timer(active=False), p.status: "These runs were deleted."}
        return render(p, store, runs) if any(changed) else {p.status: gr.skip()}  # a dict: one output unchanged

    def set_count(count, dict_form=False):
        n = int(count)
        boxes = {c.box: gr.Column(visible=i < n) for i, c in enumerate(p.columns)}
        if dict_form:  # restoring: the texts come from render
            return {**boxes, p.count: str(n)}
        return [*boxes.values(), *[gr.Textbox(visible=i < n) for i in range(len(p.texts))]]

    inputs = [p.prompt, p.seed, p.target, p.temperature, p.count, *p.column_fields]
    def restore(remembered: dict | None):
        """Page load: the comparison this browser last ran, if its runs still exist."""
        if not remembered:
            return {p.status: gr.skip()}
        try:
            runs = watch_all(Runs(**remembered))
        except (NotFound, TypeError):
            return {p.remembered: None}
        first = runs.watches[runs.ts_ids[0]].record  # what every run was asked with: prompt, seed, length, temperature
        asked = DraftSettings.from_json(first.settings_json).settings
        return {**render(p, store, runs), **set_count(len(runs.ts_ids), dict_form=True), p.prompt: first.prompt_text,
                p.seed: asked.seed, p.target: asked.max_new_tokens, p.temperature: asked.temperature}

    p.run.click(run, inputs, p.view, api_name="compare_run", **fast)
    page.load(restore, p.remembered, [*p.view, p.count, *[c.box for c in p.columns], p.prompt, p.seed, p.target,
                                      p.temperature], api_name="compare_restore", **fast)
    p.timer.tick(tick, p.runs, p.view, api_name="compare_tick", **POLL)
    p.count.change(set_count, p.count, [c.box for c in p.columns] + p.texts, api_name="compare_columns", **fast)
