"""An instruction draft's story, as the writer gets it everywhere: its exports are the whole story (every run and
edit, never the instruction, its single line breaks paragraphs in every format), the Write tab's live and
whole-text views show the story (the instruction apart), the API says its edit takes the story alone, and the CLI
keeps the instruction's chat turns through context shifts (plain decoding == TokenSwift, stories260k given
SmolLM2's ChatML template)."""

from __future__ import annotations

import io
import json
import re
import shutil
import zipfile
from types import SimpleNamespace

import docx
import pytest
from fastapi.testclient import TestClient
from test_instruction_drafts import CHATML, INSTRUCTION, MEMORY

from bookexport import FORMATS, export_book
from storage import open_store
from storage.records import Owner, Progress
from tokenswift.cli import main as cli
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model.loading import load_model
from tokenswift.settings import DraftSettings, Settings, SettingsError
from tokenswift.text.context_window import WindowPlan, draft_context, pinned_ids
from tokenswift.text.prompting import chat_frame, prompt_ids
from ui.api.api import create_app
from ui.display.live import Watch, whole_text
from ui.drafts.exports import draft_book

FIRST = "\nMax ran to the park.\nHe was happy."
MORE = " Lily came with a ball.\nThey played all day."
EDITED = "Max ran to the big park.\nHe was happy.\nLily came with a ball.\nThey played all day."
INSTRUCT = DraftSettings(Settings(prompt_format="instruction", max_new_tokens=40))


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    yield s
    s.close()


def written(store, gen_id: int, text: str) -> None:
    """Play the worker: claim the job and store `text` as its output."""
    owner = Owner.here("test-worker")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, [1, 400, 401], "stories", None)
    store.append_progress(gen_id, owner, Progress([5, 6], text, 0.5), finish="done")


def drafts(store) -> dict[str, int]:
    """An instruction draft's first run, its continuation and a writer's edit of the whole story."""
    first = store.enqueue_generation(INSTRUCTION, INSTRUCT)
    written(store, first.id, FIRST)
    continued = store.continue_generation(first.id, INSTRUCT)
    written(store, continued.id, MORE)
    edit = store.save_edit(continued.id, EDITED)
    return {"first": first.id, "continued": continued.id, "edit": edit.id}


def book_paragraphs(data: bytes, fmt: str) -> list[str]:
    """The exported book's paragraphs, the title heading included."""
    if fmt == "docx":
        return [p.text for p in docx.Document(io.BytesIO(data)).paragraphs if p.text.strip()]
    if fmt == "epub":
        pages = zipfile.ZipFile(io.BytesIO(data))
        html = "".join(pages.read(n).decode() for n in sorted(pages.namelist()) if n.endswith(".xhtml"))
        return [p.split("</p>")[0] for p in html.split("<p>")[1:]]
    return [p.strip() for p in data.decode().split("\n\n") if p.strip()]


def test_an_instruction_drafts_book_is_its_whole_story_in_every_format(store):
    """A book exported only its last run's text: an edit's was empty, a continuation's only its new part."""
    ids = drafts(store)
    stories = {"first": FIRST, "continued": FIRST + MORE, "edit": EDITED}
    for name, gen_id in ids.items():
        gen = store.get_generation(gen_id)
        book = draft_book(gen, store.get_session(gen.session_id), "Max", "", store.instruction(gen_id))
        lines = stories[name].strip().split("\n")
        for fmt in FORMATS:
            data, _, _ = export_book(book, fmt)
            assert INSTRUCTION not in data.decode("utf-8", "replace"), (name, fmt)
            assert book_paragraphs(data, fmt)[-len(lines):] == lines, (name, fmt)


def test_an_opening_draft_still_exports_its_opening(store):
    gen = store.enqueue_generation("Once upon a time", DraftSettings(Settings(max_new_tokens=40)))
    written(store, gen.id, " there was a dog.")
    gen = store.get_generation(gen.id)
    book = draft_book(gen, store.get_session(gen.session_id), "Dog", "", store.instruction(gen.id))
    assert book.text == "Once upon a time there was a dog." and book.wrapped


