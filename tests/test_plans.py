"""A book's plan: the store's verbs (SQLite and PostgreSQL), what the model sees when it writes a chapter
(ui/plan_drafts.py), and the book exported by chapters (EPUB contents, DOCX headings)."""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest

from bookexport import export_book
from storage import Conflict, NotFound, open_store
from storage.plans import Character
from storage.records import Owner, Progress
from tokenswift.settings import DraftSettings, Settings
from tokenswift.text.world_info import WorldInfo
from ui.drafts.plan_drafts import body, chapter_draft, closing, plan_book, words
from ui.drafts.plan_input import PlanProblem, check_chapter, check_characters


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.close()


def written(store, gen_id: int, text: str, finish: str = "done") -> None:
    """The (fake) worker writes `text` for draft gen_id and stops."""
    owner = Owner.here("w")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, [1, 2], "m", None)
    store.append_progress(gen_id, owner, Progress([3, 4, 5], text, 0.1), finish=finish)


def test_chapters_keep_their_order_through_adds_moves_and_removals(store):
    book = store.create_session("The Lighthouse")
    storm = store.add_chapter(book.id, "The Storm", ["Ann sees a ship", "the lamp fails"])
    diary = store.add_chapter(book.id, "The Diary")
    prologue = store.add_chapter(book.id, "Prologue", position=1)
    assert [(c.position, c.title) for c in store.plan(book.id).chapters] == [
        (1, "Prologue"), (2, "The Storm"), (3, "The Diary")]
    assert store.plan(book.id).chapters[1].beats == ("Ann sees a ship", "the lamp fails")
    store.move_chapter(prologue.id, 3)
    store.move_chapter(diary.id, 1)
    assert [c.title for c in store.plan(book.id).chapters] == ["The Diary", "The Storm", "Prologue"]
    store.edit_chapter(storm.id, title="The Gale")
    store.delete_chapter(diary.id)
    assert [(c.position, c.title) for c in store.plan(book.id).chapters] == [(1, "The Gale"), (2, "Prologue")]
    with pytest.raises(NotFound):
        store.edit_chapter(diary.id, title="gone")


def test_premise_and_characters_are_replaced_as_a_whole(store):
    book = store.create_session("The Lighthouse")
    store.set_premise(book.id, "A keeper finds a diary.")
    store.set_characters(book.id, [Character("Ann", "the keeper", ("keeper",)), Character("Tom", "a sailor")])
    store.set_characters(book.id, [Character("Tom", "a sailor, lost"), Character("Ann", "the keeper", ("keeper",))])
    plan = store.plan(book.id)
    assert plan.premise == "A keeper finds a diary."
    assert plan.characters == (Character("Tom", "a sailor, lost"), Character("Ann", "the keeper", ("keeper",)))
    with pytest.raises(NotFound):
        store.plan(book.id + 1)


def test_a_chapter_is_its_draft_and_follows_its_edits_and_continuations(store):
    book = store.create_session("The Lighthouse")
    chapter = store.add_chapter(book.id, "The Storm")
    gen = store.enqueue_generation("Write chapter 1.", DraftSettings(Settings(max_new_tokens=20)), session_id=book.id,
                                   chapter_id=chapter.id)
    assert gen.origin == "chapter"
    assert store.plan(book.id).chapters[0].status == "queued"
    with pytest.raises(Conflict, match="being written"):
        store.enqueue_generation("again", DraftSettings(Settings(max_new_tokens=20)), session_id=book.id,
                                 chapter_id=chapter.id)
    written(store, gen.id, " The wind rose.")
    assert store.plan(book.id).chapters[0].story == "Write chapter 1. The wind rose."  # an opening's whole text
    edit = store.save_edit(gen.id, "Write chapter 1. The wind rose at dusk.")
    assert store.plan(book.id).chapters[0].draft_id == edit.id
    more = store.continue_generation(edit.id, DraftSettings(Settings(max_new_tokens=5)))
    assert store.plan(book.id).chapters[0].draft_id == more.id
    assert [d.kind for d in store.overview(book.id)][-1] == "chapter"  # the Library tells it apart
    store.choose_chapter_draft(chapter.id, gen.id)  # back to the first draft
    assert store.plan(book.id).chapters[0].draft_id == gen.id
    other = store.create_session("Another book")
    stranger = store.enqueue_generation("x", DraftSettings(Settings(max_new_tokens=5)), session_id=other.id)
    with pytest.raises(NotFound):
        store.choose_chapter_draft(chapter.id, stranger.id)
    with pytest.raises(NotFound):  # a chapter is written in its own book
        store.enqueue_generation("x", DraftSettings(Settings(max_new_tokens=5)), session_id=other.id,
                                 chapter_id=chapter.id)


def test_deleting_a_draft_unwrites_its_chapter_and_deleting_the_book_its_plan(store):
    book = store.create_session("The Lighthouse")
    chapter = store.add_chapter(book.id, "The Storm")
    store.set_characters(book.id, [Character("Ann", "the keeper")])
    gen = store.enqueue_generation("x", DraftSettings(Settings(max_new_tokens=5)), session_id=book.id,
                                   chapter_id=chapter.id)
    store.request_cancel(gen.id)
    store.delete_generation(gen.id)
    assert store.plan(book.id).chapters[0].draft_id is None
    store.delete_session(book.id)
    with store.engine.connect() as c:
        assert c.exec_driver_sql("select count(*) from chapters").scalar() == 0
        assert c.exec_driver_sql("select count(*) from characters").scalar() == 0


