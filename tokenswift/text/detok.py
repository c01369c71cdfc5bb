"""Streaming detokenization without re-decoding the whole text for every new token.

Byte-level and sentencepiece tokenizers only produce correct text for a token in context (leading spaces,
multi-byte characters split across tokens), so we decode a short window of recent ids and emit what the
newest ids add to it, holding back an incomplete UTF-8 character (U+FFFD) until it is complete.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, context: list[int] | None = None):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context or [])[-4:]
        self.prefix = 0  # start of the window decoded as context
        self.read = len(self.ids)  # ids before this are already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, ids: list[int]) -> str:
        """Text added by `ids` (empty while a character is still incomplete)."""
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        # The ids emitted last become the context of the next decode; older ones are dropped.
        self.ids = self.ids[self.read:]
        self.prefix, self.read = 0, len(self.ids)
        return after[len(before):]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end), as decoded."""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        self.ids, self.prefix, self.read = self.ids[self.read:], 0, len(self.ids) - self.read
        return after[len(before):]