def test_the_write_tab_shows_the_story_and_the_instruction_apart(store):
    """The live and whole-text views showed the instruction glued to the story's first words."""
    from ui.write.write_view import whole

    ids = drafts(store)
    for gen_id, story in ((ids["continued"], FIRST + MORE), (ids["edit"], EDITED)):
        assert Watch.open(store, gen_id).tail == story
        assert whole_text(store, gen_id) == story  # what the editor opens on
        view = whole(store, gen_id, reflow=True)
        instruction, body = view.split('<div class="ts-whole">')
        assert f"Instruction (not part of the story): {INSTRUCTION}" in instruction
        assert INSTRUCTION not in body and "Max ran to the" in body
        # Its lines are not joined (not reflowed): the edit's "happy.\nLily" stays apart, not "happy. Lily".
        assert story.strip() in re.sub(r"<[^>]+>", "", body)
    opening = store.enqueue_generation("Once upon a time", DraftSettings(Settings(max_new_tokens=40)))
    assert Watch.open(store, opening.id).tail == "Once upon a time"


def test_the_api_says_an_instruction_drafts_edit_takes_its_story(store):
    client = TestClient(create_app(store))
    gen_id = drafts(store)["first"]
    bad = client.post(f"/api/generations/{gen_id}/edit", json={"txt": "x"})
    assert bad.status_code == 422 and "instruction draft: its story" in bad.json()["detail"][0]["msg"]
    doc = client.get("/api/openapi.json").json()["paths"]["/api/generations/{gen_id}/edit"]["post"]["description"]
    assert "instruction draft, its whole story alone" in doc
    story = "Max sat down by the sea."
    edit = client.post(f"/api/generations/{gen_id}/edit", json={"text": story})
    assert edit.status_code == 201 and store.get_generation(edit.json()["id"]).prompt_text == INSTRUCTION + story



def test_the_api_refuses_an_edit_that_sends_the_instruction_again(store):
    """A client sending instruction + story, as the edit took before, got the instruction copied into the story."""
    client = TestClient(create_app(store))
    gen_id = drafts(store)["first"]
    before = len(store.list_generations())
    resent = client.post(f"/api/generations/{gen_id}/edit", json={"text": INSTRUCTION + "Max sat down by the sea."})
    assert resent.status_code == 422, resent.text
    (error,) = resent.json()["detail"]
    assert error["loc"] == ["body", "text"] and "instruction" in error["msg"]
    assert len(store.list_generations()) == before


def test_a_continuation_keeps_its_drafts_prompt_format(store):
    """The API's continue defaults prompt_format to "continue" (the Write tab's radio can flip it): an instruction
    draft's continuation lost its chat turns at a shift. The draft's text decides its format, not the request."""
    client = TestClient(create_app(store))
    first = store.enqueue_generation(INSTRUCTION, INSTRUCT)
    written(store, first.id, FIRST)
    opening = store.enqueue_generation("Once upon a time", DraftSettings(Settings(max_new_tokens=4)))
    written(store, opening.id, " there was a dog.")
    answer = client.post("/api/generations", json={"continue_from": first.id, "max_new_tokens": 8})
    assert answer.status_code == 201, answer.text
    child = store.get_generation(answer.json()["id"])
    assert DraftSettings.from_json(child.settings_json).settings.prompt_format == "instruction"
    assert store.instruction(child.id) == INSTRUCTION
    child = store.continue_generation(opening.id, INSTRUCT)  # and an opening's stays an opening
    assert DraftSettings.from_json(child.settings_json).settings.prompt_format == "continue"
    assert store.instruction(child.id) is None



# Gemma's way (Mistral's is alike): a system message is refused, so the Memory has no system turn to sit in.
TURNS = ("{% for m in messages %}{% if m['role'] != 'system' %}{{ '<start_of_turn>' + m['role'] + '\\n' + "
         "m['content'] + '<end_of_turn>\\n' }}{% endif %}{% endfor %}")
NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
             + TURNS + "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


