"""Plan tab: a book's premise, characters and chapters (storage/plans.py); "Write chapter N" drafts a chapter as its
own draft (what the model sees: ui/plan_drafts.py), "Open in Write" shows it there (to read, Continue or edit it),
and the book exports by chapters. Components: ui/plan_parts.py."""

from __future__ import annotations

import gradio as gr

from bookexport import export_book
from storage import Conflict, NotFound, Store, StoreError
from storage.plans import Character
from tokenswift.settings import WRITING_DEFAULTS
from ui import views, write_view
from ui.exports import Exports
from ui.forms import FormError, settings_from
from ui.plan_api import state
from ui.plan_drafts import plan_book, words, write_chapter
from ui.plan_input import MAX_PREMISE, MAX_TITLE, PlanProblem, check_chapter, check_characters, check_text
from ui.plan_parts import CHAPTER_HEADERS, CHARACTER_HEADERS, FORMATS, PlanParts, table
from ui.tokens import PromptTokens
from ui.write_parts import WriteParts

Failure = (Conflict, NotFound, StoreError, PlanProblem, FormError)
NO_BOOK = "**No book chosen.** Give a new book a title and press **New book**, or choose one of the Library's."


def view(p: PlanParts, store: Store, book_id: int | None, chapter_id: int | None = None) -> dict:
    """The plan of `book_id` (the one last worked on if it is gone), with `chapter_id` chosen if it is still there."""
    books = store.list_sessions()
    if book_id not in [b.id for b in books]:
        book_id = store.last_worked_book() if books else None
    choices = [(f"#{b.id} {b.title}", b.id) for b in books]
    if book_id is None:
        return {p.book: gr.Dropdown(choices, value=None), p.premise: "", p.characters: character_table(()),
                p.chapters: chapter_table(()),
                p.chapter: gr.Dropdown([], value=None), p.title: "", p.beats: "", p.write: "Write chapter",
                p.timer: gr.Timer(active=False), p.status: NO_BOOK}
    plan = store.plan(book_id)
    chosen = next((c for c in plan.chapters if c.id == chapter_id), None)
    return {p.book: gr.Dropdown(choices, value=book_id), p.premise: plan.premise,
            p.characters: character_table(plan.characters), p.chapters: chapter_table(plan.chapters),
            p.chapter: gr.Dropdown([(f"{c.position}. {c.title}", c.id) for c in plan.chapters],
                                   value=chosen.id if chosen else None),
            p.title: chosen.title if chosen else "", p.beats: "\n".join(chosen.beats) if chosen else "",
            p.write: f"Write chapter {chosen.position}" if chosen else "Write chapter",
            p.timer: gr.Timer(active=any(state(c) == "writing" for c in plan.chapters))}


def chapter_table(chapters) -> str:
    return table(CHAPTER_HEADERS, [[c.position, c.title, " · ".join(c.beats), state(c), words(c),
                                    f"#{c.draft_id}" if c.draft_id else "–"] for c in chapters])


def character_table(characters) -> str:
    return table(CHARACTER_HEADERS, [[c.name, c.description, ", ".join(c.keys)] for c in characters])


