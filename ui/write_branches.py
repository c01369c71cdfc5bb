"""The Write tab's alternatives and branches: the draft's words as clickable tokens; a click shows the model's other
likely tokens there with their probabilities (recorded as it wrote, ui/branches.py); picking one starts a branch that
writes on from it, and the tab follows it. The original and its branches are listed, to switch between them.

A click on a word fills a hidden position box and presses a hidden button (the token view's own script), so the
position reaches the server as an ordinary event's input.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from storage import Conflict, NotFound, Store, StoreError
from storage.errors import Invalid
from ui import views
from ui.branches import NoTokenizer, alternatives, start_branch, token_texts
from ui.live import Watch
from ui.tokens import PromptTokens

VIEW_TOKENS = 1_500  # the draft's last tokens in the token view (a page of spans stays quick to draw)
NOT_RECORDED = "No alternatives recorded for this part (it was written before they were recorded)."

CLICKS = """
element.addEventListener('click', (event) => {
  const word = event.target.closest('.ts-tok');
  if (!word) return;
  element.querySelectorAll('.ts-tok-picked').forEach((w) => w.classList.remove('ts-tok-picked'));
  word.classList.add('ts-tok-picked');
  const box = document.querySelector('#write-word-position input');
  box.value = word.dataset.pos;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  setTimeout(() => document.querySelector('#write-word-look').click(), 50);
});
"""
STYLE = """
.ts-words { white-space: pre-wrap; font-family: Georgia, 'Iowan Old Style', serif; font-size: 16px; line-height: 1.7;
            max-height: 420px; overflow-y: auto; padding: 8px 12px; border: 1px solid var(--border-color-primary);
            border-radius: 8px; }
