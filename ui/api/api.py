"""REST API beside the Gradio UI. Other tools rely on these paths and field names: keep them exact.

    POST /api/generations                    -> 201 {"id", "status", "session_id"}
    GET  /api/generations/{id}[?since=N[&wait=S]] -> {"id", "status", "produced_tokens", "target_tokens",
                                     "text", "metrics", "session_id", "parent_id", "finish_reason", "error",
                                     "next_since", "origin", "memory", "authors_note", "world_info", "settings"}
    GET  /api/generations/{id}/tokens        -> {"prompt_tokens": [...], "tokens": [...]}
    POST /api/generations/{id}/pause|resume|cancel
    PUT  /api/generations/{id}/context       {"memory", "authors_note"[, "world_info"]} -> the same, with "id"
    DELETE /api/generations/{id}             -> 204 (409 while queued or running: cancel it first)
    GET  /api/generations/{id}/export?format=txt|md|epub|docx[&title=&author=]
    GET  /api/generations/{id}/alternatives?position=N, POST .../branch, GET .../branches: ui/api/branch_api.py
    GET  /api/health
    GET  /api/presets                        -> {"<name>": {<preset>}, ...} (tokenswift/text/writing_presets.py)
    /api/books, /api/books/{id}/plan, .../chapters[/{cid}[/write]], .../export: a book's plan, ui/api/plan_api.py

Polling: `text` is the whole generated text, or with `?since=N` only the text of chunks N, N+1, ...; an edit's
`text` (origin "edit") starts with the writer's edited text, as POST .../edit took it (an instruction draft's story),
then what the model wrote after it, while `?since=N` still gives only the chunks' text;
`next_since` is the N to ask with next time. The text is assembled once and extended by new chunks, and not
read from the store at all while nothing was committed (ui/drafts/texts.py): polls never rebuild a long draft.
`&wait=S` (0 to 10 seconds) makes it a long-poll: the answer comes as soon as there is text past chunk N or
the draft is no longer queued or running, else after S seconds with no new text (ui/api/follow.py). Status reads
are limited per client address (429 with Retry-After; ui/api/guard.py, ui/api/ratelimit.py).

Memory (pinned at the top of the model's context) and Author's Note (inserted near its end) are per draft:
given at creation ("memory", "authors_note"), edited with PUT .../context, read back in GET; a change
applies from the draft's next resume. So is World Info ("world_info": {"depth", "entries": [{"keys",
"secondary_keys", "content", "constant", "enabled"}]}, tokenswift/text/world_info.py; null or absent: none; in PUT
.../context, absent: unchanged), its errors named by entry and field ("world_info.entries[3].keys: ...").
Targets past the model's context are accepted while context shifting is on (settings.context_shift, default
on; false refuses them as before); a max_new_tokens below 1 or above ui.drafts.limits.MAX_NEW_TOKENS (10,000,000)
is a 422.

Validation errors are 422 in FastAPI's shape, {"detail": [{"loc": [...], "msg", "type"}]}, and every
msg starts with the field it is about ("settings.penalty_window: must be in 0..131072"). Settings go through
tokenswift.settings.DraftSettings (the text's Settings, the speed's Speculation), so the API, the CLI and the UI
reject the same values with the same words.
Integers are checked against the store's 64-bit range and text against Unicode (a lone surrogate) before
anything else sees them: bad input is a 422, never a 500. Login, body and upload limits: ui/api/guard.py.
This process never loads the model: it reads and writes the store, and loads only the model's tokenizer
(ui/drafts/tokens.py) to refuse a prompt + max_new_tokens beyond the context up front, in the engine's words. Drafts are
started, continued, edited and given their context by the drafts service (ui/drafts/drafts.py), as the UI's are: both
refuse the same request with the same words.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Query, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from bookexport import FORMATS, export_book
from storage import Conflict, NotFound, Store, StoreError
from storage.health import store_problem
from storage.records import SQL_INT_MAX, GenerationRecord
from tokenswift.settings import RENAMED, DraftSettings, SettingsError
from tokenswift.text.writing_presets import built_in
from ui.api.api_input import (
    ContextIn,
    GenerationIn,
    GenId,
    found,
    invalid,
    json_object,
    parse_request,
    settings_invalid,
    wait_seconds,
    world_info_json,
)
from ui.api.branch_api import add_branch_routes
from ui.api.follow import Commits
from ui.api.guard import Guard
from ui.api.openai_api import add_openai_routes
from ui.api.plan_api import add_plan_routes
from ui.api.store_ops import ApiStore
from ui.drafts.drafts import Context, DraftService
from ui.drafts.exports import draft_book
from ui.drafts.limits import Limits, printable
from ui.drafts.texts import DraftTexts
from ui.drafts.tokens import PromptTokens


def create(drafts: DraftService, request: GenerationIn, settings: DraftSettings) -> GenerationRecord:
    """POST /generations: a new draft, or one that continues continue_from; a refusal is a 422 naming its field."""
    try:
        if request.continue_from is not None:
            return drafts.continue_from(request.continue_from, settings, book=request.session_id)
        context = Context(request.memory, request.authors_note, world_info_json(request.world_info))
        return drafts.start(request.prompt, settings, book=request.session_id, context=context)
    except SettingsError as error:
        raise settings_invalid(error) from None
    except NotFound as error:
        field = "session_id" if error.what == "session" else "continue_from"
        raise invalid(field, str(error)) from None
    except Conflict as error:
        raise invalid("continue_from", str(error)) from None


def generation_view(gen: GenerationRecord, text: str, metrics: dict) -> dict:
    return {
        "id": gen.id, "status": gen.status, "produced_tokens": gen.produced_tokens,
        "target_tokens": gen.target_tokens, "text": text, "metrics": metrics,
        "session_id": gen.session_id, "parent_id": gen.parent_id, "finish_reason": gen.finish_reason,
        "origin": gen.origin, "error": gen.error, "next_since": gen.chunk_count,
        "memory": gen.memory, "authors_note": gen.authors_note, "world_info": world_info_view(gen.world_info),
        "settings": settings_view(gen.settings_json),
    }


def settings_view(stored: str) -> dict:
    """The draft's settings under the names a POST takes them by (a draft saved by an earlier version: RENAMED)."""
    return {RENAMED.get(key, key): value for key, value in json.loads(stored).items()}


