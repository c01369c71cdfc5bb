"""The whole draft as HTML: the opening, the model's text and the writer's edits told apart by a subtle
style (as NovelAI colours text by source), optionally reflowed into paragraphs the way exports are. An instruction
draft shows its story, with the instruction apart above it."""

from __future__ import annotations

import html

from bookexport import SCENE_BREAK, paragraphs
from storage.provenance import EDIT, MODEL, OPENING

LEGEND = ('<div class="ts-legend"><span class="ts-src-opening">your opening</span> · '
          '<span class="ts-src-ai">the model</span> · <span class="ts-src-edit">your edits</span></div>')
INSTRUCTION = '<div class="ts-legend ts-instruction">Instruction (not part of the story): {}</div>'
CLASSES = {OPENING: "ts-src-opening", MODEL: "ts-src-ai", EDIT: "ts-src-edit"}


def render(pieces: list[tuple[str, str]], *, reflow: bool = False, instruction: str | None = None) -> str:
    """pieces: (source, text) in order (Store.text_sources). instruction: an instruction draft's (Store.instruction),
    which the pieces start with: shown apart, above the story and marked, as the model answered it rather than
    wrote on from it. Such a story is not reflowed: each line break the model wrote ends a paragraph (as in its
    exports), and joining its short lines would run its paragraphs together."""
    chars = [(ch, source) for source, text in pieces for ch in text]
    head = LEGEND
    if instruction is not None:
        chars = chars[len(instruction):]
        head += INSTRUCTION.format(html.escape(instruction))
    elif reflow:
        chars = _reflowed(chars)
    runs: list[list] = []
    for ch, source in chars:
        if runs and runs[-1][0] == source:
            runs[-1][1].append(ch)
        else:
            runs.append([source, [ch]])
    body = "".join(f'<span class="{CLASSES.get(source, "ts-src-ai")}">{html.escape("".join(text))}</span>'
                   for source, text in runs)
    return f'{head}<div class="ts-whole">{body}</div>'


def _reflowed(chars: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The same characters with wrapped lines joined: each source stays on the characters it had."""
    text = "".join(ch for ch, _ in chars)
    out: list[tuple[str, str]] = []
    for n, p in enumerate(paragraphs(text)):
        if n:
            out += [("\n", out[-1][1]), ("\n", out[-1][1])]
        if p.scene_break:  # shown, not part of the text: the whole-text view is for reading
            out += [(ch, out[-1][1]) for ch in SCENE_BREAK]
            continue
        prose = len(p.lines) == 1
        after_break = False
        for ch, source in chars[p.start : p.end]:
            if ch == "\n" and prose:
                out.append((" ", source))
                after_break = True
            elif not (after_break and ch in " \t"):
                out.append((ch, source))
                after_break = False
    return out
