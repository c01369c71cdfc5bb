"""The ids of a writer's edit: the family's own ids for the start of the text the edit left as it was, then the rest.

An edit is a new draft whose text the worker tokenizes on its first run. Tokenized afresh, the text the model wrote
would be prefilled as a new prompt, in other windows and other rounding than the run that wrote it, so even an edit
that only cut the end off would go on otherwise than the draft itself. Kept as the model's own ids, with the edited
rest tokenized after them, the draft resumes that run: an edit that only cut the end writes on exactly as the draft
did, and any other writes on from the same state up to where the writer's change begins.
"""

from __future__ import annotations

from storage.records import EditBase
from tokenswift.text.detok import IncrementalDetokenizer


def kept_ids(lm, base: EditBase, text: str) -> tuple[list[int], int] | None:
    """(the ids of the edited `text`, where the family's written text starts in them), or None where the edit changed
    the text of the base's prompt (the draft is then tokenized afresh)."""
    if not text.startswith(base.prompt_text):
        return None
    edited = text[len(base.prompt_text):]
    detok = IncrementalDetokenizer(lm.tokenizer, base.prompt_ids)
    kept, spelled = 0, ""
    for i, token in enumerate(base.generated_ids):
        piece = detok.push([token])
        if not piece:  # a character still incomplete: its tokens are kept once it is whole and still the same
            continue
        if not edited.startswith(spelled + piece):
            break
        kept, spelled = i + 1, spelled + piece
    rest = edited[len(spelled):]
    rest_ids = lm.tokenizer(rest, add_special_tokens=False).input_ids if rest else []
    return base.prompt_ids + base.generated_ids[:kept] + list(rest_ids), base.written_from
