"""Library tab: books and their drafts. Open (into Write), rename, delete a book or one draft (after a
confirmation), continue, and export TXT/MD/EPUB/DOCX with a title and author."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from bookexport import export_book
from storage import Conflict, NotFound, StoreError
from storage.overview import DraftSummary
from storage.records import GenerationRecord
from tokenswift.settings import DraftSettings, SettingsError
from ui.display import views
from ui.drafts.drafts import DraftService
from ui.drafts.exports import Exports, draft_book
from ui.drafts.tokens import PromptTokens
from ui.forms.forms import PROMPT_FORMATS, TARGET_LABEL, FormError, labelled, settings_from
from ui.library.store_ops import LibraryStore
from ui.write import write_view
from ui.write.write_parts import WriteParts

Counter = Callable[[GenerationRecord], "int | None"]
FORMAT_LABELS = {"TXT": "txt", "Markdown": "md", "EPUB": "epub", "DOCX": "docx"}  # bookexport.FORMATS

DRAFT_HEADERS = ["#", "Kind", "Status", "Prompt", "Words", "Tokens", "Target", "Created", "Its own first words"]


@dataclass
class LibraryParts:
    book: gr.Dropdown
    refresh: gr.Button
    books: gr.Dataframe
    title: gr.Textbox
    author: gr.Textbox
    save: gr.Button
    delete: gr.Button
    confirm: gr.Row
    confirm_text: gr.Markdown
    confirm_yes: gr.Button
    confirm_no: gr.Button
    drafts: gr.Dataframe
    draft: gr.Dropdown
    open: gr.Button
    extend_by: gr.Number
    cont: gr.Button
    delete_draft: gr.Button
    draft_confirm: gr.Row
    draft_confirm_text: gr.Markdown
    draft_confirm_yes: gr.Button
    draft_confirm_no: gr.Button
    fmt: gr.Radio
    export: gr.Button
    file: gr.File
    status: gr.Markdown
    hint: gr.Markdown  # what to do when there is nothing to show

    @property
    def listing(self) -> list:
        return [self.book, self.books, self.title, self.author, self.drafts, self.draft, self.confirm,
                self.draft_confirm, self.hint]


def build() -> LibraryParts:
    status = gr.Markdown("", label="Library status", elem_id="library-status")
    with gr.Row():
        book = gr.Dropdown([], label="Book", elem_id="library-book", scale=4)
        refresh = gr.Button("Refresh", size="sm", elem_id="library-refresh", scale=1)
    hint = gr.Markdown("", label="Library hint", elem_id="library-hint")
    books = gr.Dataframe(headers=["#", "Title", "Author", "Drafts", "Updated"], value=[], interactive=False,
                         max_height=220, elem_id="library-books", label="Books")
    with gr.Row():
        title = gr.Textbox(label="Title", max_lines=1, elem_id="library-title")
        author = gr.Textbox(label="Author", max_lines=1, elem_id="library-author")
    with gr.Row():
        save = gr.Button("Save title & author", size="sm", elem_id="library-save")
        delete = gr.Button("Delete book…", variant="stop", size="sm", elem_id="library-delete")
    with gr.Row(visible=False, elem_id="library-confirm") as confirm:
        confirm_text = gr.Markdown("", label="Delete confirmation")
        confirm_yes = gr.Button("Yes, delete it", variant="stop", size="sm", elem_id="library-delete-yes")
        confirm_no = gr.Button("Cancel", size="sm", elem_id="library-delete-no")
    drafts = gr.Dataframe(headers=DRAFT_HEADERS, value=[],
                          interactive=False, max_height=260, elem_id="library-drafts", label="Drafts in this book")
    with gr.Row():
        draft = gr.Dropdown([], label="Draft", elem_id="library-draft", scale=3)
        open_ = gr.Button("Open in Write", variant="primary", size="sm", elem_id="library-open")
        extend_by = gr.Number(1000, label=TARGET_LABEL, precision=0, elem_id="library-extend")
        cont = gr.Button("Continue", size="sm", elem_id="library-continue")
        delete_draft = gr.Button("Delete draft…", variant="stop", size="sm", elem_id="library-delete-draft")
    with gr.Row(visible=False, elem_id="library-draft-confirm") as draft_confirm:
        draft_confirm_text = gr.Markdown("", label="Delete draft confirmation")
        draft_confirm_yes = gr.Button("Yes, delete the draft", variant="stop", size="sm",
                                      elem_id="library-delete-draft-yes")
        draft_confirm_no = gr.Button("Cancel", size="sm", elem_id="library-delete-draft-no")
    with gr.Row():
        fmt = gr.Radio(list(FORMAT_LABELS), value="EPUB", label="Export format", elem_id="library-format", scale=3)
        export = gr.Button("Export", variant="primary", elem_id="library-export", scale=1, min_width=120)
    file = gr.File(label="Exported file", interactive=False, elem_id="library-file")
    return LibraryParts(book, refresh, books, title, author, save, delete, confirm, confirm_text, confirm_yes,
                        confirm_no, drafts, draft, open_, extend_by, cont, delete_draft, draft_confirm,
                        draft_confirm_text, draft_confirm_yes, draft_confirm_no, fmt, export, file, status, hint)


NO_BOOKS = ("**No books yet.** Write an opening in the **Write** tab and press **Start**: every draft is saved "
            "here while it is written, and stays here when you close the browser.")
NOTHING_YET = "(nothing written yet)"
NO_DRAFTS = ("**This book has no drafts.** Start one in the **Write** tab (its title there names the book), or "
             "delete the empty book.")


def listing(p: LibraryParts, store: LibraryStore, book_id: int | None, count: Counter | None = None,
            draft_id: int | None = None, unasked: bool = False) -> dict:
    """Books, the chosen one (kept if it still exists, else the one last worked on), and its drafts (the chosen
    one kept if it is still there). count: the tokens of an edit's text that was never tokenized (None: not shown).
    unasked: a redraw the writer did not ask for, which leaves what they are in the middle of (the title and author
    being typed, a delete confirmation) while the chosen book is still shown."""
    sessions, counts = store.list_sessions(), store.draft_counts()
    ids = [s.id for s in sessions]
    still_there = book_id in ids
    if not still_there:
        book_id = store.last_worked_book() if ids else None
    rows = [[s.id, s.title, s.author, counts.get(s.id, 0), f"{s.updated_at:%Y-%m-%d %H:%M}"] for s in sessions]
    choices = [(f"#{s.id} · {s.title}", s.id) for s in sessions]
    out = {p.book: gr.Dropdown(choices=choices, value=book_id), p.books: rows, **hidden(p),
           **book_view(p, store, book_id, count, draft_id)}
    if unasked and still_there:
        for part in (p.title, p.author, p.confirm, p.draft_confirm):
            del out[part]
    return out


def hidden(p: LibraryParts) -> dict:
    """Both delete confirmations closed (what they asked about may have changed)."""
    return {p.confirm: gr.Row(visible=False), p.draft_confirm: gr.Row(visible=False)}


def _prompt_kind(settings_json: str) -> str:
    """How the draft began, as the Write tab names it: an opening continued, or an instruction followed."""
    form = DraftSettings.from_json(settings_json).settings.prompt_format
    return next(label for label, value in PROMPT_FORMATS.items() if value == form)


def kind_label(d: DraftSummary) -> str:
    """"continuation of #12": its kind, and the draft it came from while that one exists."""
    parent = d.record.parent_id
    return f"{d.kind} of #{parent}" if parent is not None and d.kind != "new" else d.kind


def _tokens(d: DraftSummary, count: Counter | None) -> int | str:
    if d.tokens is not None:
        return d.tokens
    counted = count(d.record) if count is not None else None
    return "–" if counted is None else counted


def _target(d: DraftSummary) -> int | str:
    """An edit that was saved finished writes nothing until continued: it has no target of its own."""
    return "–" if d.kind == "edit" and d.record.finish_reason == "edit" else d.record.target_tokens


def book_view(p: LibraryParts, store: LibraryStore, book_id: int | None, count: Counter | None = None,
              draft_id: int | None = None) -> dict:
    if book_id is None:
        return {p.title: "", p.author: "", p.drafts: [], p.draft: gr.Dropdown(choices=[], value=None),
                p.hint: NO_BOOKS}
    book = store.get_session(book_id)
    drafts = store.overview(book_id)
    rows = [[d.record.id, kind_label(d), d.record.status, _prompt_kind(d.record.settings_json), d.words,
             _tokens(d, count), _target(d), f"{d.record.created_at:%Y-%m-%d %H:%M}", d.own_words or NOTHING_YET]
            for d in drafts]
    choices = [(f"#{d.record.id} · {kind_label(d)} · {d.record.status} · {d.words:,} words", d.record.id)
               for d in drafts]
    ids = [d.record.id for d in drafts]
    chosen = draft_id if draft_id in ids else (ids[0] if ids else None)
    return {p.title: book.title, p.author: book.author, p.drafts: rows,
            p.draft: gr.Dropdown(choices=choices, value=chosen), p.hint: "" if drafts else NO_DRAFTS}


def token_counter(tokens: PromptTokens | None) -> Counter | None:
    """Counts an untokenized edit's text with its model's tokenizer, as the worker will (None where it cannot)."""
    if tokens is None:
        return None

    def count(record: GenerationRecord) -> int | None:
        model = record.model or (tokens.target() or (None,))[0]
        text = record.prompt_text  # an edit that never ran has written nothing: its text is its prompt
        return None if model is None else tokens.use(model, lambda tokenizer, _: len(tokenizer(text).input_ids))

    return count


def export_file(store: LibraryStore, exports: Exports, gen_id: int, fmt: str, title: str, author: str) -> Path:
    """Write the export into the app's exports folder (Gradio serves it from there as a download)."""
    gen = store.get_generation(gen_id)
    book = store.get_session(gen.session_id)
    data, _, filename = export_book(draft_book(gen, book, title.strip() or book.title, author.strip(),
                                               store.instruction(gen_id)), FORMAT_LABELS[fmt])
    return exports.write(filename, data)


