"""World Info (a lorebook, as KoboldCpp, NovelAI and SillyTavern have it): entries whose text goes into the
model's window while one of their keys appears in the latest story text, or always when marked constant.

A document, as the app imports and exports it and the CLI reads it (`--world-info FILE.json`):

    {"depth": 1024, "entries": [{"keys": ["Lily"], "secondary_keys": [], "content": "Lily is Tom's sister.",
                                 "constant": false, "enabled": true}, ...]}

An entry is *triggered* when one of its keys occurs, case-insensitively and as a whole word or phrase, in the
story's last `depth` tokens (decoded); with secondary keys it also needs one of those. Keys are plain words:
anything that reads as a regular expression is refused, so a key means what it says.

Where the entries sit and when they change is the window plan's business (context_window.py): after the Memory
at the top of the window, inside a budget of at most a quarter of the window (`reserve`). Exactness needs the
window that predicts story token t to be a pure function of t, the ids and the draft's texts, so the active
entries are not read at every token: they are read at *checkpoints*, every CHECKPOINT story tokens from the
prompt's end, and at every context shift. A checkpoint whose entries differ from the window's rebuilds the window
there with the new entries (keeping the story the last shift kept), as a shift does; TokenSwift never predicts
past a checkpoint in one iteration, as it never predicts past a shift. An entry so enters the window within
CHECKPOINT tokens of its key being written, and leaves it within CHECKPOINT tokens of the key's last mention
falling out of the search depth. A document whose entries are all constant has no checkpoints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenswift.settings import SettingsError, lone_surrogate

CHECKPOINT = 64  # story tokens between two readings of the active entries
MAX_ENTRIES = 256
MAX_KEY_CHARS = 100
MAX_CONTENT_CHARS = 2000
DEFAULT_DEPTH = 1024
MAX_DEPTH = 100_000
BUDGET_SHARE = 4  # World Info takes at most a quarter of the window
# Characters that make a key read as a regular expression (a plain name or phrase has none of them).
REGEX_CHARS = set("\\^$*+?()[]{}|")
ENTRY_FIELDS = {"keys", "secondary_keys", "content", "constant", "enabled"}


@dataclass(frozen=True)
class Entry:
    keys: tuple[str, ...]  # one of them must occur in the searched text (none: only a constant entry)
    content: str  # what goes into the window
    secondary_keys: tuple[str, ...] = ()  # when given, one of them must occur too
    constant: bool = False  # always in the window (while enabled)
    enabled: bool = True
    _patterns: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "secondary_keys", tuple(self.secondary_keys))
        object.__setattr__(self, "_patterns", (_pattern(self.keys), _pattern(self.secondary_keys)))

    def triggered(self, text: str) -> bool:
        primary, secondary = self._patterns
        return (primary is not None and primary.search(text) is not None
                and (secondary is None or secondary.search(text) is not None))

    def to_dict(self) -> dict:
        return {"keys": list(self.keys), "secondary_keys": list(self.secondary_keys), "content": self.content,
                "constant": self.constant, "enabled": self.enabled}


@dataclass(frozen=True)
class WorldInfo:
    entries: tuple[Entry, ...] = ()
    depth: int = DEFAULT_DEPTH  # search depth: the story's last `depth` tokens are searched for keys

    @property
    def dynamic(self) -> bool:
        """Whether the active entries can change with the text (an enabled entry that is not constant)."""
        return any(e.enabled and not e.constant for e in self.entries)

    def candidates(self, text: str) -> list[int]:
        """Indices of the enabled entries that want in, constant ones first, then by their order in the list:
        the order in which they take the budget."""
        constant = [i for i, e in enumerate(self.entries) if e.enabled and e.constant]
        triggered = [i for i, e in enumerate(self.entries) if e.enabled and not e.constant and e.triggered(text)]
        return constant + triggered

    def to_dict(self) -> dict:
        return {"depth": self.depth, "entries": [e.to_dict() for e in self.entries]}

    def to_json(self) -> str:
        """The stored and exported form ("" for no entries, as a draft without World Info stores it)."""
        return json.dumps(self.to_dict(), ensure_ascii=False) if self.entries else ""

    @classmethod
    def from_json(cls, text: str | None) -> WorldInfo:
        """A document from its JSON text (empty: no World Info)."""
        if not text or not text.strip():
            return cls()
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise SettingsError("world_info", f"is not valid JSON ({error.msg} at line {error.lineno}, "
                                              f"column {error.colno})") from None
        return cls.from_dict(value)

    @classmethod
    def from_dict(cls, value) -> WorldInfo:
        """A document from its parsed JSON; SettingsError names the field ("world_info.entries[3].keys")."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise SettingsError("world_info", 'must be an object like {"depth": 1024, "entries": [...]}')
        unknown = sorted(set(value) - {"depth", "entries"})
        if unknown:
            raise SettingsError(f"world_info.{unknown[0]}", "unknown field (a document has depth and entries)")
        depth = value.get("depth", DEFAULT_DEPTH)
        if not _integer(depth) or not 1 <= depth <= MAX_DEPTH:
            raise SettingsError("world_info.depth", f"must be a whole number of tokens in 1..{MAX_DEPTH}")
        entries = value.get("entries", [])
        if not isinstance(entries, list):
            raise SettingsError("world_info.entries", "must be a list of entries")
        if len(entries) > MAX_ENTRIES:
            raise SettingsError("world_info.entries", f"has {len(entries)} entries; at most {MAX_ENTRIES} are allowed")
        return cls(tuple(_entry(item, f"world_info.entries[{i}]") for i, item in enumerate(entries)), depth)


