"""Banned phrases (anti-slop, as KoboldCpp's banned strings and the antislop sampler), exactly lossless.

The rule
--------
Matching is on the text, case-insensitive (curly apostrophes read as straight ones), across token boundaries, as
plain substrings. When the text completes a banned phrase, the story rewinds to the token where the phrase began
(at story index k) and that token is forbidden at index k: a ban keyed by absolute story index, which the one
Sampler applies before sampling there (sampler.py), in every mode and at every verify-trie node at that
position. Decoding then goes on from k. A rewind to k drops the bans at indices after k (they were about text
that is gone); bans at k accumulate. A position takes at most MAX_BANS_AT bans: a phrase completing once that
many tokens are banned where it begins stays in the text (with a few hundred tokens to choose from, it never
happens in practice). Phrases are only looked for in the generated text: one that begins in the prompt is left
alone.

The mechanism is the simplest exact one: on a rewind the engine is started again from ids[:k] with the ban, a
fresh prefill, exactly as a resume starts. AR and TokenSwift rewind at the same tokens, so both write the same ids.

Nothing shown is taken back
---------------------------
BannedEngine (decode/banned_engine.py) holds back the tail of the text that could still become a banned phrase and
passes on only what no later rewind can touch. A phrase that completes later begins at a character c of the text now
only if the text from c to the end is a prefix of it, or the text from c up to a token that a later rewind returns
to is (the text after that token is then written anew). A rewind returns to the token where such a phrase begins, so
the tokens a rewind can return to are worked out from the last one back (`PhraseWatch.keep`), and everything before
the first of them is shown. Looking at the rewind points, not only at the end, matters: after a rewind the text goes
on differently and may complete a phrase that begins earlier and was no prefix of the text before. Emitted tokens
are therefore final.

Resume is exact
---------------
The run's state is its ids and its bans; bans only ever act at the index where they were made, and a rewind
drops those after it. Take a resume from any prefix ids[:e] of the finished text, and the last moment the
uninterrupted run reached length e. From then on it never went below e (or it would have had to reach e again),
so no ban at an index >= e existed then (a rewind below e would have dropped it; one at e would need a later
rewind to e) and none before e mattered any more: its state was (ids[:e], no bans that can act), which is
exactly the resumed run's. Both then make the same tokens, rewinds and bans: the held tail is regenerated and
re-finds the same bans (a rewind's rebuilt cache holds the values the steps computed: model/prefill.py), except
after a position ran out of bans (MAX_BANS_AT), where the phrase let through is shown at once.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from tokenswift.settings.phrases import normal
from tokenswift.text.detok import IncrementalDetokenizer

MAX_BANS_AT = 32  # bans one position takes; then the phrase that begins there stays (never seen in practice)


class PhraseWatch:
    """The text of the tokens not yet shown, one piece per token, checked against the phrases."""

    def __init__(self, phrases: Iterable[str], tokenizer, context: Sequence[int]):
        self.phrases = sorted({normal(p.strip()) for p in phrases})
        self.tokenizer = tokenizer
        self.pieces: list[str] = []  # each watched token's text, as compared (`normal`)
        self.text = ""
        # The ids before the watched tokens are the detokenizer's context: a token's text depends on its neighbours.
        self.detok = IncrementalDetokenizer(tokenizer, list(context))

    def push(self, token: int) -> int | None:
        """Add a token; returns the index (among the watched tokens) where a phrase it completes begins."""
        end = len(self.text)
        piece = normal(self.detok.push([token]))
        self.pieces.append(piece)
        self.text += piece
        if not piece:
            return None
        # A phrase completed now ends inside the new piece; anything earlier was caught when it completed.
        begins = [i for p in self.phrases if (i := self.text.find(p, max(0, end - len(p) + 1))) >= 0]
        return self._token_at(min(begins)) if begins else None

    def keep(self) -> int:
        """Index of the first watched token that must stay held (module docstring). A character can begin a phrase
        later if the text from it to the end is a prefix of one (the phrase may go on), or the text from it up to
        a later token that a rewind can return to is (after that rewind anything may follow); a token a rewind can
        return to is one holding such a character. Worked out from the last token back."""
        starts = [0]
        for piece in self.pieces:
            starts.append(starts[-1] + len(piece))
        first, returns = len(self.pieces), []  # the starts of later tokens a rewind can return to
        for t in reversed(range(len(self.pieces))):
            if any(self._is_prefix(self.text[c:]) or any(self._is_prefix(self.text[c:b]) for b in returns)
                   for c in range(starts[t], starts[t + 1])):
                first = t
                returns.append(starts[t])
        return self._token_at(starts[first])

    def drop(self, n: int) -> None:
        """Forget the first n watched tokens (they are shown)."""
        self.text = self.text[sum(len(p) for p in self.pieces[:n]):]
        self.pieces = self.pieces[n:]

    def cut(self, n: int, context: Sequence[int]) -> None:
        """Keep the first n watched tokens (a rewind); context: the story's ids up to there."""
        self.pieces = self.pieces[:n]
        self.text = "".join(self.pieces)
        self.detok = IncrementalDetokenizer(self.tokenizer, list(context))

    def _is_prefix(self, s: str) -> bool:
        i = bisect.bisect_left(self.phrases, s)
        return i < len(self.phrases) and self.phrases[i].startswith(s)

    def _token_at(self, c: int) -> int:
        """The token that holds character c (len(pieces) past the end), moved back over tokens with no text of
        their own: those hold the first bytes of c's character."""
        start, k = 0, len(self.pieces)
        for i, piece in enumerate(self.pieces):
            if c < start + len(piece):
                k = i
                break
            start += len(piece)
        while k > 0 and not self.pieces[k - 1]:
            k -= 1
        return k