class LibraryEvents:
    """The Library tab's handlers: each returns the components it redraws and says what happened in the status
    line. `wire` binds them to the page's events."""

    def __init__(self, p: LibraryParts, store: LibraryStore, w: WriteParts, tabs: gr.Tabs, exports: Exports,
                 count, drafts: DraftService) -> None:
        self.p, self.store, self.w, self.tabs, self.exports, self.count = p, store, w, tabs, exports, count
        self.drafts = drafts  # Continue goes through the drafts service, as the Write tab's and the API's do

    def show(self, book_id, draft_id=None):
        return listing(self.p, self.store, book_id, self.count, draft_id)

    def say(self, message: str, ok: bool = True) -> dict:
        (gr.Info if ok else gr.Warning)(views.plain(message))
        return {self.p.status: message if ok else f"{views.dot('bad')} {message}"}

    def refresh(self, book_id, draft_id):
        return self.show(book_id, draft_id)

    def draft_ended(self, book_id, draft_id):
        """A draft ended in the Write tab: its row changes. This redraw comes unasked, at any moment, so a title or
        author being typed here and an open delete confirmation stay."""
        return listing(self.p, self.store, book_id, self.count, draft_id, unasked=True)

    def opened(self, book_id, write_book):
        """The tab opened: on the book of the draft in the Write tab, else the one chosen here before."""
        return self.show(write_book if write_book is not None else book_id)

    def select_book(self, book_id):
        try:
            return {**book_view(self.p, self.store, book_id, self.count), **hidden(self.p)}
        except NotFound:
            return {**self.show(None), **self.say(f"Book #{book_id} no longer exists.", ok=False)}

    def rename(self, book_id, title, author):
        if book_id is None:
            return self.say("Rename: choose a book first.", ok=False)
        if not (title or "").strip():
            return self.say("Title: must not be empty.", ok=False)
        try:
            self.store.rename_session(book_id, title=title.strip(), author=(author or "").strip())
        except (NotFound, StoreError) as error:
            return self.say(f"Rename: {error}", ok=False)
        return {**self.show(book_id), **self.say(f"Saved “{title.strip()}”.")}

    def ask_delete(self, book_id):
        if book_id is None:
            return self.say("Delete: choose a book first.", ok=False)
        try:
            book, drafts = self.store.get_session(book_id), self.store.draft_counts().get(book_id, 0)
        except NotFound:
            return {**self.show(None), **self.say(f"Book #{book_id} no longer exists.", ok=False)}
        text = f"Delete **{book.title}** and its {drafts} draft{'s' if drafts != 1 else ''}? This cannot be undone."
        p = self.p
        return {p.confirm: gr.Row(visible=True), p.confirm_text: text, p.draft_confirm: gr.Row(visible=False)}

    def delete(self, book_id):
        try:
            title = self.store.get_session(book_id).title
            self.store.delete_session(book_id)
        except (NotFound, StoreError) as error:
            return {**self.show(None), **self.say(f"Delete: {error}", ok=False)}
        return {**self.show(None), **self.say(f"Deleted “{title}”.")}

    def cancel_delete(self):
        return {self.p.confirm: gr.Row(visible=False)}

    def ask_delete_draft(self, book_id, gen_id):
        if gen_id is None:
            return self.say("Delete draft: choose a draft first.", ok=False)
        try:
            gen = self.store.get_generation(gen_id, with_text=False)
        except NotFound:
            return {**self.show(book_id), **self.say(f"Draft #{gen_id} no longer exists.", ok=False)}
        if gen.status in ("queued", "running"):  # the store refuses too; say so before asking
            return self.say(f"Delete draft: #{gen_id} is {gen.status}; stop it first (open it in Write, press Stop).",
                       ok=False)
        own = next((d.own_words for d in self.store.overview(gen.session_id) if d.record.id == gen.id), "")
        text = (f"Delete draft **#{gen.id}** ({gen.status}, {gen.produced_tokens:,} tokens written"
                f"{f', “{own}”' if own else ''})? Drafts continued from it keep their text. This cannot be undone.")
        p = self.p
        return {p.draft_confirm: gr.Row(visible=True), p.draft_confirm_text: text, p.confirm: gr.Row(visible=False)}

    def delete_draft(self, book_id, gen_id):
        if gen_id is None:
            return self.say("Delete draft: choose a draft first.", ok=False)
        try:
            self.store.delete_generation(gen_id)
            left = self.store.draft_counts().get(book_id, 0)
        except (Conflict, NotFound, StoreError) as error:
            return {**self.show(book_id), **self.say(f"Delete draft: {error}", ok=False)}
        out = {**self.show(book_id), **self.say(f"Deleted draft #{gen_id}.")}
        if left == 0:  # offer to delete the empty book, rather than leave an "Untitled" behind
            title = self.store.get_session(book_id).title
            out.update({self.p.confirm: gr.Row(visible=True),
                        self.p.confirm_text: f"**{title}** has no drafts left. Delete the empty book too?"})
        return out

    def cancel_delete_draft(self):
        return {self.p.draft_confirm: gr.Row(visible=False)}

    def open_draft(self, gen_id):
        if gen_id is None:
            return self.say("Open: choose a draft first.", ok=False)
        try:
            return {**write_view.show_generation(self.w, self.store, gen_id), self.tabs: gr.Tabs(selected="write")}
        except NotFound as error:
            return self.say(f"Open: {error}", ok=False)

    def continue_draft(self, gen_id, extend_by):
        if gen_id is None:
            return self.say("Continue: choose a draft first.", ok=False)
        try:
            parent = self.store.get_generation(gen_id, with_text=False)
            values = json.loads(parent.settings_json)  # the parent's settings, longer
            values["max_new_tokens"] = int(extend_by) if extend_by is not None else 0
            child = self.drafts.continue_from(gen_id, settings_from(values))
        except FormError as error:
            return self.say(str(error), ok=False)
        except SettingsError as error:
            return self.say(labelled(error), ok=False)
        except (Conflict, NotFound, StoreError) as error:
            return self.say(f"Continue: {error}", ok=False)
        return {**write_view.show_generation(self.w, self.store, child.id, fill_form=False),
                self.tabs: gr.Tabs(selected="write")}

    def export(self, gen_id, fmt, title, author):
        if gen_id is None:
            return self.say("Export: choose a draft first.", ok=False)
        if fmt not in FORMAT_LABELS:
            return self.say(f"Export: choose one of {', '.join(FORMAT_LABELS)}.", ok=False)
        try:
            path = export_file(self.store, self.exports, gen_id, fmt, title or "", author or "")
        except (NotFound, StoreError, OSError) as error:
            return self.say(f"Export: {error}", ok=False)
        return {self.p.file: str(path), **self.say(f"Exported {path.name}; download it below.")}


