"""The Write tab's alternatives and branches: the draft's words as clickable tokens; a click shows the model's other
likely tokens there with their probabilities (recorded as it wrote, ui/drafts/branches.py); picking one starts a branch
that writes on from it, and the tab follows it. The original and its branches are listed, to switch between them.

A click on a word fills a hidden position box and presses a hidden button (the token view's own script), so the
position reaches the server as an ordinary event's input. The events are wired in ui/write/write_branch_events.py.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from ui.drafts.branches import token_texts
from ui.drafts.tokens import PromptTokens
from ui.write.store_ops import WriteStore

VIEW_TOKENS = 1_500  # the draft's last tokens in the token view (a page of spans stays quick to draw)

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


def words_html(store: WriteStore, tokens: PromptTokens, gen_id: int) -> str:
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


def family_choices(store: WriteStore, gen_id: int) -> list[tuple[str, int]]:
    labels = []
    for b in store.branches(gen_id):
        r = b.record
        where = "original" if b.position is None else f"branch of #{r.parent_id} at token {b.position:,}"
        labels.append((f"#{r.id} {where} · {r.status} · {r.produced_tokens:,} tokens", r.id))
    return labels
