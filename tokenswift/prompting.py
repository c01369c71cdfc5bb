"""How a writer's text becomes the prompt: an opening to continue, or an instruction to follow.

An opening is tokenised as it is and the model continues it. An instruction ("Write the first chapter of a
gothic novel set in a Cornish harbour town") goes through the tokenizer's own chat template as one user turn,
with the assistant's turn opened, so an instruction-tuned model answers it in its trained format. The story
the model writes is that open assistant turn: a continuation, or a writer's edit of the story, goes on inside
it (the instruction is never sent again, and the story never becomes a new chat message)."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import PROMPT_FORMATS, SettingsError

# Stand-ins for message contents, located in the rendered template to cut it into its turn markers.
_MARK = "\x00tokenswift\x00"


@dataclass(frozen=True)
class ChatFrame:
    """A chat draft's turns around its story, as token ids (tokenised piece by piece, so each piece can be
    marked in the "what the model sees" view). The window starts with before + Memory + after + opener."""

    prompt: tuple[int, ...]  # the turns the stored prompt starts with: the instruction's, the assistant's opened
    before: tuple[int, ...]  # up to the Memory: the system turn's opening (all the turns when there is no Memory)
    after: tuple[int, ...]  # the system turn's end and the instruction's turn
    opener: tuple[int, ...]  # opens the assistant's turn
    close: tuple[int, ...]  # ends a turn


def prompt_ids(lm, text: str, form: str = "continue", story: str = "") -> list[int]:
    """text: the opening, or the instruction; story: an instruction draft's story so far (a writer's edit),
    which continues inside the assistant's turn."""
    if form not in PROMPT_FORMATS:
        raise SettingsError("prompt_format", f"must be one of {', '.join(PROMPT_FORMATS)}, got {form!r}")
    if form == "continue":
        return lm.encode(text + story)
    return list(chat_frame(lm, text).prompt) + _ids(lm.tokenizer, story)


def chat_frame(lm, instruction: str, memory: str = "") -> ChatFrame:
    """The turns of an instruction draft: the Memory inside the system turn (in place of the template's
    default system prompt), then the instruction as the user's turn, then the assistant's turn opened."""
    tokenizer = lm.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise SettingsError("prompt_format", f"{lm.name} has no chat template, so it cannot follow instructions; "
                                             "give an opening to continue instead")
    user = {"role": "user", "content": instruction}
    prompt = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    closed = _render(tokenizer, [user], opened=False)
    opener = _render(tokenizer, [user], opened=True)[len(closed):]
    answered = _render(tokenizer, [user, {"role": "assistant", "content": _MARK}], opened=False)
    close = answered[answered.index(_MARK) + len(_MARK):]
    if not memory:
        before, after = closed, ""
    else:
        framed = _render(tokenizer, [{"role": "system", "content": _MARK}, user], opened=False)
        before, after = framed.split(_MARK)
    return ChatFrame(tuple(prompt), *(tuple(_ids(tokenizer, part)) for part in (before, after, opener, close)))


def chat_turn(lm, role: str, content: str) -> list[int]:
    """One closed turn of `role` as the template writes it after an assistant's turn."""
    tokenizer, first = lm.tokenizer, [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
    answered = _render(tokenizer, first, opened=False)
    turn = _render(tokenizer, [*first, {"role": role, "content": content}], opened=False)
    return _ids(tokenizer, turn[len(answered):])


def _render(tokenizer, messages: list[dict], opened: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=opened, tokenize=False)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids) if text else []