def wire(p: LibraryParts, store: LibraryStore, w: WriteParts, tabs: gr.Tabs, tab: gr.Tab, exports: Exports,
         tokens: PromptTokens | None = None) -> None:
    """tokens: the app's tokenizers, to count an edit's text that no worker has tokenized yet."""
    # The events that redraw the book's lists run one at a time, in the order the page sent them: a redraw for a draft
    # that ended, answered after the writer chose another book, would show the old book's lists beside the new one's
    # title and author (which that redraw leaves as typed), and Save would rename the old book with them. Each is a
    # few store reads; the others (an export builds a whole book) need no order.
    in_order = {"concurrency_limit": 1, "concurrency_id": "library"}
    free = {"concurrency_limit": None}
    count = token_counter(tokens)
    on = LibraryEvents(p, store, w, tabs, exports, count, DraftService(store, tokens or PromptTokens(store)))
    tab.select(on.opened, [p.book, w.book], [*p.listing, p.status], api_name="library_refresh", **in_order)
    p.refresh.click(on.refresh, [p.book, p.draft], [*p.listing, p.status], api_name="library_reload", **in_order)
    # A draft that ends (watched in the Write tab) changes its row: the list shows it without a click on Refresh, and
    # the title and author being typed stay.
    w.ended.change(on.draft_ended, [p.book, p.draft], [*p.listing, p.status], api_name="library_draft_ended",
                   **in_order)
    p.book.input(on.select_book, p.book, [*p.listing, p.status], api_name="library_select_book", **in_order)
    p.save.click(on.rename, [p.book, p.title, p.author], [*p.listing, p.status], api_name="library_rename", **in_order)
    p.delete.click(on.ask_delete, p.book, [*p.listing, p.confirm_text, p.status], api_name="library_ask_delete",
                   **in_order)
    p.confirm_yes.click(on.delete, p.book, [*p.listing, p.status], api_name="library_delete", **in_order)
    p.confirm_no.click(on.cancel_delete, None, p.confirm, api_name="library_cancel_delete", **free)
    p.draft.input(on.cancel_delete_draft, None, p.draft_confirm, api_name="library_select_draft", **free)
    p.delete_draft.click(on.ask_delete_draft, [p.book, p.draft], [*p.listing, p.draft_confirm_text, p.status],
                         api_name="library_ask_delete_draft", **in_order)
    p.draft_confirm_yes.click(on.delete_draft, [p.book, p.draft], [*p.listing, p.confirm_text, p.status],
                              api_name="library_delete_draft", **in_order)
    p.draft_confirm_no.click(on.cancel_delete_draft, None, p.draft_confirm, api_name="library_cancel_delete_draft",
                             **free)
    p.open.click(on.open_draft, p.draft, [*w.opened, tabs, p.status], api_name="library_open", **free)
    p.cont.click(on.continue_draft, [p.draft, p.extend_by], [*w.opened, tabs, p.status],
                 api_name="library_continue", **free)
    p.export.click(on.export, [p.draft, p.fmt, p.title, p.author], [p.file, p.status], api_name="library_export",
                   **free)