.ts-tok { cursor: pointer; border-radius: 3px; }
.ts-tok:hover { background: #e0e7ff; }
.ts-tok-none { color: #6b7280; }
.ts-tok-picked { background: #c7d2fe; outline: 1px solid #4f46e5; }
"""


@dataclass
class BranchParts:
    box: gr.Accordion
    branches: gr.Dropdown  # the original and its branches
    show: gr.Button
    words: gr.HTML  # the clickable token view
    position: gr.Number  # hidden: the clicked word's position
    look: gr.Button  # hidden: pressed by the token view's script
    info: gr.Markdown
    choice: gr.Radio  # the alternatives at the clicked word
    branch: gr.Button
    at: gr.State  # the position the alternatives are shown for

    @property
    def reset(self) -> list:
        return [self.branches, self.words, self.info, self.choice, self.branch, self.at]


def build() -> BranchParts:
    with gr.Accordion("Alternatives and branches", open=False, elem_id="write-branch-box") as box:
        branches = gr.Dropdown([], value=None, label="Branches of this draft", elem_id="write-branches",
                               info="The original and the branches started from it; pick one to open it.")
        show = gr.Button("Show the words to click (again, as the draft grows)", size="sm", elem_id="write-words-show")
        words = gr.HTML("", elem_id="write-words", js_on_load=CLICKS, css_template=STYLE)
        position = gr.Number(None, precision=0, visible="hidden", elem_id="write-word-position")
        look = gr.Button("Alternatives", visible="hidden", elem_id="write-word-look")
        info = gr.Markdown("", elem_id="write-alt-info")
        choice = gr.Radio([], label="Other likely words here", elem_id="write-alternatives")
        branch = gr.Button("Branch from here with this word", interactive=False, size="sm", elem_id="write-branch")
    return BranchParts(box, branches, show, words, position, look, info, choice, branch, gr.State(None))


def words_html(store: Store, tokens: PromptTokens, gen_id: int) -> str:
    """The draft's last VIEW_TOKENS generated tokens as clickable spans (greyed where nothing was recorded)."""
    record = store.get_generation(gen_id, with_text=False)
    if record.produced_tokens == 0:
        return "<p>The model has written nothing in this draft yet: your text and the opening have no alternatives.</p>"
    span = store.span(gen_id, record.produced_tokens - VIEW_TOKENS)
    texts = tokens.use(record.model, lambda tokenizer, _: token_texts(tokenizer, span.context, span.ids))
    if texts is None:
        return f"<p>The tokenizer of {html.escape(record.model or 'this model')} cannot be loaded here.</p>"
    pieces = []
    for i, (text, recorded) in enumerate(zip(texts, span.recorded, strict=True)):
        if text:
            kind = "ts-tok" if recorded else "ts-tok ts-tok-none"
            pieces.append(f'<span class="{kind}" data-pos="{span.start + i}">{html.escape(text)}</span>')
    lead = (f"<p class='ts-legend'>The model's words from token {span.start:,} on: click one to see what else it "
            "might have written there. The opening and your own text have none.</p>")
    return f"{lead}<div class='ts-words'>{'…' if span.start else ''}{''.join(pieces)}</div>"


def family_choices(store: Store, gen_id: int) -> list[tuple[str, int]]:
    labels = []
    for b in store.branches(gen_id):
        r = b.record
        where = "original" if b.position is None else f"branch of #{r.parent_id} at token {b.position:,}"
        labels.append((f"#{r.id} {where} · {r.status} · {r.produced_tokens:,} tokens", r.id))
    return labels


def wire(p, store: Store, tokens: PromptTokens) -> None:
    """p: the tab's WriteParts (p.branching is this module's BranchParts)."""
    from ui.write_view import problem, show_generation  # here: write_view imports write_parts, which builds these

    b: BranchParts = p.branching
    fast = {"concurrency_limit": None}

    def refresh(gen_id: int | None):
        if gen_id is None:
            return {b.branches: gr.Dropdown(choices=[], value=None), b.words: "", **_cleared(b)}
        try:
            return {b.branches: gr.Dropdown(choices=family_choices(store, gen_id), value=gen_id),
                    b.words: words_html(store, tokens, gen_id), **_cleared(b)}
        except (NotFound, StoreError) as error:
            return {b.branches: gr.Dropdown(choices=[], value=None), b.words: "", **_cleared(b),
                    b.info: f"{views.dot('bad')} {error}"}

    def look(watch: Watch | None, position):
        if watch is None or position is None:
            return _cleared(b)
        try:
            view = alternatives(store, tokens, watch.gen_id, int(position))
        except (Invalid, NotFound, NoTokenizer, StoreError) as error:
            return {**_cleared(b), b.info: f"{views.dot('bad')} {error}"}
        if not view["recorded"]:
            return {**_cleared(b), b.info: NOT_RECORDED}
        own = view["token"]
        options = [(f"{_shown(a['text'])} · {a['probability']:.1%}", a["token"]) for a in view["alternatives"]
                   if a["token"] != own]
        info = (f"At token {view['position']:,} the model wrote **{_shown(view['text'])}** "
                f"({view['probability']:.1%}). " + ("Its other likely words:" if options else
                                                     "It had no other likely word there (the sampler's filters "
                                                     "left only this one)."))
        return {b.info: info, b.choice: gr.Radio(choices=options, value=None), b.branch: gr.Button(interactive=False),
                b.at: view["position"]}

    def make_branch(watch: Watch | None, at, token):
        if watch is None or at is None or token is None:
            return problem(p, "Branch: click a word, then pick one of its alternatives.")
        try:
            gen = start_branch(store, tokens, watch.gen_id, at, int(token))
        except (Invalid, Conflict, NotFound, NoTokenizer, StoreError) as error:
            return problem(p, f"Branch: {error}")
        return {**show_generation(p, store, gen.id, fill_form=False),
                p.status: f"{views.dot('run')} Branched: Draft #{gen.id} takes the other word at token {at:,} of "
                          f"#{watch.gen_id} and writes on from it; the original is kept (see *Branches*)."}

    def switch(gen_id):
        if gen_id is None:
            return gr.skip()
        try:
            return show_generation(p, store, int(gen_id))
        except (NotFound, StoreError) as error:
            return problem(p, f"Branches: {error}")

    # A draft opened anywhere (Start, Library, a branch, page load) changes the remembered id: list its family.
    p.remembered.change(refresh, p.remembered, b.reset, api_name="write_branches_refresh", **fast)
    shown = lambda watch: refresh(watch.gen_id if watch else None)  # noqa: E731
    b.show.click(shown, p.watch, b.reset, api_name="write_words", **fast)
    b.box.expand(shown, p.watch, b.reset, **fast)  # opened: the draft as it is now
    b.look.click(look, [p.watch, b.position], b.reset[2:], api_name="write_alternatives", **fast)
    b.choice.input(lambda choice: gr.Button(interactive=choice is not None), b.choice, b.branch, **fast)
    b.branch.click(make_branch, [p.watch, b.at, b.choice], p.opened, api_name="write_branch", **fast)
    b.branches.input(switch, b.branches, p.opened, api_name="write_branch_switch", **fast)


def _cleared(b: BranchParts) -> dict:
    return {b.info: "", b.choice: gr.Radio(choices=[], value=None), b.branch: gr.Button(interactive=False), b.at: None}


def _shown(text: str) -> str:
    """A token's text, quoted so that its spaces show ("␣and")."""
    return "“" + text.replace(" ", "␣").replace("\n", "↵") + "”"
