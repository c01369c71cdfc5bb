"""What the REST API accepts: the request bodies, their checks, and errors in FastAPI's 422 shape, every message
starting with the field it is about (ui/api/api.py holds the routes; ui/api/branch_api.py and ui/api/plan_api.py
build on these too)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from fastapi import HTTPException, Path, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from storage import NotFound
from storage.records import SQL_INT_MAX
from tokenswift.settings import TEXT_FIELDS, WRITING_DEFAULTS, DraftSettings, SettingsError
from tokenswift.text.world_info import WorldInfo
from ui.api.follow import MAX_WAIT_S
from ui.drafts.drafts import DraftProblem
from ui.drafts.limits import printable, target_problem, unicode_problem

TOP_LEVEL = ("max_new_tokens", "mode", "seed", "prompt_format")
Int = Annotated[int, Field(ge=-SQL_INT_MAX - 1, le=SQL_INT_MAX)]  # what the store can hold
Id = Annotated[int, Field(ge=1, le=SQL_INT_MAX)]
GenId = Annotated[int, Path(ge=1, le=SQL_INT_MAX)]
KINDS = {"number": float, "integer": Int, "boolean": bool, "strings": list[str]}  # the table's kinds as the API's


class DraftingIn(BaseModel):
    """The settings of a draft that are not the table's: how TokenSwift drafts (speed only, to_settings routes them
    to the draft's Speculation) and its context window."""

    model_config = ConfigDict(extra="forbid", strict=True)
    ngram_topk: Int | None = None  # k
    tree: list[Int] | None = None
    budget: Int | None = None
    drafter: str | None = None  # "auto", "fused", "paper", "layer" or "model": how TokenSwift drafts (speed only)
    context_shift: bool | None = None  # shift past the model's context (default on); false: refuse such targets
    context_window: Int | None = None  # tokens in one window (default and ceiling: the model's context)
    shift_step: Int | None = None  # tokens dropped per shift (default: a quarter of the window)
    note_depth: Int | None = None  # the Author's Note goes this many tokens before the end of the window


# `settings` of a request: the table's rows the API takes (tokenswift/settings/table.py), each optional (unset:
# the writing default), then DraftingIn's.
SamplingIn = create_model("SamplingIn", __base__=DraftingIn,
                          **{row.name: (KINDS[row.kind] | None, None) for row in TEXT_FIELDS if row.knob.api})


class GenerationIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str = ""
    max_new_tokens: Int
    mode: str = "tokenswift"
    seed: Int = 0
    prompt_format: str = "continue"  # "continue" an opening, or follow an "instruction" (chat template)
    settings: SamplingIn = SamplingIn()
    session_id: Id | None = None
    continue_from: Id | None = None
    memory: str = ""  # pinned at the top of the model's context (a continuation keeps its parent's)
    authors_note: str = ""  # inserted a few hundred tokens before the end of the context
    world_info: dict[str, Any] | None = None  # text/world_info.py's document (a continuation keeps its parent's)


class ContextIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    memory: str
    authors_note: str
    world_info: dict[str, Any] | None = None  # absent: unchanged; null: none


def world_info_json(value: dict[str, Any] | None) -> str:
    """A World Info object as the store keeps it (JSON, '' for none), or a 422 naming the entry and field."""
    try:
        return WorldInfo.from_dict(value).to_json()
    except SettingsError as error:
        raise invalid(printable(error.field), printable(error.reason)) from None


def invalid(field: str, message: str, kind: str = "value_error", where: str = "body") -> HTTPException:
    loc = [where, *field.split(".")]
    return HTTPException(422, detail=[{"loc": loc, "msg": f"{field}: {message}", "type": kind}])


def wait_seconds(wait: str | None, since: int | None) -> float:
    """?wait= as seconds (0: answer at once), or a 422 naming it. Parsed here, not by FastAPI, so that every
    bad value (text, NaN, out of range) gets a message that starts with the field, like the body's."""
    if wait is None:
        return 0.0
    try:
        seconds = float(wait)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT_S:  # NaN fails this too
        raise invalid("wait", f"must be a number of seconds from 0 to {MAX_WAIT_S:g}, not {printable(wait)!r}",
                      where="query")
    if since is None and seconds:
        raise invalid("wait", "needs since=N: it waits for text past chunk N", where="query")
    return seconds


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a 422 in the API's shape (not FastAPI's 400 for JSON nested too deep)."""
    try:
        payload = json.loads(await request.body())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise invalid("body", "is not valid JSON") from None
    if not isinstance(payload, dict):
        raise invalid("body", "must be a JSON object")
    return payload


def parse_request(payload: dict[str, Any]) -> tuple[GenerationIn, DraftSettings]:
    try:
        request = GenerationIn.model_validate(payload)
    except ValidationError as error:
        detail = []
        for e in error.errors(include_url=False):
            loc = [printable(str(part)) if isinstance(part, str) else part for part in e["loc"]]
            field = ".".join(str(part) for part in loc) or "body"  # e.g. a key that is not Unicode
            detail.append({"loc": ["body", *loc], "msg": f"{field}: {printable(e['msg'])}", "type": e["type"]})
        raise HTTPException(422, detail=detail) from None
    for field in ("prompt", "mode"):
        if problem := unicode_problem(getattr(request, field)):
            raise invalid(field, problem)
    if problem := target_problem(request.max_new_tokens):
        raise invalid("max_new_tokens", problem)
    if request.continue_from is not None and (request.memory or request.authors_note):
        raise invalid("memory", "leave Memory and Author's Note out with continue_from (the parent's are kept; "
                                "edit them with PUT /api/generations/{id}/context)")
    if request.continue_from is not None and request.world_info is not None:
        raise invalid("world_info", "leave it out with continue_from (the parent's is kept; edit it with PUT "
                                    "/api/generations/{id}/context)")
    world_info_json(request.world_info)
    if request.continue_from is None and not request.prompt.strip():
        raise invalid("prompt", "must not be empty")
    if request.continue_from is not None and request.prompt:
        raise invalid("prompt", "must be empty with continue_from: the parent's text is the prompt")
    return request, to_settings(request)


def to_settings(request: GenerationIn) -> DraftSettings:
    """The request's settings: the text's (Settings) and, by the same flat names, the speed's (Speculation)."""
    chosen = request.settings.model_dump(exclude_unset=True)
    values = {**WRITING_DEFAULTS, **{k: v for k, v in chosen.items() if v is not None or k == "budget"}}
    values.update(max_new_tokens=request.max_new_tokens, mode=request.mode, seed=request.seed,
                  prompt_format=request.prompt_format)
    try:
        return DraftSettings.from_dict(values)
    except SettingsError as error:
        raise settings_invalid(error) from None


def settings_invalid(error: SettingsError) -> HTTPException:
    """A refusal as a 422 on the request's field: a draft's own (ui/drafts/drafts.DraftProblem: prompt, memory, ...)
    or a top-level setting by its name, any other setting under settings."""
    own = isinstance(error, DraftProblem) or error.field in TOP_LEVEL
    return invalid(error.field if own else f"settings.{error.field}", error.reason)


def found(read, gen_id: int):
    try:
        return read(gen_id)
    except NotFound as error:
        raise HTTPException(404, detail=str(error)) from None
