"""The drafts service (ui/drafts.py): the checks every front door shares, on a real store and a tokenizer that counts
words (the front doors' own words for them: test_api.py, test_ui_events.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import sqlite_db_url

from storage import open_store
from storage.records import Owner, Progress
from tokenswift.settings import DraftSettings, Settings, SettingsError
from ui.drafts.drafts import Context, DraftProblem, DraftService
from ui.drafts.limits import MAX_CONTEXT_TEXT

db_url = sqlite_db_url


class Words:
    """The app's tokenizer cache, on a model of 100 tokens' context whose tokens are words."""

    def __init__(self):
        self.counted: list[str] = []

    def measure(self, text: str):
        self.counted.append(text)
        return SimpleNamespace(tokens=len(text.split()), context=100)

    def target(self):
        return None


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.close()


@pytest.fixture
def words():
    return Words()


@pytest.fixture
def drafts(store, words):
    return DraftService(store, words)


def refusing(max_new_tokens: int) -> DraftSettings:
    return DraftSettings(Settings(max_new_tokens=max_new_tokens, context_shift=False))


def test_a_prompt_and_target_past_the_context_are_refused_before_anything_is_queued(drafts, store):
    with pytest.raises(SettingsError) as refused:
        drafts.start("one two three", refusing(98))
    assert refused.value.field == "max_new_tokens"
    assert refused.value.reason == ("prompt (3 tokens) + max_new_tokens (98) = 101 exceeds the model's context of 100 "
                                    "tokens (context shifting is off)")
    assert store.list_generations() == []
    assert drafts.start("one two three", refusing(97)).status == "queued"


def test_nothing_is_counted_while_the_context_shifts(drafts, words):
    assert drafts.start("one two three", DraftSettings(Settings(max_new_tokens=5000))).status == "queued"
    assert words.counted == []


def test_a_continuation_of_an_edit_that_never_ran_counts_the_writers_text(drafts, store, words):
    parent = drafts.start("Once upon a time", DraftSettings(Settings(max_new_tokens=2)))
    owner = Owner.here("test-worker")
    assert store.claim_next(owner).id == parent.id
    store.record_start(parent.id, owner, [1, 400, 401], "stories", None)
    store.append_progress(parent.id, owner, Progress([5, 6], " and a dragon", 0.5), finish="done")
    edit = drafts.edit(parent.id, "Once upon a time and a red dragon")  # 8 words, never tokenized
    with pytest.raises(SettingsError, match=r"prompt \(8 tokens\) \+ max_new_tokens \(93\) = 101 exceeds"):
        drafts.continue_from(edit.id, refusing(93))
    assert words.counted == ["Once upon a time and a red dragon"]
    assert drafts.continue_from(edit.id, refusing(92)).parent_id == edit.id


def test_the_drafts_own_fields_are_named(drafts, store):
    with pytest.raises(DraftProblem) as long_memory:
        drafts.start("one", DraftSettings(Settings(max_new_tokens=5)),
                     context=Context(memory="x" * (MAX_CONTEXT_TEXT + 1)))
    assert long_memory.value.field == "memory"
    with pytest.raises(DraftProblem) as empty:
        drafts.start("  ", DraftSettings(Settings(max_new_tokens=5)))
    assert (empty.value.field, empty.value.reason) == ("prompt", "must not be empty")
    assert store.list_generations() == []
