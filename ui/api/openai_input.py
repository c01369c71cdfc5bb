"""What the OpenAI-compatible endpoint (ui/api/openai_api.py) accepts: a body becomes the engine's Settings and the
prompt or the chat messages; a bad one becomes OpenAI's error shape, naming the field as the client sent it.

Names: OpenAI's, and those text-generation-webui and KoboldCpp accept for the samplers writers use (SAMPLERS).
Unset fields take the writing defaults (WRITING_DEFAULTS) but for the end of text: an OpenAI client expects the
model to be able to stop, so EOS is banned only when the request asks (ignore_eos, ban_eos_token). Unknown fields
are ignored, as OpenAI's servers do; a known field with a bad value is refused (400, the field in `param`) in the
engine's words, because Settings checks every value. What the engine cannot do (n > 1, logprobs, OpenAI's
frequency and presence penalties) is refused when asked for, not dropped in silence.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

from tokenswift.settings import INT64_MAX, TEXT_FIELDS, WRITING_DEFAULTS, Settings, SettingsError
from ui.drafts.limits import printable, target_problem, unicode_problem

OPENAI_PREFIX = "/v1"
NUMBER, INTEGER, FLAG, STRINGS, BREAKERS = "a number", "an integer", "true or false", "strings", "breakers"
SIGMA = "a number of standard deviations"  # top-nσ: llama.cpp's clients send -1 for off, ours is 0

# The table's JSON kinds, and the row's own way of reading a value (Knob.openai_kind), as this endpoint reads them.
KINDS = {"number": NUMBER, "integer": INTEGER, "boolean": FLAG, "strings": STRINGS, "breakers": BREAKERS,
         "sigma": SIGMA}
# Request name -> (Settings field, kind): the length, then the table's names (tokenswift/settings/table.py), two for
# a field where KoboldCpp and text-generation-webui differ.
SAMPLERS = {
    "max_tokens": ("max_new_tokens", INTEGER), "max_completion_tokens": ("max_new_tokens", INTEGER),
    **{name: (row.name, KINDS[row.knob.openai_kind or row.kind]) for row in TEXT_FIELDS for name in row.knob.openai},
}
# OpenAI fields for what the engine does not do: taken at their neutral values (clients send those), else refused.
NEUTRAL = {"n": (1,), "best_of": (1,), "echo": (False,), "suffix": ("",), "logprobs": (False, 0),
           "top_logprobs": (0,), "frequency_penalty": (0,), "presence_penalty": (0,), "logit_bias": ({},),
           "tools": ([],), "functions": ([],), "response_format": ({"type": "text"},)}
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 1024}  # OpenAI's for completions; Settings' own for chat
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad(field: str, message: str, code: str = "invalid_value") -> OpenAIError:
    """A 400 whose message starts with the field, as the app's other errors do."""
    field = printable(field)
    return OpenAIError(400, f"{field}: {message}", field, code)


@dataclass(frozen=True)
class Parsed:
    settings: Settings
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise OpenAIError(400, "the body is not valid JSON", None, "invalid_json") from None
    if not isinstance(payload, dict):
        raise OpenAIError(400, "the body must be a JSON object", None, "invalid_json")
    return payload


def parse_options(payload: dict[str, Any], kind: str) -> Parsed:
    """The sampling and streaming fields of a completion (kind "completion") or chat (kind "chat") request."""
    for name, neutral in NEUTRAL.items():
        if payload.get(name) is not None and payload[name] not in neutral:
            raise bad(name, f"only {json.dumps(neutral[0])} is supported here", "unsupported_value")
    values = {**WRITING_DEFAULTS, "ban_eos": False, "max_new_tokens": DEFAULT_MAX_TOKENS[kind],
              "seed": _seed(payload.get("seed"))}
    sent: dict[str, str] = {}  # Settings field -> the request's name for it, to name it in an error
    for name, (field, kind_of) in SAMPLERS.items():
        if payload.get(name) is None:
            continue
        value = _convert(name, payload[name], kind_of)
        if field in sent and values[field] != value:
            raise bad(name, f"disagrees with {sent[field]}; send one of them")
        values[field], sent[field] = value, name
    if problem := target_problem(values["max_new_tokens"]):  # the app's range, before Settings' 1..2**63-1
        raise bad(sent.get("max_new_tokens", "max_tokens"), problem)
    try:
        settings = Settings.from_dict(values)
    except SettingsError as error:
        raise bad(sent.get(error.field, error.field), error.reason) from None
    stream = payload.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("stream", "must be true or false")
    options = payload.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(usage := options.get("include_usage", False), bool):
        raise bad("stream_options", 'must be {"include_usage": true or false}')
    return Parsed(settings, stream, stream and usage)


def parse_prompt(payload: dict[str, Any]) -> str:
    """A completion's prompt: a string (or a list of one string, as some clients send it)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt", "must be a string (one prompt; token ids are not taken)")
    if not prompt.strip():
        raise bad("prompt", "must not be empty")
    if problem := unicode_problem(prompt):
        raise bad("prompt", problem)
    return prompt


def parse_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """A chat's messages as the chat template takes them: a role and text content each."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects")
    return [_message(i, message) for i, message in enumerate(messages)]


def _message(i: int, message: Any) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise bad(where, 'must be an object with "role" and "content"')
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)} (tools are not supported here)")
    if isinstance(content, list):  # content parts: text is taken, anything else refused
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise bad(f"{where}.content", "only text parts are supported here")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad(f"{where}.content", "must be a string or a list of text parts")
    if problem := unicode_problem(content):
        raise bad(f"{where}.content", problem)
    return {"role": ROLES[role], "content": content}


def _seed(value: Any) -> int:
    """Unset or -1 (KoboldCpp's and llama.cpp's "random"): a seed drawn here, kept with the draft so it can be
    written again."""
    if value is None or value == -1:
        return secrets.randbelow(2**32)
    return _convert("seed", value, INTEGER)


def _convert(name: str, value: Any, kind: str) -> Any:
    ok = {NUMBER: _number, SIGMA: _sigma, INTEGER: _integer, FLAG: lambda v: v if isinstance(v, bool) else None,
          STRINGS: _strings, BREAKERS: _breakers}[kind](value)
    if ok is None:
        what = "a list of strings" if kind in (STRINGS, BREAKERS) else kind
        raise bad(name, f"must be {what}")
    return ok


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sigma(value: Any) -> float | None:
    number = _number(value)
    return None if number is None else max(number, 0.0)


def _integer(value: Any) -> int | None:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)  # 40.0 from a client that sends every number as a float
    ok = isinstance(value, int) and not isinstance(value, bool) and -INT64_MAX - 1 <= value <= INT64_MAX
    return value if ok else None


def _strings(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) and all(isinstance(s, str) for s in value) else None


def _breakers(value: Any) -> tuple[str, ...] | None:
    """KoboldCpp sends a list; text-generation-webui a string of quoted strings ('"\\n", ":", "*"') or a JSON list."""
    if isinstance(value, str):
        try:
            value = json.loads(value if value.lstrip().startswith("[") else f"[{value}]")
        except (ValueError, RecursionError):
            return None
    return _strings(value) if isinstance(value, list) else None
