"""How a writer's text becomes the prompt: an opening to continue, or an instruction to follow.

An opening is tokenised as it is and the model continues it. An instruction ("Write the first chapter of a
gothic novel set in a Cornish harbour town") goes through the tokenizer's own chat template as one user turn,
with the assistant's turn opened, so an instruction-tuned model answers it in its trained format."""

from __future__ import annotations

from .settings import PROMPT_FORMATS, SettingsError


def prompt_ids(lm, text: str, form: str = "continue") -> list[int]:
    if form not in PROMPT_FORMATS:
        raise SettingsError("prompt_format", f"must be one of {', '.join(PROMPT_FORMATS)}, got {form!r}")
    if form == "continue":
        return lm.encode(text)
    if not getattr(lm.tokenizer, "chat_template", None):
        raise SettingsError("prompt_format", f"{lm.name} has no chat template, so it cannot follow instructions; "
                                             "give an opening to continue instead")
    encoded = lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
