"""REST routes for a book's plan (storage/plans.py; what the model sees: ui/drafts/plan_drafts.py), beside
ui/api/api.py's:

    POST   /api/books                                  {"title"[, "author"]} -> 201 {"id", "title", "author"}
    GET    /api/books/{id}/plan                        -> {"book_id", "title", "author", "premise",
                                                           "characters": [{"name", "description", "keys"}],
                                                           "chapters": [<chapter>, ...]} (in the book's order)
    PUT    /api/books/{id}/plan                        {["premise"], ["characters"]} -> the plan (absent: unchanged;
                                                           a characters list replaces them all)
    POST   /api/books/{id}/chapters                    {"title"[, "beats"][, "position"]} -> 201 <chapter>
    PUT    /api/books/{id}/chapters/{cid}              {["title"], ["beats"], ["position"], ["draft_id"]} -> <chapter>
    DELETE /api/books/{id}/chapters/{cid}              -> 204 (its drafts stay in the book)
    POST   /api/books/{id}/chapters/{cid}/write        {"max_new_tokens"[, "mode", "seed", "settings"]} -> 201
                                                       {"id", "status", "session_id", "chapter_id", "prompt_format"}
    GET    /api/books/{id}/export?format=txt|md|epub|docx[&title=&author=]  the written chapters, each under its title

<chapter> is {"id", "number", "title", "beats", "draft_id", "state", "status", "words"}: state is "not written",
"writing" (its draft is queued or running), "paused" or "written"; words count its text. Writing a chapter makes a
new draft (the chapter's text from then on; 409 while the chapter is being written); continuing or editing the
chapter's draft (POST /api/generations with continue_from, POST /api/generations/{id}/edit) moves the chapter to the
new draft; "draft_id" points it at any draft of the book. Bad input is a 422 naming the field, as everywhere in /api.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Path, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from bookexport import FORMATS, export_book
from storage import Conflict, NotFound
from storage.plans import Chapter, Character, Plan
from storage.records import SQL_INT_MAX
from tokenswift.settings import SettingsError
from ui.api.api_input import GenerationIn, Id, Int, SamplingIn, invalid, json_object, settings_invalid, to_settings
from ui.api.store_ops import ApiStore
from ui.drafts.drafts import DraftService
from ui.drafts.limits import printable, target_problem
from ui.drafts.plan_drafts import plan_book, state, words, write_chapter
from ui.drafts.plan_input import MAX_PREMISE, MAX_TITLE, PlanProblem, check_chapter, check_characters, check_text
from ui.drafts.tokens import PromptTokens

BookId = Annotated[int, Path(ge=1, le=SQL_INT_MAX)]
Body = Annotated[dict[str, Any], Depends(json_object)]


class BookIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    title: str
    author: str = ""


class CharacterIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    description: str = ""
    keys: list[str] = []  # key words besides the name that bring the character into the model's view


class PlanIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    premise: str | None = None  # absent: unchanged
    characters: list[CharacterIn] | None = None  # absent: unchanged; a list replaces them all


class ChapterIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    title: str
    beats: list[str] = []
    position: Id | None = None  # 1: first; absent or past the end: last


class ChapterEditIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    title: str | None = None
    beats: list[str] | None = None
    position: Id | None = None  # move it there
    draft_id: Id | None = None  # make this draft of the book the chapter's text (null: not written)


class WriteIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    max_new_tokens: Int
    mode: str = "tokenswift"
    seed: Int = 0
    settings: SamplingIn = SamplingIn()


def chapter_view(chapter: Chapter) -> dict:
    return {"id": chapter.id, "number": chapter.position, "title": chapter.title, "beats": list(chapter.beats),
            "draft_id": chapter.draft_id, "state": state(chapter), "status": chapter.status, "words": words(chapter)}


def plan_view(plan: Plan) -> dict:
    return {"book_id": plan.book.id, "title": plan.book.title, "author": plan.book.author, "premise": plan.premise,
            "characters": [{"name": c.name, "description": c.description, "keys": list(c.keys)}
                           for c in plan.characters],
            "chapters": [chapter_view(c) for c in plan.chapters]}


def parsed(model: type[BaseModel], payload: dict[str, Any]):
    """The body as `model`, or a 422 naming the first bad field."""
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        e = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in e["loc"]) or "body"
        raise invalid(printable(field), printable(e["msg"])) from None


def checked(work):
    """work() with the plan's problems and the drafts service's refusals as 422s, and a missing book, chapter or draft
    as 404."""
    try:
        return work()
    except PlanProblem as problem:
        raise invalid(problem.field, problem.reason) from None
    except NotFound as error:
        raise HTTPException(404, detail=str(error)) from None
    except SettingsError as error:  # the drafts service's refusal
        raise settings_invalid(error) from None


def own_chapter(store: ApiStore, book_id: int, chapter_id: int) -> Chapter:
    """The chapter, or a 404 unless it is in `book_id`."""
    book, chapter = checked(lambda: store.chapter(chapter_id))
    if book != book_id:
        raise HTTPException(404, detail=f"no chapter {chapter_id} in book {book_id}")
    return chapter


def add_plan_routes(router: APIRouter, store: ApiStore, tokens: PromptTokens) -> None:
    """The book and plan routes here, the chapters' in add_chapter_routes."""
    @router.post("/books", status_code=201)
    def create_book(payload: Body) -> dict:
        values = parsed(BookIn, payload)
        title = checked(lambda: check_text("title", values.title, MAX_TITLE, required=True))
        author = checked(lambda: check_text("author", values.author, MAX_TITLE))
        book = store.create_session(title, author)
        return {"id": book.id, "title": book.title, "author": book.author}

    @router.get("/books/{book_id}/plan")
    def get_plan(book_id: BookId) -> dict:
        return plan_view(checked(lambda: store.plan(book_id)))

    @router.put("/books/{book_id}/plan")
    def set_plan(book_id: BookId, payload: Body) -> dict:
        values = parsed(PlanIn, payload)
        checked(lambda: store.plan(book_id))  # a 404 before any field is looked at
        premise = None if values.premise is None else checked(lambda: check_text("premise", values.premise,
                                                                                   MAX_PREMISE))
        characters = None if values.characters is None else checked(lambda: check_characters(
            [Character(c.name, c.description, tuple(c.keys)) for c in values.characters]))
        if premise is not None:
            store.set_premise(book_id, premise)
        if characters is not None:
            store.set_characters(book_id, characters)
        return plan_view(store.plan(book_id))

    add_chapter_routes(router, store, DraftService(store, tokens))

    @router.get("/books/{book_id}/export")
    def export(book_id: BookId, format: str = "epub", title: str | None = None, author: str | None = None):
        if format not in FORMATS:
            raise invalid("format", f"must be one of {', '.join(FORMATS)}", where="query")
        plan = checked(lambda: store.plan(book_id))
        book = plan_book(plan, plan.book.title if title is None else title,
                         plan.book.author if author is None else author)
        data, media_type, filename = export_book(book, format)
        disposition = f"attachment; filename=\"{quote(filename)}\"; filename*=UTF-8''{quote(filename)}"
        return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})


