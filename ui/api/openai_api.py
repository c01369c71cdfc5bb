"""An OpenAI-compatible endpoint, for the tools writers already use (SillyTavern, mikupad, scripts, agents):

    GET  /v1/models             -> the model new drafts run on
    POST /v1/completions        {"prompt", "max_tokens", "stream", "stop", "seed", "temperature", ...}
    POST /v1/chat/completions   {"messages": [{"role", "content"}, ...], ...}

The fields it takes, and how a bad one is refused: ui/api/openai_input.py. The login is the app's (ui/api/guard.py):
with --auth, the password is also the API key. Errors come in OpenAI's shape, {"error": {"message", "type", "param",
"code"}}, with the status OpenAI would give (400 for a bad field, 401, 404, 413, 503).

Every request is a draft in the book "API requests", so it is durable, visible in the Library and exportable.
The worker runs it as any other, with TokenSwift (the same text as plain decoding). The answer follows the draft
as the worker commits it (ui/drafts/texts.py, woken like the API's long-polls, ui/api/follow.py): streamed as
server-sent events in OpenAI's chunks, ending with `data: [DONE]`, or whole once the draft stops. A client that goes
away before then cancels its draft. The text ends before the first stop string, as OpenAI's does (the draft keeps it).

Chat: this process renders the messages with the model's own chat template (the tokenizer ui/drafts/tokens.py loads to
count prompts), with the assistant's turn opened, and queues the result as the draft's opening together with its
ids, which are exactly the template's (tokenised as transformers' apply_chat_template does); the worker runs
those ids as it runs a continuation's. So no other part of the app learns about messages: the draft reads in the
Library as the model saw it, and Continue, a branch or an export work on it as on any draft. A last message of
the assistant (a prefill; SillyTavern's Continue) is the start of the answer, which the model goes on with.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2 import TemplateError
from starlette.concurrency import run_in_threadpool

from storage import Conflict, NotFound, StoreError
from storage.records import GenerationRecord
from tokenswift.model.hf_files import is_hub_id
from tokenswift.settings import DraftSettings, Settings, SettingsError
from ui.api.follow import Commits
from ui.api.openai_input import (
    OPENAI_PREFIX,
    OpenAIError,
    Parsed,
    bad,
    error_body,
    parse_body,
    parse_messages,
    parse_options,
    parse_prompt,
)
from ui.api.store_ops import ApiStore
from ui.drafts.drafts import DraftService
from ui.drafts.texts import Draft, DraftTexts
from ui.drafts.tokens import PromptTokens

BOOK_TITLE = "API requests"
WAIT_S = 1.0  # a non-streaming answer looks this often whether its client is still there
RUNNING = ("queued", "running")
REQUEST_NAMES = {"max_new_tokens": "max_tokens"}  # a refused field by this endpoint's name for it


def add_openai_routes(app: FastAPI, store: ApiStore, tokens: PromptTokens, texts: DraftTexts) -> None:
    """The /v1 routes on `app`, before anything mounted at / (which would shadow them)."""
    app.include_router(create_openai_router(store, tokens, texts))
    app.add_exception_handler(OpenAIError, _error_response)


def create_openai_router(store: ApiStore, tokens: PromptTokens, texts: DraftTexts) -> APIRouter:
    router = APIRouter(prefix=OPENAI_PREFIX, dependencies=[Depends(_store_errors)])
    drafts = Drafts(store, tokens, texts, Commits(texts.changes))

    @router.get("/models")
    def models() -> dict:
        model = drafts.model_name()
        card = {"id": model, "object": "model", "created": 0, "owned_by": "tokenswift-studio"}
        return {"object": "list", "data": [card] if model else []}

    @router.post("/completions")
    async def completions(request: Request):
        payload = parse_body(await request.body())
        prompt, parsed = parse_prompt(payload), parse_options(payload, "completion")
        gen = await run_in_threadpool(drafts.enqueue, prompt, parsed.settings)
        return await drafts.answer(request, gen, parsed, chat=False)

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        payload = parse_body(await request.body())
        messages, parsed = parse_messages(payload), parse_options(payload, "chat")
        text, ids = await run_in_threadpool(drafts.render, messages)
        gen = await run_in_threadpool(drafts.enqueue, text, parsed.settings, ids)
        return await drafts.answer(request, gen, parsed, chat=True)

    @router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    def unknown(rest: str) -> None:
        raise OpenAIError(404, f"{OPENAI_PREFIX}/{rest}: not served here (models, completions and chat/completions "
                               "are)", None, "unknown_url")

    return router


class Drafts:
    """The requests' drafts: queued in the book of API requests, followed until they stop."""

    def __init__(self, store: ApiStore, tokens: PromptTokens, texts: DraftTexts, commits: Commits):
        self.store, self.tokens, self.texts, self.commits = store, tokens, texts, commits
        self.drafts = DraftService(store, tokens)
        self._book_lock = threading.Lock()  # two first requests make one book

    def model(self) -> str | None:
        target = self.tokens.target()
        return target[0] if target else None

    def model_name(self) -> str | None:
        """The model as clients see it (/v1/models, each reply's "model"): a hub id as it is, a local file or folder by
        its name. Its full path named the server's folders to every client, SillyTavern showing it as the model."""
        model = self.model()
        if model is None or is_hub_id(model):
            return model
        return Path(model).name or model

    def enqueue(self, prompt: str, settings: Settings, prompt_ids: list[int] | None = None) -> GenerationRecord:
        """The request's draft, started through the drafts service (ui/drafts/drafts.py) as every front door's is; its
        refusal names the field as this request named it."""
        with self._book_lock:
            book = next((b.id for b in self.store.list_sessions() if b.title == BOOK_TITLE), None)
            book = book or self.store.create_session(BOOK_TITLE).id
            try:
                # OpenAI's names shape the text only: TokenSwift drafts with its default options.
                return self.drafts.start(prompt, DraftSettings(settings), book=book, prompt_ids=prompt_ids)
            except SettingsError as error:
                raise bad(REQUEST_NAMES.get(error.field, error.field), error.reason) from None

    def render(self, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
        model = self.model()
        if model is None:
            raise OpenAIError(503, "no model is chosen yet: choose one in the Model tab", None, "no_model")
        name = self.model_name()
        rendered = self.tokens.use(model, lambda tokenizer, _context: render_chat(tokenizer, messages, name))
        if rendered is None:
            raise OpenAIError(503, f"the chat template of {name} cannot be read in the app's process (its tokenizer "
                                   "did not load here); send a prompt you format yourself to /v1/completions", None,
                              "tokenizer_unavailable")
        return rendered

    async def answer(self, request: Request, gen: GenerationRecord, parsed: Parsed, chat: bool):
        reply = Reply(chat, f"{'chatcmpl' if chat else 'cmpl'}-{gen.id}", self.model_name() or "tokenswift",
                      int(time.time()))
        headers = {"X-TokenSwift-Draft": str(gen.id)}  # the draft's id, for the /api and the Library
        if parsed.stream:
            headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy may hold the events
            return StreamingResponse(self.events(gen.id, parsed, reply), media_type="text/event-stream",
                                     headers=headers)
        cut = StopCut(parsed.settings.stop)
        async with contextlib.aclosing(self.follow(gen.id, request)) as drafts:
            async for draft in drafts:
                last = draft
        record = last.record
        if record.status == "failed":
            raise OpenAIError(500, f"the draft failed: {record.error}", None, "generation_failed")
        text = cut.feed(last.text) + cut.rest()
        usage = await run_in_threadpool(self.usage, record)
        return JSONResponse(reply.whole(text, finish_reason(record, cut.stopped), usage), headers=headers)

    async def events(self, gen_id: int, parsed: Parsed, reply: Reply) -> AsyncIterator[str]:
        """The answer as server-sent events: OpenAI's chunks as the text comes, the last with the finish reason."""
        cut, seen = StopCut(parsed.settings.stop), 0
        if reply.chat:
            yield _event(reply.chunk(None, None, role=True))
        try:
            # Closed on the way out, so a client gone mid-stream cancels its draft at once, not at a collection.
            async with contextlib.aclosing(self.follow(gen_id)) as drafts:
                async for draft in drafts:
                    if piece := cut.feed(draft.text[seen:]):
                        yield _event(reply.chunk(piece, None))
                    seen = len(draft.text)
            record = draft.record
            if record.status == "failed":
                yield _event(error_body(500, f"the draft failed: {record.error}", None, "generation_failed"))
            else:
                if piece := cut.rest():
                    yield _event(reply.chunk(piece, None))
                yield _event(reply.chunk(None, finish_reason(record, cut.stopped)))
                if parsed.include_usage:
                    yield _event(reply.usage_chunk(await run_in_threadpool(self.usage, record)))
        except StoreError as error:  # the status went out with the first event: say it in the stream
            yield _event(error_body(503, str(error), None, "store_unavailable"))
        yield "data: [DONE]\n\n"

    async def follow(self, gen_id: int, request: Request | None = None) -> AsyncIterator[Draft]:
        """The draft after each commit to it, until it stops. A client that goes away cancels it: a stream's is
        noticed by the server, which cancels the stream; a waiting request's (`request`) is looked for here."""
        stopped = False
        try:
            while True:
                draft = await run_in_threadpool(self.texts.read, gen_id)
                stopped = draft.record.status not in RUNNING
                yield draft
                if stopped or (request is not None and await request.is_disconnected()):
                    return
                await self.commits.after(draft.version, WAIT_S)
        finally:
            if not stopped:
                with anyio.CancelScope(shield=True):  # the stream's task is being cancelled: this must still run
                    await run_in_threadpool(self.cancel, gen_id)

    def cancel(self, gen_id: int) -> None:
        # It may have stopped meanwhile or been deleted; with the store down, the draft runs to its end.
        with contextlib.suppress(Conflict, NotFound, StoreError):
            self.store.request_cancel(gen_id)

    def usage(self, record: GenerationRecord) -> dict:
        prompt = len(self.store.get_tokens(record.id).prompt_ids or [])
        return {"prompt_tokens": prompt, "completion_tokens": record.produced_tokens,
                "total_tokens": prompt + record.produced_tokens}


def render_chat(tokenizer, messages: list[dict[str, str]], name: str) -> tuple[str, list[int]]:
    """The conversation as `name`'s chat template writes it, the assistant's turn opened, and its ids."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad("messages", f"{name} has no chat template; send a prompt to /v1/completions instead",
                  "no_chat_template")
    head, answer = messages, ""
    if messages[-1]["role"] == "assistant":  # a prefill: the answer starts with it
        head, answer = messages[:-1], messages[-1]["content"]
    if not head:
        raise bad("messages", "needs a message before the assistant's")
    try:
        text = tokenizer.apply_chat_template(head, add_generation_prompt=True, tokenize=False) + answer
    except TemplateError as error:
        raise bad("messages", f"the model's chat template refused them: {error}", "chat_template") from None
    # As apply_chat_template(tokenize=True) does: the template writes its own special tokens.
    return text, list(tokenizer(text, add_special_tokens=False).input_ids)


class StopCut:
    """The text a client may see: up to the first stop string (left out, as OpenAI's answers do), holding back an
    end that may yet become one. The engine stops at the token that completes it, past which nothing is sent."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.held, self.stopped = stops, "", False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        held = self.held + text
        found = [at for at in (held.find(stop) for stop in self.stops) if at >= 0]
        if found:
            self.stopped, self.held = True, ""
            return held[:min(found)]
        keep = max((k for stop in self.stops for k in range(1, len(stop)) if held.endswith(stop[:k])), default=0)
        self.held = held[len(held) - keep:]
        return held[:len(held) - keep]

    def rest(self) -> str:
        """What was held back, once the draft has stopped without completing a stop string."""
        held, self.held = self.held, ""
        return held


def finish_reason(record: GenerationRecord, stopped: bool) -> str:
    """OpenAI's: "length" when the draft reached max_tokens, else "stop" (the end of text, a stop string, or a
    cancel from the Library)."""
    return "length" if record.finish_reason == "length" and not stopped else "stop"


@dataclass(frozen=True)
class Reply:
    """One request's answer in its endpoint's shapes."""

    chat: bool
    id: str
    model: str
    created: int

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict:
        if not self.chat:
            return self._wrap("text_completion", {"text": text or "", "logprobs": None, "finish_reason": finish})
        delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        return self._wrap("chat.completion.chunk", {"delta": delta, "logprobs": None, "finish_reason": finish})

    def whole(self, text: str, finish: str, usage: dict) -> dict:
        if self.chat:
            choice = {"message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"text": text, "logprobs": None, "finish_reason": finish}
        return {**self._wrap("chat.completion" if self.chat else "text_completion", choice), "usage": usage}

    def usage_chunk(self, usage: dict) -> dict:
        """stream_options.include_usage: a last chunk with no choices and the counts."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [],
                "usage": usage}

    def _wrap(self, kind: str, choice: dict) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [{"index": 0, **choice}]}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _store_errors():
    """A store that cannot be read or written answers 503, in OpenAI's shape."""
    try:
        yield
    except StoreError as error:
        raise OpenAIError(503, str(error), None, "store_unavailable") from error


async def _error_response(_request: Request, error: OpenAIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code), status_code=error.status)