def wire(p: PlanParts, store: Store, w: WriteParts, tabs: gr.Tabs, tab: gr.Tab, exports: Exports,
         tokens: PromptTokens) -> None:
    fast = {"concurrency_limit": None}
    shown = [*p.shown, p.status]

    def say(message: str, ok: bool = True) -> dict:
        (gr.Info if ok else gr.Warning)(views.plain(message))
        return {p.status: message if ok else f"{views.dot('bad')} {message}"}

    def done(book_id, chapter_id, message: str) -> dict:
        return {**view(p, store, book_id, chapter_id), **say(message)}

    def failed(book_id, chapter_id, error: Exception) -> dict:
        try:
            shown_now = view(p, store, book_id, chapter_id)
        except (NotFound, StoreError):
            shown_now = view(p, store, None)
        return {**shown_now, **say(str(error), ok=False)}

    def attempt(book_id, chapter_id, work):
        """work() -> (chapter to choose, message); the plan redrawn either way."""
        if book_id is None:
            return {**view(p, store, None), **say("Choose or make a book first.", ok=False)}
        try:
            chosen, message = work()
        except Failure as error:
            return failed(book_id, chapter_id, error)
        return done(book_id, chosen, message)

    def opened(book_id, write_book):
        return view(p, store, book_id if book_id is not None else write_book)

    def new_book(title):
        try:
            book = store.create_session(check_text("Title", title or "", MAX_TITLE, required=True))
        except Failure as error:
            return say(f"New book: {error}", ok=False)
        return {**view(p, store, book.id), p.new_title: "", **say(f"Made “{book.title}”: give it a premise, "
                                                                   "characters and chapters.")}

    def save_premise(book_id, premise):
        """Saved as the writer leaves the box: only the status changes, so nothing typed elsewhere is redrawn."""
        if book_id is None:
            return say("Premise: choose or make a book first.", ok=False)
        try:
            store.set_premise(book_id, check_text("Premise", premise or "", MAX_PREMISE))
        except Failure as error:
            return say(str(error), ok=False)
        return say("Premise saved.")

    def characters(book_id, change) -> dict:
        """change(the book's characters) -> (the new list, message); the list and the status redrawn."""
        if book_id is None:
            return say("Characters: choose or make a book first.", ok=False)
        try:
            kept, message = change(store.plan(book_id).characters)
            store.set_characters(book_id, check_characters(kept))
            rows = character_table(store.plan(book_id).characters)
        except Failure as error:
            return say(str(error), ok=False)
        return {p.characters: rows, p.name: "", p.description: "", p.keys: "", **say(message)}

    def save_character(book_id, name, description, keys):
        name = (name or "").strip()
        new = Character(name, description or "", tuple((keys or "").split(",")))
        return characters(book_id, lambda old: ([*[c for c in old if c.name != name], new], f"Saved {name}."))

    def remove_character(book_id, name):
        name = (name or "").strip()

        def change(old):
            if name not in [c.name for c in old]:
                raise PlanProblem("Name", f"no character named “{name}” to remove")
            return [c for c in old if c.name != name], f"Removed {name}."
        return characters(book_id, change)

    def add(book_id, title, beats):
        def work():
            title_, beats_ = check_chapter(title or "", (beats or "").split("\n"))
            chapter = store.add_chapter(book_id, title_, beats_)
            return chapter.id, f"Added chapter {chapter.position}, “{chapter.title}”."
        return attempt(book_id, None, work)

    def save(book_id, chapter_id, title, beats):
        def work():
            chapter = store.edit_chapter(chosen(chapter_id), *check_chapter(title or "", (beats or "").split("\n")))
            return chapter.id, f"Saved chapter {chapter.position}."
        return attempt(book_id, chapter_id, work)

    def move(by: int):
        def moved(book_id, chapter_id):
            def work():
                _, chapter = store.chapter(chosen(chapter_id))
                chapter = store.move_chapter(chapter.id, max(1, chapter.position + by))
                return chapter.id, f"“{chapter.title}” is chapter {chapter.position} now."
            return attempt(book_id, chapter_id, work)
        return moved

    def remove(book_id, chapter_id):
        def work():
            _, chapter = store.chapter(chosen(chapter_id))
            store.delete_chapter(chapter.id)
            kept = f" (its draft #{chapter.draft_id} stays in the Library)" if chapter.draft_id else ""
            return None, f"Removed chapter “{chapter.title}”{kept}."
        return attempt(book_id, chapter_id, work)

    def write(book_id, chapter_id, premise, target):
        def work():
            store.set_premise(book_id, check_text("Premise", premise or "", MAX_PREMISE))
            settings = settings_from({**WRITING_DEFAULTS, "max_new_tokens": int(target or 0)})
            gen = write_chapter(store, tokens, chosen(chapter_id), settings)
            _, chapter = store.chapter(chapter_id)
            return chapter_id, (f"Writing chapter {chapter.position}, “{chapter.title}”, as draft #{gen.id}: "
                                "**Open in Write** to watch it.")
        return attempt(book_id, chapter_id, work)

    def open_chapter(book_id, chapter_id):
        try:
            _, chapter = store.chapter(chosen(chapter_id))
            if chapter.draft_id is None:
                raise PlanProblem("Open", f"chapter {chapter.position} is not written yet: press Write chapter")
            return {**write_view.show_generation(w, store, chapter.draft_id), tabs: gr.Tabs(selected="write")}
        except Failure as error:
            return failed(book_id, chapter_id, error)

    def export(book_id, fmt):
        try:
            plan = store.plan(book_id) if book_id is not None else None
            if plan is None or not any(c.draft_id for c in plan.chapters):
                raise PlanProblem("Export", "no chapter is written yet")
            data, _, filename = export_book(plan_book(plan, plan.book.title, plan.book.author), FORMATS[fmt])
            path = exports.write(filename, data)
        except (*Failure, OSError, KeyError) as error:
            return say(f"Export: {error}", ok=False)
        return {p.file: str(path), **say(f"Exported {path.name}; download it below.")}

    def tick(book_id):
        """While a chapter is written: its state and words (the chapter form, which the writer may be typing in,
        stays as it is)."""
        try:
            plan = store.plan(book_id)
        except (NotFound, StoreError):
            return {p.timer: gr.Timer(active=False)}
        return {p.chapters: chapter_table(plan.chapters),
                p.timer: gr.Timer(active=any(state(c) == "writing" for c in plan.chapters))}

    tab.select(opened, [p.book, w.book], shown, api_name="plan_open", **fast)
    p.book.input(lambda book_id: view(p, store, book_id), p.book, shown, api_name="plan_select_book", **fast)
    p.new_book.click(new_book, p.new_title, [*shown, p.new_title], api_name="plan_new_book", **fast)
    p.premise.blur(save_premise, [p.book, p.premise], p.status, api_name="plan_save_premise", **fast)
    character_outputs = [p.characters, p.name, p.description, p.keys, p.status]
    p.save_character.click(save_character, [p.book, p.name, p.description, p.keys], character_outputs,
                           api_name="plan_save_character", **fast)
    p.remove_character.click(remove_character, [p.book, p.name], character_outputs, api_name="plan_remove_character",
                             **fast)
    p.chapter.input(lambda book_id, chapter_id: view(p, store, book_id, chapter_id), [p.book, p.chapter], shown,
                    api_name="plan_select_chapter", **fast)
    p.add.click(add, [p.book, p.title, p.beats], shown, api_name="plan_add_chapter", **fast)
    p.save.click(save, [p.book, p.chapter, p.title, p.beats], shown, api_name="plan_save_chapter", **fast)
    p.up.click(move(-1), [p.book, p.chapter], shown, api_name="plan_move_up", **fast)
    p.down.click(move(+1), [p.book, p.chapter], shown, api_name="plan_move_down", **fast)
    p.remove.click(remove, [p.book, p.chapter], shown, api_name="plan_remove_chapter", **fast)
    p.write.click(write, [p.book, p.chapter, p.premise, p.target], shown, api_name="plan_write_chapter", **fast)
    p.open.click(open_chapter, [p.book, p.chapter], [*w.opened, tabs, *shown], api_name="plan_open_chapter",
                 **fast)
    p.export.click(export, [p.book, p.fmt], [p.file, p.status], api_name="plan_export", **fast)
    p.timer.tick(tick, p.book, [p.chapters, p.timer], api_name="plan_tick", show_progress="hidden", **fast)


def chosen(chapter_id: int | None) -> int:
    if chapter_id is None:
        raise PlanProblem("Chapter", "choose a chapter first")
    return chapter_id