def add_chapter_routes(router: APIRouter, store: ApiStore, drafts: DraftService) -> None:
    """Add, edit, delete and write a chapter (a chapter's draft starts through the drafts service,
    ui/drafts/drafts.py)."""
    @router.post("/books/{book_id}/chapters", status_code=201)
    def add_chapter(book_id: BookId, payload: Body) -> dict:
        values = parsed(ChapterIn, payload)
        title, beats = checked(lambda: check_chapter(values.title, values.beats))
        return chapter_view(checked(lambda: store.add_chapter(book_id, title, beats, values.position)))

    @router.put("/books/{book_id}/chapters/{chapter_id}")
    def edit_chapter(book_id: BookId, chapter_id: BookId, payload: Body) -> dict:
        values = parsed(ChapterEditIn, payload)
        chapter = own_chapter(store, book_id, chapter_id)
        title, beats = checked(lambda: check_chapter(values.title, values.beats))
        if title is not None or beats is not None:
            chapter = store.edit_chapter(chapter_id, title, beats)
        if "draft_id" in values.model_fields_set:
            try:
                chapter = store.choose_chapter_draft(chapter_id, values.draft_id)
            except NotFound as error:
                raise invalid("draft_id", str(error)) from None
        if values.position is not None:
            chapter = store.move_chapter(chapter_id, values.position)
        return chapter_view(chapter)

    @router.delete("/books/{book_id}/chapters/{chapter_id}", status_code=204)
    def delete_chapter(book_id: BookId, chapter_id: BookId) -> Response:
        own_chapter(store, book_id, chapter_id)
        store.delete_chapter(chapter_id)
        return Response(status_code=204)

    @router.post("/books/{book_id}/chapters/{chapter_id}/write", status_code=201)
    def write(book_id: BookId, chapter_id: BookId, payload: Body) -> dict:
        values = parsed(WriteIn, payload)
        if problem := target_problem(values.max_new_tokens):
            raise invalid("max_new_tokens", problem)
        own_chapter(store, book_id, chapter_id)
        settings = to_settings(GenerationIn(prompt="", max_new_tokens=values.max_new_tokens, mode=values.mode,
                                            seed=values.seed, settings=values.settings))
        try:
            gen = checked(lambda: write_chapter(drafts, chapter_id, settings))
        except Conflict as error:
            raise HTTPException(409, detail=str(error)) from None
        prompt_format = "instruction" if store.instruction(gen.id) is not None else "continue"
        return {"id": gen.id, "status": gen.status, "session_id": gen.session_id, "chapter_id": chapter_id,
                "prompt_format": prompt_format}
