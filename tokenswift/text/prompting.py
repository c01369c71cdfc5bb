"""How a writer's text becomes the prompt: an opening to continue, or an instruction to follow.

An opening is tokenised as it is and the model continues it. An instruction ("Write the first chapter of a
gothic novel set in a Cornish harbour town") goes through the tokenizer's own chat template as one user turn,
with the assistant's turn opened, so an instruction-tuned model answers it in its trained format. The story
the model writes is that open assistant turn: a continuation, or a writer's edit of the story, goes on inside
it (the instruction is never sent again, and the story never becomes a new chat message)."""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import TemplateError

from tokenswift.settings import PROMPT_FORMATS, SettingsError

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


def chat_frame(lm, instruction: str, memory: str = "", system: bool = False) -> ChatFrame:
    """The turns of an instruction draft: the Memory inside the system turn (in place of the template's
    default system prompt), then the instruction as the user's turn, then the assistant's turn opened. A
    template without a system turn (Gemma's, Mistral's refuse one) gets the Memory at the head of the user's.
    system: cut the turns for a system text even without a Memory (World Info goes there, after the Memory)."""
    tokenizer = lm.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise SettingsError("prompt_format", f"{lm.name} has no chat template, so it cannot follow instructions; "
                                             "give an opening to continue instead")
    user = {"role": "user", "content": instruction}
    try:
        prompt = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=True)
    except TemplateError as error:
        raise _uncut(lm, error) from None
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    closed = _render(lm, [user], opened=False)
    opener = _after(lm, closed, _render(lm, [user], opened=True))
    answered = _render(lm, [user, {"role": "assistant", "content": _MARK}], opened=False)
    if answered.count(_MARK) != 1:
        raise _uncut(lm, "the assistant's turn is not written once")
    close = answered[answered.index(_MARK) + len(_MARK):]
    if not memory and not system:
        before, after = closed, ""
    else:
        try:
            framed = tokenizer.apply_chat_template([{"role": "system", "content": _MARK}, user],
                                                   add_generation_prompt=False, tokenize=False)
        except TemplateError:  # no system turn: the Memory opens the instruction's turn
            framed = _render(lm, [{"role": "user", "content": f"{_MARK}\n\n{instruction}"}], opened=False)
        if framed.count(_MARK) != 1:
            raise SettingsError("memory", f"{lm.name}'s chat template does not write the Memory once in a turn of "
                                          "its own; leave the Memory empty, or give an opening to continue")
        before, after = framed.split(_MARK)
    return ChatFrame(tuple(prompt), *(tuple(_ids(tokenizer, part)) for part in (before, after, opener, close)))


def chat_turn(lm, role: str, content: str) -> list[int]:
    """One closed turn of `role` as the template writes it after an assistant's turn."""
    first = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
    answered = _render(lm, first, opened=False)
    turn = _render(lm, [*first, {"role": role, "content": content}], opened=False)
    return _ids(lm.tokenizer, _after(lm, answered, turn))


def _render(lm, messages: list[dict], opened: bool) -> str:
    try:
        return lm.tokenizer.apply_chat_template(messages, add_generation_prompt=opened, tokenize=False)
    except TemplateError as error:
        raise _uncut(lm, error) from None


def _after(lm, head: str, text: str) -> str:
    """What `text` adds after `head`: the turns are cut from renderings that must start with the shorter one."""
    if not text.startswith(head):
        raise _uncut(lm, "a longer conversation does not start with the shorter one")
    return text[len(head):]


def _uncut(lm, why) -> SettingsError:
    return SettingsError("prompt_format", f"{lm.name}'s chat template cannot be cut into turns ({why}), so it "
                                          "cannot follow instructions here; give an opening to continue instead")


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids) if text else []