def plan_of(store, previous_text: str = "") -> tuple:
    book = store.create_session("The Lighthouse")
    store.set_premise(book.id, "A keeper finds a drowned man's diary.")
    store.set_characters(book.id, [Character("Ann", "the keeper, forty, stubborn", ("keeper",)),
                                   Character("Tom", "the drowned sailor")])
    first = store.add_chapter(book.id, "Arrival", ["Ann takes the post"])
    second = store.add_chapter(book.id, "The Storm", ["Ann sees a ship", "the lamp fails"])
    if previous_text:
        instruct = DraftSettings(Settings(max_new_tokens=5, prompt_format="instruction"))
        gen = store.enqueue_generation("Write chapter 1.", instruct, session_id=book.id, chapter_id=first.id)
        written(store, gen.id, previous_text)
    return store.plan(book.id), second.id


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_instruction_chapter_sees_the_premise_its_beats_and_the_last_chapters_end(store):
    ending = " ".join(f"w{i}" for i in range(400)) + "\nThe door closed."
    plan, second = plan_of(store, "Chapter 1: Arrival\n" + ending)
    draft = chapter_draft(plan, plan.chapters[1], chat=True)
    assert draft.prompt_format == "instruction" and draft.authors_note == ""
    assert draft.prompt == ("Write chapter 2 of the novel, “The Storm”. What happens in it: Ann sees a ship; the lamp "
                            "fails. Write it as the novel's prose, going on from where chapter 1 ends.")
    premise, told = draft.memory.split("\n\nChapter 1, “Arrival”, ends:\n\n")
    assert premise == "You are writing a novel, “The Lighthouse”.\n\nPremise: A keeper finds a drowned man's diary."
    assert told.startswith("…w103 ") and told.endswith("w399\nThe door closed.")  # its last 300 words
    entries = WorldInfo.from_json(draft.world_info).entries
    assert [(e.keys, e.content, e.constant) for e in entries] == [
        (("Ann", "keeper"), "Ann: the keeper, forty, stubborn", True),  # named in the beats: in view at once
        (("Tom",), "Tom: the drowned sailor", False)]  # in view once the story names him
    first = chapter_draft(plan, plan.chapters[0], chat=True)
    assert "ends:" not in first.memory and first.prompt.startswith("Write chapter 1 of the novel, “Arrival”.")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_model_without_a_chat_template_continues_the_chapters_heading(store):
    plan, _ = plan_of(store, "The sea was calm.")
    draft = chapter_draft(plan, plan.chapters[1], chat=False)
    assert (draft.prompt, draft.prompt_format) == ("Chapter 2: The Storm\n\n", "continue")
    assert draft.memory == "A keeper finds a drowned man's diary.\n\nThe sea was calm."
    assert draft.authors_note == "This chapter: Ann sees a ship; the lamp fails"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_book_exports_its_chapters_under_their_titles(store):
    plan, second = plan_of(store, "**Chapter 1: Arrival**\nAnn came on the ferry.\nShe climbed the tower.")
    gen = store.enqueue_generation("Chapter 2: The Storm\n\n", DraftSettings(Settings(max_new_tokens=5)),
                                   session_id=plan.book.id, chapter_id=second)
    written(store, gen.id, "The wind rose. The lamp went out.")
    plan = store.plan(plan.book.id)
    assert [body(c) for c in plan.chapters] == ["Ann came on the ferry.\nShe climbed the tower.",
                                                "The wind rose. The lamp went out."]  # no heading twice
    assert [words(c) for c in plan.chapters] == [9, 7]
    book = plan_book(plan, "The Lighthouse", "Ann Author")
    epub, _, name = export_book(book, "epub")
    assert name == "the-lighthouse.epub"
    with zipfile.ZipFile(io.BytesIO(epub)) as archive:
        nav = archive.read("OEBPS/nav.xhtml").decode()
        second_file = archive.read("OEBPS/chapter-002.xhtml").decode()
    assert re.findall(r"<a href=\"[^\"]+\">([^<]+)</a>", nav) == ["Chapter 1: Arrival", "Chapter 2: The Storm"]
    assert "<h2>Chapter 2: The Storm</h2>" in second_file and "The wind rose." in second_file
    import docx

    document = docx.Document(io.BytesIO(export_book(book, "docx")[0]))
    headings = [p.text for p in document.paragraphs if p.style.name == "Heading 1"]
    assert headings == ["Chapter 1: Arrival", "Chapter 2: The Storm"]
    assert [p.text for p in document.paragraphs if p.style.name == "Normal"][-2:] == [
        "She climbed the tower.", "The wind rose. The lamp went out."]


def test_closing_words_keep_their_line_breaks():
    assert closing("One two.\n\nThree four five.", 3) == "…Three four five."
    assert closing("  Short.  ", 3) == "Short."


def test_plan_input_names_the_field():
    with pytest.raises(PlanProblem) as bad:
        check_characters([Character("Ann", "x"), Character("Tom", "y", ("the (sailor)",))])
    assert bad.value.field == "characters[1].keys"
    with pytest.raises(PlanProblem) as bad:
        check_characters([Character(" ", "x")])
    assert bad.value.field == "characters[0].name"
    assert check_chapter(" The Storm ", ["a", " ", "b "]) == ("The Storm", ("a", "b"))
    with pytest.raises(PlanProblem) as bad:
        check_chapter("", [])
    assert bad.value.field == "title"
    assert json.loads(json.dumps(check_characters([Character("Ann", " x ", (" keeper ", ""))])[0].keys)) == ["keeper"]