@dataclass(frozen=True)
class WorldIds:
    """A document as the window places it: each entry's text as token ids (in its place after the Memory), and
    the tokenizer's decode, which turns the searched story tokens into the text that keys are found in."""

    info: WorldInfo
    contents: tuple[tuple[int, ...], ...]  # one per entry, disabled ones included (indices match info.entries)
    decode: Callable[[Sequence[int]], str] = field(compare=False, repr=False)

    def reserve(self, window: int) -> int:
        """Window tokens kept for World Info: all enabled entries, at most a quarter of the window."""
        total = sum(len(c) for c, e in zip(self.contents, self.info.entries, strict=True) if e.enabled)
        return min(total, window // BUDGET_SHARE)

    def chosen(self, story: Sequence[int], budget: int) -> tuple[int, ...]:
        """The entries in the window after `story` (the searched tokens), in list order: the candidates in their
        order (constant first) while they fit the budget; one that would overflow it is left out, and the
        ones after it are still tried."""
        text = self.decode(list(story)) if story and self.info.dynamic else ""
        taken, used = [], 0
        for i in self.info.candidates(text):
            if used + len(self.contents[i]) <= budget:
                taken.append(i)
                used += len(self.contents[i])
        return tuple(sorted(taken))


def world_ids(lm, info: WorldInfo, chat: bool) -> WorldIds | None:
    """Tokenize a document's entries (no special tokens: they sit inside the window), one line each: after an
    opening's Memory (which ends in a newline) each entry ends in one; in a chat draft's system turn each starts
    with one. None when no entry is enabled: the window is then as without World Info."""
    if not any(e.enabled for e in info.entries):
        return None

    def encode(text: str) -> tuple[int, ...]:
        return tuple(lm.tokenizer(text, add_special_tokens=False).input_ids)

    contents = tuple(encode(f"\n{e.content.strip()}" if chat else f"{e.content.strip()}\n") for e in info.entries)
    return WorldIds(info, contents, lm.tokenizer.decode)


def _entry(value, name: str) -> Entry:
    if not isinstance(value, dict):
        raise SettingsError(name, 'must be an object like {"keys": ["Lily"], "content": "Lily is ..."}')
    unknown = sorted(set(value) - ENTRY_FIELDS)
    if unknown:
        raise SettingsError(f"{name}.{unknown[0]}", f"unknown field (an entry has {', '.join(sorted(ENTRY_FIELDS))})")
    flags = {}
    for flag, default in (("constant", False), ("enabled", True)):
        flags[flag] = value.get(flag, default)
        if not isinstance(flags[flag], bool):
            raise SettingsError(f"{name}.{flag}", "must be true or false")
    keys = _keys(value.get("keys", []), f"{name}.keys")
    secondary = _keys(value.get("secondary_keys", []), f"{name}.secondary_keys")
    if not keys and not flags["constant"]:
        raise SettingsError(f"{name}.keys", "needs at least one key (or mark the entry constant)")
    content = value.get("content")
    if not isinstance(content, str) or not 1 <= len(content.strip()) <= MAX_CONTENT_CHARS:
        raise SettingsError(f"{name}.content", f"must be text of 1 to {MAX_CONTENT_CHARS} characters")
    _unicode(content, f"{name}.content")
    return Entry(keys, content.strip(), secondary, **flags)


def _keys(value, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise SettingsError(name, 'must be a list of words or phrases, like ["Lily", "the old mill"]')
    keys = tuple(" ".join(k.split()) for k in value)
    for key in keys:
        if not 1 <= len(key) <= MAX_KEY_CHARS:
            raise SettingsError(name, f"each key must be 1 to {MAX_KEY_CHARS} characters")
        _unicode(key, name)
        if REGEX_CHARS & set(key) or (len(key) > 1 and key.startswith("/") and key.endswith("/")):
            raise SettingsError(name, f"{key!r}: keys are plain words or phrases, matched as written (ignoring "
                                      "case), not patterns; leave out / \\ * + ? ( ) [ ] { } | ^ $")
    return keys


def _unicode(text: str, name: str) -> None:
    """JSON's \\ud800 escapes can carry a lone surrogate, which can be neither tokenized nor stored."""
    if (at := lone_surrogate(text)) is not None:
        raise SettingsError(name, f"is not valid Unicode (a lone surrogate at character {at})")


def _pattern(keys: tuple[str, ...]) -> re.Pattern | None:
    """Any of the keys as a whole word or phrase, ignoring case and how the words are spaced."""
    if not keys:
        return None
    words = (r"\s+".join(re.escape(w) for w in key.split()) for key in keys)
    return re.compile(r"(?<!\w)(?:" + "|".join(words) + r")(?!\w)", re.IGNORECASE)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