def world_info_view(stored: str) -> dict | None:
    return json.loads(stored) if stored else None


def store_errors():
    """A store that cannot be written (full disk, read-only file) answers 503 with the reason."""
    try:
        yield
    except StoreError as error:
        raise HTTPException(503, detail=str(error)) from error


def create_router(store: Store, tokens: PromptTokens | None = None, texts: DraftTexts | None = None,
                  commits: Commits | None = None) -> APIRouter:
    """The /api routes over `store` (the login, when there is one, is ui/api/guard.py's, in front of the app).
    `tokens`, `texts`: the app's tokenizer and text caches (shared with the UI); without them the router keeps
    its own. `commits`: what wakes long-polls (one for `texts`' store if not given)."""
    router = APIRouter(prefix="/api", dependencies=[Depends(store_errors)])

    texts = texts or DraftTexts(store)
    tokens = tokens or PromptTokens(store)
    drafts = DraftService(store, tokens)
    add_generation_routes(router, store, drafts, texts, commits or Commits(texts.changes))
    add_writing_routes(router, drafts)
    add_export_route(router, store)
    add_control_routes(router, store)
    add_branch_routes(router, store, tokens)
    add_plan_routes(router, store, tokens)

    @router.get("/health")
    def health() -> dict:
        workers = store.list_workers()
        w = workers[0] if workers else None
        problem = store_problem(store)
        return {
            "store": f"store unwritable: {problem}" if problem else "ok",
            "model": w.model if w else None, "device": w.device if w else None,
            "dtype": w.dtype if w else None, "load_status": w.load_status if w else "no worker",
            "load_error": w.load_error if w else None, "max_context": w.max_context if w else None,
            "model_info": w.heads_info if w else None,  # its drafters and, on a GPU, the decoding path and why
            "queue_length": store.queue_length(),
            "worker_heartbeat_age_s": round(w.heartbeat_age_s, 3) if w else None,
        }

    @router.get("/presets")
    def presets() -> dict:
        """The built-in writing presets by name; each is also a valid `settings` object of POST /generations."""
        return built_in()

    return router


def add_generation_routes(router: APIRouter, store: ApiStore, drafts: DraftService, texts: DraftTexts,
                          commits: Commits) -> None:
    @router.post("/generations", status_code=201)
    def create_generation(payload: Annotated[dict[str, Any], Depends(json_object)]) -> dict:
        request, settings = parse_request(payload)
        gen = create(drafts, request, settings)
        return {"id": gen.id, "status": gen.status, "session_id": gen.session_id}

    @router.get("/generations/{gen_id}")
    async def get_generation(gen_id: GenId, since: Annotated[int | None, Query(ge=0, le=SQL_INT_MAX)] = None,
                             wait: str | None = None) -> dict:
        # async, so a long-poll waits on the event loop and holds no server thread; the store reads run in
        # the thread pool as a plain (sync) route's would.
        deadline = time.monotonic() + wait_seconds(wait, since)
        while True:
            draft = await run_in_threadpool(found, texts.read, gen_id)
            left = deadline - time.monotonic()
            record = draft.record
            if since is None or record.chunk_count > since or record.status not in ("queued", "running") or left <= 0:
                break
            await commits.after(draft.version, left)
        text = draft.text if since is None else draft.since(since)
        if since is None and draft.record.origin == "edit":  # the writer's text is its prompt: it is the edit's text
            instruction = await run_in_threadpool(found, store.instruction, gen_id) or ""
            text = draft.record.prompt_text[len(instruction):] + text
        return generation_view(draft.record, text, draft.metric.to_dict() if draft.metric else {})

    @router.delete("/generations/{gen_id}", status_code=204)
    def delete_generation(gen_id: GenId) -> Response:
        try:
            found(store.delete_generation, gen_id)
        except Conflict as error:
            raise HTTPException(409, detail=str(error)) from None
        return Response(status_code=204)

    @router.get("/generations/{gen_id}/tokens")
    def get_tokens(gen_id: GenId) -> dict:
        tokens = found(store.get_tokens, gen_id)
        return {"prompt_tokens": tokens.prompt_ids, "tokens": tokens.generated_ids}


