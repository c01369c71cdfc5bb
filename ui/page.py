"""The page: a header with the model's status, and the five tabs (one module each: build() + wire()).

Cross-tab wiring lives here: a slow timer that refreshes the banner, the Write tab's model limit and the
Model tab's details from the worker-status rows.
"""

from __future__ import annotations

import json

import gradio as gr

from storage import Store
from ui.compare import compare
from ui.display import views
from ui.display.live import POLL
from ui.drafts.exports import Exports
from ui.drafts.texts import DraftTexts
from ui.drafts.tokens import PromptTokens
from ui.library import library
from ui.model import model
from ui.plan import plan, plan_parts
from ui.write import presets, world_info_panel, write, write_parts, write_view

STATUS_S = 3.0

CSS = """
#ts-header { align-items: center; gap: 12px; }
#ts-brand h2 { margin: 0; white-space: nowrap; }
#ts-banner { font-size: 0.95em; }
.ts-progress { height: 8px; background: var(--neutral-200); border-radius: 4px; overflow: hidden; margin: 2px 0 6px; }
.ts-progress > div { height: 100%; background: var(--color-accent); transition: width 0.4s ease; }
.ts-paused > div { background: #d97706; }
.ts-done > div { background: #059669; }
.ts-failed > div, .ts-cancelled > div { background: #9ca3af; }
.ts-draft textarea { font-family: Georgia, 'Iowan Old Style', 'Times New Roman', serif; font-size: 16px;
                     line-height: 1.6; }
.ts-column { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px; }
.ts-dot { font-size: 0.9em; margin-right: 2px; }
.ts-ok { color: #059669; } .ts-run { color: #4f46e5; } .ts-wait { color: #d97706; }
.ts-off { color: #6b7280; } .ts-bad { color: #dc2626; }
footer { display: none !important; }
.ts-whole { white-space: pre-wrap; font-family: Georgia, 'Iowan Old Style', 'Times New Roman', serif; font-size: 16px;
            line-height: 1.6; max-height: 640px; overflow-y: auto; padding: 8px 12px;
            border: 1px solid var(--border-color-primary); border-radius: 8px; }
.ts-legend { font-size: 0.85em; color: #6b7280; margin-bottom: 4px; }
.ts-src-opening { background: #fdf6e3; }
.ts-src-edit { background: #fce7f3; text-decoration: underline dotted #db2777; }
.ts-plan-table { width: 100%; border-collapse: collapse; font-size: 0.95em; }
.ts-plan-table th, .ts-plan-table td { border-bottom: 1px solid var(--border-color-primary); padding: 4px 8px;
                                       text-align: left; vertical-align: top; }
#write-offer { border: 1px solid #d97706; border-radius: 8px; padding: 4px 10px; align-items: center; }
/* Toasts sit at the bottom, so they never cover the model banner at the top. */
.toast-wrap { top: auto !important; bottom: var(--size-4); }
"""

# Ctrl/Cmd+Enter starts a draft (when the Write tab is showing), as in TextGen and NovelAI.
# Live drafts (.ts-follow) stay scrolled to their newest words unless the writer scrolls up to read.
# Plain names (table headers, field labels) get their symbol and meaning as a tooltip (compare.TIPS).
HEAD = """
<script>
const TS_TIPS = """ + json.dumps(compare.TIPS) + """;
document.addEventListener('keydown', (event) => {
  if ((event.ctrlKey || event.metaKey) && event.key === 'Enter') {
    const start = document.querySelector('#write-start');
    if (start && start.offsetParent !== null && !start.disabled) { event.preventDefault(); start.click(); }
  }
});
document.addEventListener('scroll', (event) => {
  const box = event.target;
  if (box instanceof HTMLTextAreaElement && box.closest('.ts-follow')) {
    box.dataset.follow = box.scrollHeight - box.scrollTop - box.clientHeight < 40 ? '1' : '0';
  }
}, true);
setInterval(() => {
  for (const box of document.querySelectorAll('.ts-follow textarea')) {
    if (box.value.length !== Number(box.dataset.seen || -1) && box.dataset.follow !== '0') {
      box.scrollTop = box.scrollHeight;
    }
    box.dataset.seen = box.value.length;
  }
  for (const name of document.querySelectorAll('th, [data-testid="block-info"]')) {
    const tip = TS_TIPS[name.textContent.replace('⋮', '').trim()];  // a header's text ends in its menu's ⋮
    if (tip && name.title !== tip) { name.title = tip; }
  }
}, 400);
// Gradio's run history (off: ui/server.py) kept copies of the writer's text here, under a key per app start: an
// earlier version of the app left them behind.
for (const key of Object.keys(localStorage)) {
  if (key.startsWith('gradio:run-history:')) { localStorage.removeItem(key); }
}
</script>
"""

