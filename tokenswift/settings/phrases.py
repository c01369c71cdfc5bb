"""What may be banned: the phrase list's limits, how phrases compare, and the starter list (the rule that acts on
them is tokenswift/sampling/banned.py). Here, below the sampler, because Settings checks the list it is given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_PHRASES = 500
PHRASE_CHARS = (2, 200)  # a phrase's length after stripping, in characters

# Stock phrases of machine-written fiction, offered to the writer as a start (the Write tab's ban box).
STARTER_BANS = (
    "shivers down her spine", "shivers down his spine", "sent shivers", "a testament to", "barely above a whisper",
    "in a world where", "tapestry of", "couldn't help but", "little did", "the air was thick with",
    "a mix of", "a mixture of", "a sense of", "it's not just", "palpable", "unbeknownst to",
    "eyes sparkling with", "with a mischievous glint", "a wave of", "heart pounding in", "in the grand scheme",
    "the weight of the world", "every fiber of", "a dance of", "the scent of", "the hum of",
    "maybe, just maybe", "stark contrast", "ministrations", "ever-changing", "the world around",
    "a symphony of", "the silence was deafening", "time seemed to", "for what felt like", "journey of",
)


def normal(text: str) -> str:
    """How phrases and text are compared: lower case, curly apostrophes as straight (length-preserving per
    character, so a token's share of the text keeps its length)."""
    return text.lower().replace("\u2019", "'").replace("\u2018", "'")


def phrase_problem(phrases: Sequence[str]) -> str | None:
    """Why these phrases cannot be banned (None: they can). Settings._check names the field."""
    if len(phrases) > MAX_PHRASES:
        return f"at most {MAX_PHRASES} phrases, got {len(phrases)}"
    low, high = PHRASE_CHARS
    for phrase in phrases:
        if not isinstance(phrase, str) or not low <= len(phrase.strip()) <= high:
            return f"each phrase has {low} to {high} characters, got {str(phrase)[:40]!r}"
        if not any(ch.isalnum() for ch in phrase):
            return f"a phrase needs a letter or digit (spaces and punctuation alone match everywhere): {phrase[:40]!r}"
    return None


def merged(phrases: Iterable[str]) -> tuple[str, ...]:
    """The phrases stripped, each once: a later one equal to an earlier one but for case is dropped."""
    seen, out = set(), []
    for phrase in phrases:
        text = str(phrase).strip()
        if normal(text) not in seen:
            seen.add(normal(text))
            out.append(text)
    return tuple(out)


def read_phrases(text: str) -> list[str]:
    """One phrase a line; blank lines and lines starting with '#' are skipped (a ban file, the Write tab's box)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
