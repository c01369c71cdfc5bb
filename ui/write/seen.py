"""The Write tab's "What the model sees": the context the draft's next token is predicted from, as text, with
the Memory, the World Info entries, the Author's Note, the chat turns and the story no longer in view marked.

It is the engine's own window (tokenswift.text.context_window.WindowPlan.seen) for the draft's stored ids, its
settings and its Memory, note and World Info as they are now, decoded with the model's tokenizer (ui/drafts/tokens.py
loads it; no weights): an edit of them shows here at once, and reaches the model at its next shift or resume.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from storage.drafts import prompt_parts
from tokenswift.settings import DraftSettings, SettingsError
from tokenswift.text.context_window import leading_bos, pinned_ids, window_plan
from tokenswift.text.prompting import prompt_ids
from tokenswift.text.world_info import WorldInfo
from ui.drafts.tokens import PromptTokens
from ui.write.store_ops import WriteStore

UNKNOWN_CONTEXT = 1 << 30
SHIFTED_CHARS = 400  # of the text shifted out of view, the end shown (the whole draft is in "Show whole text")
STYLE = {"memory": "background:#fdf0c2", "world info": "background:#e3f5dc", "note": "background:#d9ecff",
         "frame": "color:#888;font-size:0.85em",
         "shifted": "color:#999;text-decoration:line-through", "story": ""}
LEGEND = ('<span style="{memory}">Memory</span> · <span style="{world}">World Info</span> · '
          '<span style="{note}">Author\'s Note</span> · '
          '<span style="{frame}">chat turns</span> · <span style="{shifted}">shifted out of view</span>')

# Chat templates' markers, as an instruction draft's turns decode: ChatML (SmolLM, Qwen) and Llama 3. A turn's start
# becomes its label ("You:"), its end a line break, a BOS nothing: the writer reads the turns, not the tokens.
MARKER = re.compile(r"<\|im_start\|>(?P<chatml>\w+)\n?|<\|start_header_id\|>(?P<llama>\w+)<\|end_header_id\|>\n*"
                    r"|(?P<end><\|im_end\|>\n?|<\|eot_id\|>)|<\|begin_of_text\|>|<s>|</s>")
ROLES = {"system": "System", "user": "You", "assistant": "Model"}
TURNS = ("frame", "note")  # the pieces that hold them (an instruction draft's note is a user turn)


@dataclass(frozen=True)
class _Vocab:
    """What the prompt and window functions read of a loaded model, from its tokenizer alone."""

    name: str
    tokenizer: object

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)


def context_html(store: WriteStore, tokens: PromptTokens, gen_id: int) -> str:
    """The view's HTML; a sentence instead when the model's tokenizer cannot be loaded in this process."""
    record = store.get_generation(gen_id, with_text=False)
    target = tokens.target()
    model = record.model or (target[0] if target else None)
    if model is None:
        return "<p>Shown once a model is chosen (Model tab).</p>"
    reported = target[1] if target and target[0] == model else None  # the worker's word on the context first
    try:
        pieces = tokens.use(model, lambda tokenizer, context: _pieces(store, record, _Vocab(model, tokenizer),
                                                                      reported or context))
    except SettingsError as error:  # e.g. a window larger than this model's context
        return f"<p>{html.escape(str(error))}</p>"
    if pieces is None:
        return "<p>The model's tokenizer cannot be loaded by the app, so this view is not available.</p>"
    return _render(pieces)


def _pieces(store: WriteStore, record, vocab: _Vocab, context: int | None) -> list[tuple[str, str, int]]:
    """(kind, text, tokens) of what the model sees for the draft's next token, as context_window lays it out."""
    settings = DraftSettings.from_json(record.settings_json).settings
    instruction = store.instruction(record.id)
    stored = store.get_tokens(record.id)
    if not (prompt := stored.prompt_ids):  # a writer's edit that never ran: its text as the worker tokenizes it
        text, story = prompt_parts(record.prompt_text, instruction)
        prompt = prompt_ids(vocab, text, settings.prompt_format, story)
    pinned = pinned_ids(vocab, record.memory, record.authors_note, instruction, WorldInfo.from_json(record.world_info))
    # A context nobody reported (no worker, no config here) cannot have shifted anything yet that we could know.
    plan = window_plan(settings, prompt, leading_bos(vocab, prompt), pinned, context or UNKNOWN_CONTEXT)
    return _decoded(vocab.tokenizer, [(kind, ids) for kind, ids in plan.seen(prompt + stored.generated_ids) if ids])


def _decoded(tokenizer, pieces: list[tuple[str, list[int]]]) -> list[tuple[str, str, int]]:
    """Each piece's text as it reads after the ones before (a SentencePiece tokenizer drops the space that starts
    a piece decoded alone: "woods.He"), from the decoded prefixes."""
    out, ids, text = [], [], ""
    for kind, piece in pieces:
        ids += piece
        longer = tokenizer.decode(ids)
        own = longer[len(text):] if longer.startswith(text) else tokenizer.decode(piece)
        out.append((kind, own, len(piece)))
        text = longer
    return out


def _render(pieces: list[tuple[str, str, int]]) -> str:
    in_view = sum(n for kind, _, n in pieces if kind != "shifted")
    counts = {kind: sum(n for k, _, n in pieces if k == kind) for kind in ("memory", "world info", "note", "shifted")}
    head = (f"<p><b>{in_view:,} tokens in view</b> · Memory {counts['memory']:,} · World Info {counts['world info']:,}"
            f" · Author's Note {counts['note']:,} · {counts['shifted']:,} earlier tokens shifted out<br>"
            f"{LEGEND.format(world=STYLE['world info'], **STYLE)}</p>")
    spans = []
    for kind, text, n in pieces:
        if kind == "shifted":
            tail = text[-SHIFTED_CHARS:]
            text = f"[{n:,} tokens no longer in view, ending:] …{tail}" if len(tail) < len(text) else text
        style = f' style="{STYLE[kind]}"' if STYLE[kind] else ""
        shown = readable(text) if kind in TURNS else html.escape(text)
        spans.append(f'<span class="ts-seen-{kind.replace(" ", "-")}"{style}>{shown}</span>')
    body = "".join(spans)
    return f'{head}<div class="ts-seen" style="white-space:pre-wrap">{body}</div>'


def readable(text: str) -> str:
    """`text` as HTML, its chat markers as the turns' labels (MARKER)."""
    out, at = [], 0
    for m in MARKER.finditer(text):
        out.append(html.escape(text[at:m.start()]))
        role = m.group("chatml") or m.group("llama")
        if role:
            out.append(f'<b class="ts-turn">{html.escape(ROLES.get(role, role.title()))}:</b> ')
        elif m.group("end"):
            out.append("\n")
        at = m.end()
    return "".join(out) + html.escape(text[at:])