# Gradio's status tracker (a component's "1.2s" while it waits) asks for a frame from each frame until the wait ends,
# and the page's own "Loading..." tracker is removed still waiting, so that loop never ends (Gradio 6.31): an idle
# tab drew 60 frames a second (Chromium 2.08 CPU-s per 20 s idle; 0.84-1.01 with this). The tracker's module keeps the
# browser's requestAnimationFrame as it finds it when it loads, before Gradio adds HEAD, so this is served first in
# <head> (ui/api/html_edit.PageScript). Only a tracker's repeat (a frame asked for from within a tracker's frame)
# waits for a tracker on the page to show a wait: a first request (a timer's start, the spinner's animation loop,
# scrolling to an answer) always gets its frame, since a loop whose first frame never comes never starts again.
FIRST_IN_HEAD = """<script>
(() => {
  const frame = window.requestAnimationFrame.bind(window);
  let inTracker = false;
  window.requestAnimationFrame = (callback) => {
    if (!(new Error().stack || '').includes('/statustracker')) { return frame(callback); }
    const repeat = inTracker;
    return frame((time) => {
      if (repeat && !document.querySelector('[data-testid="status-tracker"] .progress-text')) { return; }
      inTracker = true;
      try { callback(time); } finally { inTracker = false; }
    });
  };
})();
</script>"""

THEME = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")


def build_page(store: Store, *, worker_hint: str, exports: Exports, tokens: PromptTokens | None = None,
               texts: DraftTexts | None = None) -> gr.Blocks:
    """worker_hint: what to tell the writer when no worker answers (depends on how the app was started).
    exports: the app's folder for Library exports. tokens, texts: the app's tokenizer and whole-text caches,
    shared with the API (new ones if not given)."""
    tokens = tokens or PromptTokens(store)
    texts = texts or DraftTexts(store)
    # Gradio keeps a copy of every file it serves (exports, uploads): cleared hourly and at shutdown.
    with gr.Blocks(title="TokenSwift Studio", delete_cache=(3600, 3600)) as page:
        with gr.Row(elem_id="ts-header"):
            gr.Markdown("## TokenSwift Studio", elem_id="ts-brand")
            # Built once when the app starts (before its worker runs): every page shows this until its load event
            # reads the workers, so it must not say there is none.
            banner = gr.Markdown(f"{views.dot('wait')} Checking the model…", label="Model banner", elem_id="ts-banner")
        compare_kept = compare.kept()  # outside the tabs: read on load, whichever tab shows
        with gr.Tabs(elem_id="ts-tabs") as tabs:
            with gr.Tab("Write", id="write", elem_id="tab-write"):
                write_ui = write_parts.build()
            with gr.Tab("Plan", id="plan", elem_id="tab-plan") as plan_tab:
                plan_ui = plan_parts.build()
            with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
                compare_parts = compare.build(*compare_kept)
            with gr.Tab("Library", id="library", elem_id="tab-library") as library_tab:
                library_parts = library.build()
            with gr.Tab("Model", id="model", elem_id="tab-model") as model_tab:
                model_parts = model.build()
        status_timer = gr.Timer(STATUS_S)

        write.wire(write_ui, store, page, tokens, texts)
        presets.wire(write_ui, exports)
        world_info_panel.wire(write_ui.world, write_ui.status, exports)
        compare.wire(compare_parts, store, page, tokens, texts.changes)
        library.wire(library_parts, store, write_ui, tabs, library_tab, exports, tokens)
        plan.wire(plan_ui, store, write_ui, tabs, plan_tab, exports, tokens)
        model.wire(model_parts, store, model_tab)

        def refresh_status():
            banner = views.model_banner(store.list_workers(), store.desired_model(), worker_hint)
            return banner, write_view.limit_line(store), model.status(store)

        status_timer.tick(refresh_status, None, [banner, write_ui.limit, model_parts.details],
                          api_name="app_status", **POLL)
        page.load(refresh_status, None, [banner, write_ui.limit, model_parts.details], api_name="app_status_load",
                  show_progress="hidden", concurrency_limit=None)
    progress_on_shown_outputs(page)
    return page


def progress_on_shown_outputs(page: gr.Blocks) -> None:
    """An event's progress goes to the outputs the page draws, not to its States and Timers (none if it has no other),
    which show none. Gradio's page keeps the loading status of every output any event has named, and at each message
    of any event it looks each one up in the page's tree (a depth-first search) and copies its value: the Write tab's
    events name 57-69 outputs, a dozen of them States. Chromium in test_ui_browser.py and test_plan_browser.py:
    51.8 CPU-s instead of 57.7."""
    unseen = (gr.State, gr.BrowserState, gr.Timer)
    for fn in page.fns.values():
        if fn.show_progress_on is None:
            fn.show_progress_on = [block for block in fn.outputs if not isinstance(block, unseen)]
