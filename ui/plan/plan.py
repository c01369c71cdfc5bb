"""Plan tab: a book's premise, characters and chapters (storage/plans.py); "Write chapter N" drafts a chapter as its
own draft (what the model sees: ui/drafts/plan_drafts.py), "Open in Write" shows it there (to read, Continue or edit
it), and the book exports by chapters. Components: ui/plan/plan_parts.py."""

from __future__ import annotations

import gradio as gr

from bookexport import export_book
from storage import Conflict, NotFound, StoreError
from storage.plans import Character
from tokenswift.settings import WRITING_DEFAULTS, SettingsError
from ui.display import views
from ui.drafts.drafts import DraftService
from ui.drafts.exports import Exports
from ui.drafts.plan_drafts import plan_book, state, words, write_chapter
from ui.drafts.plan_input import MAX_PREMISE, MAX_TITLE, PlanProblem, check_chapter, check_characters, check_text
from ui.drafts.tokens import PromptTokens
from ui.forms.forms import FormError, labelled, settings_from
from ui.plan.plan_parts import CHAPTER_HEADERS, CHARACTER_HEADERS, FORMATS, PlanParts, table
from ui.plan.store_ops import PlanStore
from ui.write import write_view
from ui.write.write_parts import WriteParts

Failure = (Conflict, NotFound, StoreError, PlanProblem, FormError, SettingsError)
NO_BOOK = "**No book chosen.** Give a new book a title and press **New book**, or choose one of the Library's."


def view(p: PlanParts, store: PlanStore, book_id: int | None, chapter_id: int | None = None) -> dict:
    """The plan of `book_id` (the one last worked on if it is gone), with `chapter_id` chosen if it is still there."""
    books = store.list_sessions()
    if book_id not in [b.id for b in books]:
        book_id = store.last_worked_book() if books else None
    choices = [(f"#{b.id} {b.title}", b.id) for b in books]
    if book_id is None:
        return {p.book: gr.Dropdown(choices, value=None), p.premise: "", p.characters: character_table(()),
                p.chapters: chapter_table(()),
                p.chapter: gr.Dropdown([], value=None), p.title: "", p.beats: "", p.write: "Write chapter",
                p.timer: gr.Timer(active=False), p.drawn: None, p.status: NO_BOOK}
    plan = store.plan(book_id)
    chosen = next((c for c in plan.chapters if c.id == chapter_id), None)
    return {p.book: gr.Dropdown(choices, value=book_id), p.premise: plan.premise,
            p.characters: character_table(plan.characters), p.chapters: chapter_table(plan.chapters),
            p.chapter: gr.Dropdown([(f"{c.position}. {c.title}", c.id) for c in plan.chapters],
                                   value=chosen.id if chosen else None),
            p.title: chosen.title if chosen else "", p.beats: "\n".join(chosen.beats) if chosen else "",
            p.write: f"Write chapter {chosen.position}" if chosen else "Write chapter",
            p.timer: gr.Timer(active=any(state(c) == "writing" for c in plan.chapters)), p.drawn: book_id}


def chapter_table(chapters) -> str:
    return table(CHAPTER_HEADERS, [[c.position, c.title, " · ".join(c.beats), state(c), words(c),
                                    f"#{c.draft_id}" if c.draft_id else "–"] for c in chapters])


def character_table(characters) -> str:
    return table(CHARACTER_HEADERS, [[c.name, c.description, ", ".join(c.keys)] for c in characters])


