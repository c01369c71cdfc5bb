"""The API's routes for alternatives and branches (what they mean: ui/drafts/branches.py; a branch starts through the
drafts service, ui/drafts/drafts.py):

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

from storage.errors import Conflict, Invalid
from tokenswift.settings import SettingsError
from ui.api.api_input import GenId, Int, found, invalid, json_object, settings_invalid
from ui.api.store_ops import ApiStore
from ui.drafts.branches import NoTokenizer, alternatives
from ui.drafts.drafts import DraftService
from ui.drafts.limits import printable
from ui.drafts.tokens import PromptTokens


class BranchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    position: Int
    token: Int
    max_new_tokens: Int | None = None  # default: what the original's target has left after the chosen token



def add_branch_routes(router: APIRouter, store: ApiStore, tokens: PromptTokens) -> None:
    drafts = DraftService(store, tokens)

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
        try:
            gen = found(lambda i: drafts.branch(i, request.position, request.token, request.max_new_tokens), gen_id)
        except SettingsError as error:
            raise settings_invalid(error) from None
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
