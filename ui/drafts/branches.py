"""Alternatives and branches over the store's verbs (storage/branches.py), with token texts decoded by the model's
tokenizer (ui/drafts/tokens.py): what the API's routes (ui/api/branch_api.py), the drafts service
(ui/drafts/drafts.py) and the Write tab's token view (ui/write/write_branches.py) share.
"""

from __future__ import annotations

from tokenswift.text.detok import IncrementalDetokenizer
from ui.drafts.store_ops import DraftsStore
from ui.drafts.tokens import PromptTokens


class NoTokenizer(RuntimeError):
    """The draft's model's tokenizer cannot be loaded in this process."""


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


def alternatives(store: DraftsStore, tokens: PromptTokens, gen_id: int, position: int) -> dict:
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