class PlanEvents:
    """The Plan tab's handlers: each returns the components it redraws (a dict) and says what happened in the status
    line. `wire` binds them to the page's events."""

    def __init__(self, p: PlanParts, store: PlanStore, w: WriteParts, tabs: gr.Tabs, exports: Exports,
                 tokens: PromptTokens):
        self.p, self.store, self.w, self.tabs, self.exports = p, store, w, tabs, exports
        self.drafts = DraftService(store, tokens)  # a chapter's draft starts there, as the API's does

    def say(self, message: str, ok: bool = True) -> dict:
        (gr.Info if ok else gr.Warning)(views.plain(message))
        return {self.p.status: message if ok else f"{views.dot('bad')} {message}"}

    def failed(self, book_id, chapter_id, error: Exception) -> dict:
        try:
            shown_now = view(self.p, self.store, book_id, chapter_id)
        except (NotFound, StoreError):
            shown_now = view(self.p, self.store, None)
        message = labelled(error) if isinstance(error, SettingsError) else str(error)
        return {**shown_now, **self.say(message, ok=False)}

    def attempt(self, book_id, chapter_id, work) -> dict:
        """work() -> (chapter to choose, message); the plan redrawn either way."""
        if book_id is None:
            return {**view(self.p, self.store, None), **self.say("Choose or make a book first.", ok=False)}
        try:
            chosen_id, message = work()
        except Failure as error:
            return self.failed(book_id, chapter_id, error)
        return {**view(self.p, self.store, book_id, chosen_id), **self.say(message)}

    def opened(self, book_id, write_book, drawn) -> dict:
        """The page's book, else the Write tab's; but a book drawn since the page sent this (New book pressed as the
        tab opened: its event can reach the plan's queue first) stays."""
        for choice in (drawn, book_id, write_book):
            if choice is not None:
                return view(self.p, self.store, choice)
        return view(self.p, self.store, None)

    def select_book(self, book_id) -> dict:
        return view(self.p, self.store, book_id)

    def select_chapter(self, book_id, chapter_id) -> dict:
        return view(self.p, self.store, book_id, chapter_id)

    def new_book(self, title) -> dict:
        try:
            book = self.store.create_session(check_text("Title", title or "", MAX_TITLE, required=True))
        except Failure as error:
            return self.say(f"New book: {error}", ok=False)
        return {**view(self.p, self.store, book.id), self.p.new_title: "",
                **self.say(f"Made “{book.title}”: give it a premise, characters and chapters.")}

    def save_premise(self, book_id, premise) -> dict:
        """Saved as the writer leaves the box: only the status changes, so nothing typed elsewhere is redrawn."""
        if book_id is None:
            return self.say("Premise: choose or make a book first.", ok=False)
        try:
            self.store.set_premise(book_id, check_text("Premise", premise or "", MAX_PREMISE))
        except Failure as error:
            return self.say(str(error), ok=False)
        return self.say("Premise saved.")

    def characters(self, book_id, change) -> dict:
        """change(the book's characters) -> (the new list, message); the list and the status redrawn."""
        if book_id is None:
            return self.say("Characters: choose or make a book first.", ok=False)
        p, store = self.p, self.store
        try:
            kept, message = change(store.plan(book_id).characters)
            store.set_characters(book_id, check_characters(kept))
            rows = character_table(store.plan(book_id).characters)
        except Failure as error:
            return self.say(str(error), ok=False)
        return {p.characters: rows, p.name: "", p.description: "", p.keys: "", **self.say(message)}

    def save_character(self, book_id, name, description, keys) -> dict:
        name = (name or "").strip()
        new = Character(name, description or "", tuple((keys or "").split(",")))
        return self.characters(book_id, lambda old: ([*[c for c in old if c.name != name], new], f"Saved {name}."))

    def remove_character(self, book_id, name) -> dict:
        name = (name or "").strip()

        def change(old):
            if name not in [c.name for c in old]:
                raise PlanProblem("Name", f"no character named “{name}” to remove")
            return [c for c in old if c.name != name], f"Removed {name}."
        return self.characters(book_id, change)

    def add(self, book_id, title, beats) -> dict:
        def work():
            title_, beats_ = check_chapter(title or "", (beats or "").split("\n"))
            chapter = self.store.add_chapter(book_id, title_, beats_)
            return chapter.id, f"Added chapter {chapter.position}, “{chapter.title}”."
        return self.attempt(book_id, None, work)

    def save(self, book_id, chapter_id, title, beats) -> dict:
        def work():
            edits = check_chapter(title or "", (beats or "").split("\n"))
            chapter = self.store.edit_chapter(chosen(chapter_id), *edits)
            return chapter.id, f"Saved chapter {chapter.position}."
        return self.attempt(book_id, chapter_id, work)

    def move(self, by: int):
        def moved(book_id, chapter_id) -> dict:
            def work():
                _, chapter = self.store.chapter(chosen(chapter_id))
                chapter = self.store.move_chapter(chapter.id, max(1, chapter.position + by))
                return chapter.id, f"“{chapter.title}” is chapter {chapter.position} now."
            return self.attempt(book_id, chapter_id, work)
        return moved

    def remove(self, book_id, chapter_id) -> dict:
        def work():
            _, chapter = self.store.chapter(chosen(chapter_id))
            self.store.delete_chapter(chapter.id)
            kept = f" (its draft #{chapter.draft_id} stays in the Library)" if chapter.draft_id else ""
            return None, f"Removed chapter “{chapter.title}”{kept}."
        return self.attempt(book_id, chapter_id, work)

    def write(self, book_id, chapter_id, premise, target) -> dict:
        def work():
            self.store.set_premise(book_id, check_text("Premise", premise or "", MAX_PREMISE))
            settings = settings_from({**WRITING_DEFAULTS, "max_new_tokens": int(target or 0)})
            gen = write_chapter(self.drafts, chosen(chapter_id), settings)
            _, chapter = self.store.chapter(chapter_id)
            return chapter_id, (f"Writing chapter {chapter.position}, “{chapter.title}”, as draft #{gen.id}: "
                                "**Open in Write** to watch it.")
        return self.attempt(book_id, chapter_id, work)

    def open_chapter(self, book_id, chapter_id) -> dict:
        try:
            _, chapter = self.store.chapter(chosen(chapter_id))
            if chapter.draft_id is None:
                raise PlanProblem("Open", f"chapter {chapter.position} is not written yet: press Write chapter")
            return {**write_view.show_generation(self.w, self.store, chapter.draft_id),
                    self.tabs: gr.Tabs(selected="write")}
        except Failure as error:
            return self.failed(book_id, chapter_id, error)

    def export(self, book_id, fmt) -> dict:
        try:
            plan = self.store.plan(book_id) if book_id is not None else None
            if plan is None or not any(c.draft_id for c in plan.chapters):
                raise PlanProblem("Export", "no chapter is written yet")
            data, _, filename = export_book(plan_book(plan, plan.book.title, plan.book.author), FORMATS[fmt])
            path = self.exports.write(filename, data)
        except (*Failure, OSError, KeyError) as error:
            return self.say(f"Export: {error}", ok=False)
        return {self.p.file: str(path), **self.say(f"Exported {path.name}; download it below.")}

    def tick(self, book_id) -> dict:
        """While a chapter is written: its state and words (the chapter form, which the writer may be typing in,
        stays as it is)."""
        try:
            plan = self.store.plan(book_id)
        except (NotFound, StoreError):
            return {self.p.timer: gr.Timer(active=False)}
        return {self.p.chapters: chapter_table(plan.chapters),
                self.p.timer: gr.Timer(active=any(state(c) == "writing" for c in plan.chapters))}


