"""The Library tells a book's drafts apart (storage/overview.py, ui/library.py): each row has the draft's kind, its
whole length in words and tokens, and the first words that are its own (what it wrote, or an edit's change), not
the opening every draft of the book shares. The worker's side is played through the store's verbs."""

from __future__ import annotations

import json

import gradio as gr
from conftest import sqlite_db_url

from storage import open_store
from storage.alternatives import Choices
from storage.records import Owner, Progress
from tokenswift.settings import DraftSettings, Settings
from ui.library import library

db_url = sqlite_db_url
INSTRUCTION = "Write the opening chapter of a gothic novel set in a lighthouse."


def run(store, gen_id: int, pieces: list[tuple[list[int], str]], prompt_ids: list[int]) -> None:
    """Play the worker: claim `gen_id` and write `pieces` (ids, text), each with one alternative recorded."""
    owner = Owner.here("test-worker")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, prompt_ids, "stories", None)
    for i, (ids, text) in enumerate(pieces):
        recorded = [Choices(0.6, (t, t + 1), (0.6, 0.3)) for t in ids]
        store.append_progress(gen_id, owner, Progress(ids, text, 0.1, alternatives=recorded),
                              finish="done" if i == len(pieces) - 1 else None)


def a_book(store):
    """An instruction draft, its continuation, an edit of that, and a branch of the first: newest first."""
    settings = DraftSettings(Settings(max_new_tokens=6, seed=1, prompt_format="instruction"))
    first = store.enqueue_generation(INSTRUCTION, settings)
    book = first.session_id
    run(store, first.id, [([10, 11, 12], "The keeper climbed"), ([13, 14, 15], " the stair at dusk.")],
        list(range(40)))
    cont = store.continue_generation(first.id, DraftSettings(Settings(max_new_tokens=4, seed=1)))
    run(store, cont.id, [([20, 21, 22, 23], " Below, the sea broke")], store.get_tokens(cont.id).prompt_ids)
    edit = store.save_edit(cont.id, "The keeper climbed the stair at dusk. Below, the gulls cried")
    branch = store.branch(first.id, 2, 13, "The keeper", " crept")
    return book, first.id, cont.id, edit.id, branch.id


def test_each_draft_shows_its_kind_length_and_own_first_words(db_url):
    store = open_store(db_url)
    book, first, cont, edit, branch = a_book(store)
    by_id = {d.record.id: d for d in store.overview(book)}
    assert list(by_id) == [branch, edit, cont, first]
    assert [by_id[i].kind for i in (first, cont, edit, branch)] == ["new", "continuation", "edit", "branch"]
    # Words of the story (the instruction is not the draft's text); tokens of its prompt and what it wrote.
    assert (by_id[first].words, by_id[first].tokens) == (7, 46)
    assert (by_id[cont].words, by_id[cont].tokens) == (11, 50)  # its parent's text and its own, not 4 tokens
    assert (by_id[edit].words, by_id[edit].tokens) == (11, None)  # not tokenized until it runs
    assert by_id[first].own_words == "The keeper climbed the stair at dusk."
    assert by_id[cont].own_words == "…Below, the sea broke"
    assert by_id[edit].own_words == "…gulls cried"  # where the writer's change starts
    assert by_id[branch].own_words == "…crept"  # the word it took in place of the original's
    assert store.overview(book + 1) == []
    store.close()


def test_the_library_rows_say_it_in_words(db_url):
    store = open_store(db_url)
    book, first, cont, edit, branch = a_book(store)
    with gr.Blocks():
        p = library.build()
    out = library.listing(p, store, book, count=lambda record: 99, draft_id=cont)
    rows = {row[0]: row for row in out[p.drafts]}
    header = library.DRAFT_HEADERS
    row = dict(zip(header, rows[edit], strict=True))
    assert (row["Kind"], row["Words"], row["Tokens"], row["Target"]) == (f"edit of #{cont}", 11, 99, "–")
    assert row["Its own first words"] == "…gulls cried"
    assert dict(zip(header, rows[cont], strict=True))["Tokens"] == 50
    assert dict(zip(header, rows[branch], strict=True))["Kind"] == f"branch of #{first}"
    assert not any("Write the opening" in cell for r in rows.values() for cell in map(str, r))
    assert out[p.draft].value == cont  # the draft chosen stays chosen when the list refreshes
    labels = dict((v, k) for k, v in out[p.draft].choices)
    assert labels[edit] == f"#{edit} · edit of #{cont} · done · 11 words"
    assert json.loads(store.get_generation(edit).settings_json)["prompt_format"] == "instruction"
    store.close()