def add_writing_routes(router: APIRouter, drafts: DraftService) -> None:
    """The writer's changes to a draft: an edit (a new draft) and its Memory, Author's Note and World Info."""
    @router.post("/generations/{gen_id}/edit", status_code=201)
    def edit_generation(gen_id: GenId, payload: Annotated[dict[str, Any], Body()]) -> dict:
        """The writer's version of a stopped draft, saved as a new draft; the original stays as it was. `text` is the
        whole edited draft; for an instruction draft, its whole story alone (the instruction stays as it was)."""
        text = payload.get("text")
        if set(payload) != {"text"} or not isinstance(text, str):
            raise invalid("text", 'send {"text": "<the whole edited draft (an instruction draft: its story, without '
                                  'the instruction)>"} and nothing else')
        try:
            gen = found(lambda i: drafts.edit(i, text), gen_id)
        except Conflict as error:
            raise HTTPException(409, detail=str(error)) from None
        except SettingsError as error:  # not Unicode, starts with the instruction, empty or unchanged
            raise settings_invalid(error) from None
        return {"id": gen.id, "status": gen.status, "parent_id": gen.parent_id, "session_id": gen.session_id}

    @router.put("/generations/{gen_id}/context")
    def set_context(gen_id: GenId, payload: Annotated[dict[str, Any], Depends(json_object)]) -> dict:
        """The draft's Memory, Author's Note and World Info; a running draft picks the change up at its next context
        shift or resume."""
        try:
            values = ContextIn.model_validate(payload)
        except ValidationError as error:
            e = error.errors(include_url=False)[0]
            field = ".".join(str(part) for part in e["loc"]) or "body"
            raise invalid(printable(field), printable(e["msg"])) from None
        world = world_info_json(values.world_info) if "world_info" in values.model_fields_set else None
        try:
            gen = found(lambda i: drafts.set_context(i, Context(values.memory, values.authors_note, world)), gen_id)
        except SettingsError as error:
            raise settings_invalid(error) from None
        return {"id": gen.id, "memory": gen.memory, "authors_note": gen.authors_note,
                "world_info": world_info_view(gen.world_info)}


def add_export_route(router: APIRouter, store: ApiStore) -> None:
    @router.get("/generations/{gen_id}/export")
    def export(gen_id: GenId, format: str = "txt", title: str | None = None, author: str | None = None):
        if format not in FORMATS:
            raise HTTPException(422, detail=[{"loc": ["query", "format"], "type": "value_error",
                                              "msg": f"format: must be one of {', '.join(FORMATS)}"}])
        gen = found(store.get_generation, gen_id)
        book = store.get_session(gen.session_id)
        title = book.title if title is None else title
        author = book.author if author is None else author
        data, media_type, filename = export_book(draft_book(gen, book, title, author, store.instruction(gen_id)),
                                                 format)
        disposition = f"attachment; filename=\"{quote(filename)}\"; filename*=UTF-8''{quote(filename)}"
        return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})


def add_control_routes(router: APIRouter, store: ApiStore) -> None:
    verbs = {"pause": store.request_pause, "resume": store.request_resume, "cancel": store.request_cancel}
    for verb, request in verbs.items():
        router.add_api_route(f"/generations/{{gen_id}}/{verb}", control_route(request), methods=["POST"],
                             name=verb)


def control_route(request):
    def control(gen_id: GenId) -> dict:
        try:
            gen = found(request, gen_id)
        except Conflict as error:
            raise HTTPException(409, detail=str(error)) from None
        return {"id": gen.id, "status": gen.status, "control": gen.control}

    return control


def create_app(store: Store, credentials: Sequence[tuple[str, str]] | None = None,
               limits: Limits | None = None) -> Guard:
    """A stand-alone app with just the APIs, /api and /v1 (tests, headless servers); app.py mounts them instead."""
    app = FastAPI(title="TokenSwift Studio API", docs_url="/api/docs", openapi_url="/api/openapi.json",
                  redoc_url=None)
    tokens, texts = PromptTokens(store), DraftTexts(store)
    app.include_router(create_router(store, tokens, texts))
    add_openai_routes(app, store, tokens, texts)
    return Guard(app, credentials or None, limits or Limits())
