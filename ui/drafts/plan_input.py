"""What a plan may hold (storage/plans.py), checked the same way for the REST API (ui/api/plan_api.py, whose request
bodies build on these) and the Plan tab (ui/plan/plan.py): each problem names its field ("characters[2].keys: ...")
as the API's 422s do."""

from __future__ import annotations

from collections.abc import Sequence

from storage.plans import Character
from tokenswift.settings import SettingsError
from tokenswift.text.world_info import MAX_CONTENT_CHARS, MAX_ENTRIES, WorldInfo
from ui.drafts.limits import unicode_problem

MAX_PREMISE = 10_000  # characters: the premise is a chapter's Memory, beside the previous chapter's closing words
MAX_TITLE = 500  # the store's column
MAX_NAME = 200
MAX_BEATS = 50
MAX_BEAT = 1_000


class PlanProblem(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def check_text(field: str, text: str, limit: int, *, required: bool = False) -> str:
    """`text` stripped, or PlanProblem."""
    if problem := unicode_problem(text):
        raise PlanProblem(field, problem)
    if len(text) > limit:
        raise PlanProblem(field, f"at most {limit:,} characters, got {len(text):,}")
    if required and not text.strip():
        raise PlanProblem(field, "must not be empty")
    return text.strip()


def check_chapter(title: str | None, beats: Sequence[str] | None) -> tuple[str | None, tuple[str, ...] | None]:
    """A chapter's title and beats as stored (stripped; empty beats dropped); None stays None."""
    if title is not None:
        title = check_text("title", title, MAX_TITLE, required=True)
    if beats is not None:
        if len(beats) > MAX_BEATS:
            raise PlanProblem("beats", f"at most {MAX_BEATS} beats, got {len(beats)}")
        beats = tuple(b for n, beat in enumerate(beats) if (b := check_text(f"beats[{n}]", beat, MAX_BEAT)))
    return title, beats


def check_characters(characters: Sequence[Character]) -> tuple[Character, ...]:
    """The characters as stored (stripped), each a valid World Info entry (its keys plain words), or PlanProblem."""
    if len(characters) > MAX_ENTRIES:
        raise PlanProblem("characters", f"at most {MAX_ENTRIES} characters, got {len(characters)}")
    out = []
    for n, c in enumerate(characters):
        name = check_text(f"characters[{n}].name", c.name, MAX_NAME, required=True)
        description = check_text(f"characters[{n}].description", c.description, MAX_CONTENT_CHARS - MAX_NAME - 2)
        keys = tuple(k for i, key in enumerate(c.keys) if (k := check_text(f"characters[{n}].keys[{i}]", key, 100)))
        try:
            WorldInfo.from_dict({"entries": [{"keys": [name, *keys], "content": description or name}]})
        except SettingsError as error:  # a key that reads as a regular expression, say
            raise PlanProblem(error.field.replace("world_info.entries[0]", f"characters[{n}]"), error.reason) from None
        out.append(Character(name, description, keys))
    return tuple(out)
