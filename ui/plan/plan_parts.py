"""The Plan tab's components (ui/plan/plan.py wires them): a book's premise, its characters and its chapters, each
chapter written as its own draft, and the book exported by chapters."""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from ui.forms.forms import TARGET_LABEL

CHAPTER_HEADERS = ["#", "Title", "Beats", "State", "Words", "Draft"]
CHARACTER_HEADERS = ["Name", "Description", "Key words"]
FORMATS = {"EPUB": "epub", "DOCX": "docx", "Markdown": "md", "TXT": "txt"}  # bookexport.FORMATS
TICK_S = 3.0  # the chapter list's refresh while a chapter is being written


@dataclass
class PlanParts:
    status: gr.Markdown
    book: gr.Dropdown
    new_title: gr.Textbox
    new_book: gr.Button
    premise: gr.Textbox
    characters: gr.HTML
    name: gr.Textbox
    description: gr.Textbox
    keys: gr.Textbox
    save_character: gr.Button
    remove_character: gr.Button
    chapters: gr.HTML
    chapter: gr.Dropdown
    title: gr.Textbox
    beats: gr.Textbox
    add: gr.Button
    save: gr.Button
    up: gr.Button
    down: gr.Button
    remove: gr.Button
    target: gr.Number
    write: gr.Button
    open: gr.Button
    fmt: gr.Radio
    export: gr.Button
    file: gr.File
    timer: gr.Timer
    # The book the server last drew, kept server-side (a State is read when its event runs, not when it is sent): the
    # tab's opening, sent before "New book" but run after it, shows the new book rather than the page's stale one.
    drawn: gr.State

    @property
    def shown(self) -> list:
        """What a change of book (or of its plan) redraws."""
        return [self.book, self.premise, self.characters, self.chapters, self.chapter, self.title, self.beats,
                self.write, self.timer, self.drawn]


def build() -> PlanParts:
    status = gr.Markdown("", label="Plan status", elem_id="plan-status")
    with gr.Row():
        book = gr.Dropdown([], label="Book", elem_id="plan-book", scale=3,
                           info="The book whose plan this is; its chapters are drafts in it (see the Library).")
        new_title = gr.Textbox(label="New book's title", max_lines=1, elem_id="plan-new-title", scale=2)
        new_book = gr.Button("New book", size="sm", elem_id="plan-new", scale=1)
    premise = gr.Textbox(label="Premise", lines=3, elem_id="plan-premise",
                         info="What the book is about. Every chapter's draft keeps it in view (its Memory).")
    with gr.Accordion("Characters", open=True):
        characters = gr.HTML(table(CHARACTER_HEADERS, []), elem_id="plan-characters", label="Characters")
        with gr.Row():
            name = gr.Textbox(label="Name", max_lines=1, elem_id="plan-char-name", scale=1)
            description = gr.Textbox(label="Description", max_lines=2, elem_id="plan-char-description", scale=3)
            keys = gr.Textbox(label="Key words", max_lines=1, elem_id="plan-char-keys", scale=1,
                              info="Besides the name, comma-separated: “the keeper, her”.")
        with gr.Row():
            save_character = gr.Button("Add or update character", size="sm", elem_id="plan-char-save")
            remove_character = gr.Button("Remove character", size="sm", elem_id="plan-char-remove")
        gr.Markdown("Each character is World Info in every chapter's draft: the model sees the description while "
                    "the story names the character, and from the first word when the chapter's title or beats do.")
    chapters = gr.HTML(table(CHAPTER_HEADERS, []), elem_id="plan-chapters", label="Chapters")
    chapter = gr.Dropdown([], label="Chapter", elem_id="plan-chapter",
                          info="Choose a chapter to change, move, write or open; or fill in a new one and Add it.")
    with gr.Row():
        title = gr.Textbox(label="Chapter title", max_lines=1, elem_id="plan-chapter-title", scale=1)
        beats = gr.Textbox(label="Beats", lines=3, elem_id="plan-chapter-beats", scale=3,
                           info="What happens in it, one beat a line.")
    with gr.Row():
        add = gr.Button("Add chapter", size="sm", elem_id="plan-add")
        save = gr.Button("Save chapter", size="sm", elem_id="plan-save")
        up = gr.Button("Move up", size="sm", elem_id="plan-up")
        down = gr.Button("Move down", size="sm", elem_id="plan-down")
        remove = gr.Button("Remove chapter", size="sm", variant="stop", elem_id="plan-remove")
    with gr.Row():
        target = gr.Number(1000, label=TARGET_LABEL, precision=0, elem_id="plan-target")
        write = gr.Button("Write chapter", variant="primary", elem_id="plan-write")
        open_ = gr.Button("Open in Write", elem_id="plan-open")
    gr.Markdown("**Write chapter** drafts the chosen chapter: the model gets the premise, the chapter's beats, the "
                "previous chapter's last ~300 words and the characters. Writing it again makes a new draft (the old "
                "one stays in the Library). **Open in Write** to read it live, Continue it, or edit it: the chapter "
                "then follows your edit.")
    with gr.Row():
        fmt = gr.Radio(list(FORMATS), value="EPUB", label="Export the book by chapters", elem_id="plan-format",
                       scale=3)
        export = gr.Button("Export book", variant="primary", elem_id="plan-export", scale=1, min_width=120)
    file = gr.File(label="Exported book", interactive=False, elem_id="plan-file")
    return PlanParts(status, book, new_title, new_book, premise, characters, name, description, keys, save_character,
                     remove_character, chapters, chapter, title, beats, add, save, up, down, remove, target, write,
                     open_, fmt, export, file, gr.Timer(TICK_S, active=False), gr.State(None))


def table(headers: list[str], rows: list[list]) -> str:
    """A plain HTML table: a list the writer reads, never edits (a Dataframe redrawn by a timer showed cells of its
    earlier values beside new ones)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    empty = f'<tr><td colspan="{len(headers)}">none yet</td></tr>' if not rows else ""
    return f'<table class="ts-plan-table"><thead><tr>{head}</tr></thead><tbody>{body}{empty}</tbody></table>'
