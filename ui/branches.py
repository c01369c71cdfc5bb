"""Alternatives and branches over the store's verbs (storage/branches.py), with token texts decoded by the model's
tokenizer (ui/tokens.py): what the API's routes and the Write tab's token view (ui/write_branches.py) share.

    GET  /api/generations/{id}/alternatives?position=N -> {"id", "position", "token", "text", "probability",
                                     "recorded", "alternatives": [{"token", "text", "probability"}, ...]}
    POST /api/generations/{id}/branch {"position", "token"[, "max_new_tokens"]} -> 201 {"id", "status",
                                     "parent_id", "session_id", "origin"}
    GET  /api/generations/{id}/branches -> {"id", "original", "branches": [{"id", "parent_id", "position",
                                     "status", "produced_tokens", "target_tokens"}, ...]} (the original first)

`position` is an index among the draft's generated tokens (the prompt and a writer's text have no alternatives). A
position past the end, or a token that was not an alternative there, is a 422 naming the field; the draft is left
as it was. Exports and deletes of a branch use the draft routes (DELETE refuses an original with branches: 409).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, ValidationError

from storage import Store
from storage.branches import TokenAt
from storage.errors import Conflict, Invalid
from storage.records import GenerationRecord
from tokenswift.text.detok import IncrementalDetokenizer
from ui.api_input import GenId, Int, found, invalid, json_object
from ui.limits import printable, target_problem
from ui.tokens import PromptTokens


class NoTokenizer(RuntimeError):
    """The draft's model's tokenizer cannot be loaded in this process."""


class BranchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    position: Int
    token: Int
    max_new_tokens: Int | None = None  # default: what the original's target has left after the chosen token


def text_after(tokenizer, context: list[int], ids: list[int]) -> str:
    """The text `ids` add after `context` (a character they leave incomplete comes out as decoded)."""
    detok = IncrementalDetokenizer(tokenizer, context)
    return detok.push(ids) + detok.flush()


def token_texts(tokenizer, context: list[int], ids: list[int]) -> list[str]:
    """Each token's text after the ones before it; a token that ends inside a character gets "" and the next one
    the whole character."""
    detok = IncrementalDetokenizer(tokenizer, context)
    return [detok.push([t]) for t in ids]


def decoded(tokens: PromptTokens, model: str | None, work):
    """work(tokenizer) with the draft's model's tokenizer, or NoTokenizer."""
    result = tokens.use(model, lambda tokenizer, _context: work(tokenizer)) if model else None
    if result is None:
        raise NoTokenizer(f"the tokenizer of {model or 'the draft’s model'} cannot be loaded here, so token texts "
                          "cannot be shown")
    return result


def alternatives(store: Store, tokens: PromptTokens, gen_id: int, position: int) -> dict:
    """The token at `position` with its alternatives, their texts and probabilities (Invalid, NotFound)."""
    at = store.token_at(gen_id, position)

    def texts(tokenizer) -> dict:
        context = at.context + at.lead
        view = {"id": gen_id, "position": position, "token": at.token,
                "text": text_after(tokenizer, context, [at.token]), "recorded": at.choices is not None,
                "probability": at.choices.probability if at.choices else None, "alternatives": []}
        if at.choices is not None:
            view["alternatives"] = [{"token": i, "text": text_after(tokenizer, context, [i]), "probability": p}
                                    for i, p in zip(at.choices.ids, at.choices.probs, strict=True) if i >= 0]
        return view

    return decoded(tokens, at.model, texts)


def start_branch(store: Store, tokens: PromptTokens, gen_id: int, position: int, token: int,
                 max_new_tokens: int | None = None) -> GenerationRecord:
    """A branch of `gen_id` taking `token` at `position` (storage.branches.BranchVerbs.branch)."""
    at: TokenAt = store.token_at(gen_id, position)

    def texts(tokenizer) -> tuple[str, str]:
        prefix = at.text_before + text_after(tokenizer, at.context, at.lead)
        return prefix, text_after(tokenizer, at.context + at.lead, [token])

    prefix, token_text = decoded(tokens, at.model, texts)
    return store.branch(gen_id, position, token, prefix, token_text, max_new_tokens)


def add_branch_routes(router: APIRouter, store: Store, tokens: PromptTokens) -> None:
    @router.get("/generations/{gen_id}/alternatives")
    def get_alternatives(gen_id: GenId, position: str | None = None) -> dict:
        at = parse_position(position)
        try:
            return found(lambda i: alternatives(store, tokens, i, at), gen_id)
        except Invalid as error:
            raise invalid(error.field, str(error).split(": ", 1)[1], where="query") from None
        except NoTokenizer as error:
            raise HTTPException(503, detail=str(error)) from None

    @router.post("/generations/{gen_id}/branch", status_code=201)
    def branch(gen_id: GenId, payload: Annotated[dict[str, Any], Depends(json_object)]) -> dict:
        try:
            request = BranchIn.model_validate(payload)
        except ValidationError as error:
            e = error.errors(include_url=False)[0]
            raise invalid(printable(".".join(str(p) for p in e["loc"]) or "body"), printable(e["msg"])) from None
        if request.max_new_tokens is not None and (problem := target_problem(request.max_new_tokens)):
            raise invalid("max_new_tokens", problem)
        try:
            gen = found(lambda i: start_branch(store, tokens, i, request.position, request.token,
                                               request.max_new_tokens), gen_id)
        except Invalid as error:
            raise invalid(error.field, str(error).split(": ", 1)[1]) from None
        except Conflict as error:
            raise HTTPException(409, detail=str(error)) from None
        except NoTokenizer as error:
            raise HTTPException(503, detail=str(error)) from None
        return {"id": gen.id, "status": gen.status, "parent_id": gen.parent_id, "session_id": gen.session_id,
                "origin": gen.origin}

    @router.get("/generations/{gen_id}/branches")
    def get_branches(gen_id: GenId) -> dict:
        family = found(store.branches, gen_id)
        return {"id": gen_id, "original": family[0].record.id, "branches": [
            {"id": b.record.id, "parent_id": b.record.parent_id, "position": b.position, "status": b.record.status,
             "produced_tokens": b.record.produced_tokens, "target_tokens": b.record.target_tokens}
            for b in family]}


def parse_position(position: str | None) -> int:
    """?position= as a token index, or a 422 naming it (every bad value with the API's words)."""
    try:
        value = int(position) if position is not None else -1
    except ValueError:
        value = -1
    if value < 0:
        raise invalid("position", f"must be a generated token's index (0, 1, ...), not {printable(str(position))!r}",
                      where="query")
    return value