def with_template(stories_path, template: str):
    """stories260k's tokenizer (a copy) given `template`, as chat_frame reads a model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(stories_path))
    tokenizer.chat_template = template
    return SimpleNamespace(name="stories260k", tokenizer=tokenizer)


def test_a_template_without_a_system_turn_takes_the_memory_in_the_instructions_turn(stories_path):
    """chat_frame asked for a system turn whenever a Memory was set: such a template raised a TemplateError."""
    lm = with_template(stories_path, NO_SYSTEM)
    prompt = prompt_ids(lm, INSTRUCTION, "instruction", "Max ran.")
    plan = WindowPlan(prompt, 0, pinned_ids(lm, MEMORY, "", INSTRUCTION), size=256, step=32, note_depth=8)
    seen = lm.tokenizer.decode(plan.window(prompt, len(prompt)))  # its pieces tokenized apart: compare the words
    words = f"<start_of_turn>user {MEMORY} {INSTRUCTION}<end_of_turn> <start_of_turn>model Max ran."
    assert seen.split() == words.split()


@pytest.mark.parametrize(("template", "memory", "field"), [
    # the generation prompt written before the turns: the opened conversation does not start with the closed one
    ("{% if add_generation_prompt %}{{ 'Answer:\\n' }}{% endif %}" + TURNS, "", "prompt_format"),
    (TURNS + "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}", MEMORY, "memory"),  # drops it
])
def test_a_template_that_cannot_be_cut_into_turns_is_refused_in_plain_words(stories_path, template, memory, field):
    """The turns were cut by slicing one rendering at another's length, unchecked: a wrong frame, or a ValueError."""
    with pytest.raises(SettingsError) as refused:
        chat_frame(with_template(stories_path, template), INSTRUCTION, memory)
    assert refused.value.field == field and "stories260k" in str(refused.value)


@pytest.fixture(scope="module")
def chat_model(stories_path, tmp_path_factory):
    """stories260k with SmolLM2's ChatML template, as a model folder the CLI loads."""
    folder = tmp_path_factory.mktemp("chat") / "stories260k"
    shutil.copytree(stories_path, folder)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": CHATML}))
    return folder


@pytest.mark.slow
def test_the_cli_keeps_an_instructions_chat_turns_through_shifts(capsys, tmp_path, chat_model):
    """generate --instruction and bench-shift gave the engine no chat turns to keep: the first shift dropped the
    instruction's turn with the oldest story."""
    runs = {}
    for mode in ("ar", "tokenswift"):
        out = tmp_path / f"{mode}.json"
        args = ["generate", "--model", str(chat_model), "--device", "cpu", "--dtype", "float64", "--instruction",
                "--prompt", INSTRUCTION, "--seed", "3", "--max-new-tokens", "640", "--ignore-eos", "--mode", mode,
                "--context-window", "512", "--shift-step", "64", "--json", str(out)]
        assert cli.main(args) == 0, capsys.readouterr().err
        runs[mode] = json.loads(out.read_text())
    assert runs["ar"]["tokens"] == runs["tokenswift"]["tokens"]
    assert runs["tokenswift"]["metrics"]["shifts"] >= 3
    lm = load_model(str(chat_model), device="cpu", dtype="float64")
    asked = DraftSettings.from_json(json.dumps(runs["ar"]["settings"]))
    prompt, pinned = draft_context(lm, INSTRUCTION, "instruction")
    gen = Generator(lm, asked.settings, prompt, options=EngineOptions(speculation=asked.speed), pinned=pinned)
    assert gen.run() == runs["ar"]["tokens"]  # the CLI's windows are the app's: the chat turns stay on top
    window = gen._engine.buf[:gen._engine.length].tolist()
    assert gen.metrics().shifts >= 3 and window[:len(gen.plan.head)] == gen.plan.head
    assert INSTRUCTION in lm.tokenizer.decode(gen.plan.head)  # the instruction's turns, not just a BOS

    out = tmp_path / "shift.json"
    args = ["bench-shift", "--model", str(chat_model), "--device", "cpu", "--dtype", "float64", "--instruction",
            "--prompt", INSTRUCTION, "--seed", "3", "--max-new-tokens", "300", "--warmup-tokens", "0",
            "--context-window", "256", "--shift-step", "32", "--json", str(out)]
    assert cli.main(args) == 0, capsys.readouterr().err
    shifted = json.loads(out.read_text())
    assert shifted["identical"] and shifted["tokenswift"]["shifts"] >= 3
    assert shifted["pinned_tokens"] == len(gen.plan.head)  # the instruction's turns stay pinned, not just a BOS