def wire(p: PlanParts, store: PlanStore, w: WriteParts, tabs: gr.Tabs, tab: gr.Tab, exports: Exports,
         tokens: PromptTokens) -> None:
    # One plan event at a time, in the order the page sent them: two redraws of the book list racing (the tab's
    # opening and "New book" pressed at once) could leave the server holding the older choices, which then
    # refuses the new book's id as "not in the list of choices" on the next event. Each is a few store reads.
    fast = {"concurrency_limit": 1, "concurrency_id": "plan"}
    shown = [*p.shown, p.status]
    on = PlanEvents(p, store, w, tabs, exports, tokens)
    character_outputs = [p.characters, p.name, p.description, p.keys, p.status]
    chapter = [p.book, p.chapter]
    tab.select(on.opened, [p.book, w.book, p.drawn], shown, api_name="plan_open", **fast)
    p.book.input(on.select_book, p.book, shown, api_name="plan_select_book", **fast)
    p.new_book.click(on.new_book, p.new_title, [*shown, p.new_title], api_name="plan_new_book", **fast)
    p.premise.blur(on.save_premise, [p.book, p.premise], p.status, api_name="plan_save_premise", **fast)
    p.save_character.click(on.save_character, [p.book, p.name, p.description, p.keys], character_outputs,
                           api_name="plan_save_character", **fast)
    p.remove_character.click(on.remove_character, [p.book, p.name], character_outputs,
                             api_name="plan_remove_character", **fast)
    p.chapter.input(on.select_chapter, chapter, shown, api_name="plan_select_chapter", **fast)
    p.add.click(on.add, [p.book, p.title, p.beats], shown, api_name="plan_add_chapter", **fast)
    p.save.click(on.save, [*chapter, p.title, p.beats], shown, api_name="plan_save_chapter", **fast)
    p.up.click(on.move(-1), chapter, shown, api_name="plan_move_up", **fast)
    p.down.click(on.move(+1), chapter, shown, api_name="plan_move_down", **fast)
    p.remove.click(on.remove, chapter, shown, api_name="plan_remove_chapter", **fast)
    p.write.click(on.write, [*chapter, p.premise, p.target], shown, api_name="plan_write_chapter", **fast)
    p.open.click(on.open_chapter, chapter, [*w.opened, tabs, *shown], api_name="plan_open_chapter", **fast)
    p.export.click(on.export, [p.book, p.fmt], [p.file, p.status], api_name="plan_export", **fast)
    p.timer.tick(on.tick, p.book, [p.chapters, p.timer], api_name="plan_tick", show_progress="hidden", **fast)


def chosen(chapter_id: int | None) -> int:
    if chapter_id is None:
        raise PlanProblem("Chapter", "choose a chapter first")
    return chapter_id
