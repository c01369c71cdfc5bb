"""Instruction drafts (the chat template): Continue after an edit goes on inside the assistant's turn, and the
Memory (system turn) and Author's Note (a user turn near the end) keep the chat format through every context
shift, exactly: plain decoding, TokenSwift and a resumed run see the same window for every token (float64,
stories260k given SmolLM2's ChatML template); the default model joins an edited story to its continuation."""

from __future__ import annotations

import dataclasses

import pytest
from speed import AR, speed
from test_context_shift import lm_with, resumed
from test_drafts import _reuse
from test_exactness import SAMPLERS

from storage import open_store
from storage.records import ModelSpec
from tokenswift.decode.generate import Generator
from tokenswift.settings import DraftSettings, Settings, Speculation
from tokenswift.text.context_window import PinnedText, WindowPlan, pinned_ids
from tokenswift.text.detok import IncrementalDetokenizer
from tokenswift.text.prompting import ChatFrame, chat_frame, prompt_ids

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
INSTRUCTION = "Write a story about a dog named Max."
MEMORY = "Max is a big brown dog. Lily is his friend."
NOTE = "Lily finds a red ball."


@pytest.fixture(scope="module")
def chat64(stories64, stories_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(stories_path))
    tokenizer.chat_template = CHATML
    return dataclasses.replace(stories64, tokenizer=tokenizer)


def settings(**changes) -> Settings:
    # The ChatML turns take ~200 of stories260k's tokens: a 512-token window shifting by 64 leaves ~250 of story.
    return Settings(max_new_tokens=700, seed=3, ignore_eos=True, context_window=512, shift_step=64, note_depth=40,
                    **SAMPLERS["minp-penalty"]).replace(**changes)


NARROW_TREE = dict(budget=48, tree=(1, 2, 2))  # TokenSwift's batches kept small on one CPU core


def test_chat_window_keeps_its_turns_with_memory_and_note_inside_them():
    """Memory went above the chat template's system turn and the note in as raw story words; after a shift
    the instruction's turn was dropped with the oldest story."""
    frame = ChatFrame(prompt=(1, 2, 3, 9), before=(1,), after=(3,), opener=(9,), close=(8,))
    prompt = [1, 2, 3, 9, *range(10, 40)]  # the turns, then 30 tokens of story (a writer's edit)
    plan = WindowPlan(prompt, 0, PinnedText((5, 6), (7, 7), frame), size=64, step=16, note_depth=4)
    assert plan.lead == 4 and plan.fixed == len([1, 5, 6, 3, 9]) + len([8, 7, 7, 9])
    # The status line's "memory" is the writer's Memory and note: the chat turns are the frame ("memory 81" read an
    # instruction draft's turns as Memory when it had none).
    assert plan.frame_size() == len([1, 3, 9, 8, 9])
    assert WindowPlan(prompt, 0, PinnedText((), (), frame), size=64, step=16, note_depth=4).frame_size() == 3
    assert plan.window(prompt, len(prompt)) == [1, 5, 6, 3, 9, *range(10, 36), 8, 7, 7, 9, *range(36, 40)]
    ids = list(range(300))
    ids[:4] = [1, 2, 3, 9]
    seen = plan.seen(ids[:200])
    assert [kind for kind, _ in seen] == ["shifted", "frame", "memory", "frame", "frame", "story", "frame", "note",
                                          "frame", "story", "story"]
    assert seen[0][1] == ids[4:plan.kept_start(plan.boundary(200))]  # what dropped out of view, marked
    assert [t for _, piece in seen[1:] for t in piece][:5] == [1, 5, 6, 3, 9]  # the turns stay after every shift
    short = WindowPlan([1, 2, 3, 9], 0, PinnedText((5,), (7,), frame), size=64, step=16, note_depth=4)
    assert short.window([1, 2, 3, 9], 4) == [1, 5, 3, 7, 9]  # no empty assistant turn before the note


def test_memory_sits_in_the_system_turn_and_the_note_in_a_user_turn(smollm2):
    pinned = pinned_ids(smollm2, MEMORY, NOTE, INSTRUCTION)
    bare = chat_frame(smollm2, INSTRUCTION)
    assert bare.prompt == bare.before + bare.after + bare.opener  # no Memory: the window starts as the prompt
    prompt = prompt_ids(smollm2, INSTRUCTION, "instruction", "Max ran to the park. He was alone.")
    plan = WindowPlan(prompt, 0, pinned, size=2048, step=64, note_depth=3)
    assert smollm2.tokenizer.decode(plan.window(prompt, len(prompt))) == (
        f"<|im_start|>system\n{MEMORY}<|im_end|>\n<|im_start|>user\n{INSTRUCTION}<|im_end|>\n"
        "<|im_start|>assistant\nMax ran to the park. He<|im_end|>\n<|im_start|>user\n"
        f"Go on with the story from where it stops. Author's note for what comes next: {NOTE}<|im_end|>\n"
        "<|im_start|>assistant\n was alone.")


@pytest.mark.slow
def test_chat_draft_is_exact_across_shifts_and_resume(chat64):
    prompt = prompt_ids(chat64, INSTRUCTION, "instruction")
    pinned = pinned_ids(chat64, MEMORY, NOTE, INSTRUCTION)
    lm = lm_with(chat64, 3)
    plain = Generator(lm, settings(), prompt, options=speed(mode="ar", **NARROW_TREE), pinned=pinned)
    reference = plain.run()
    assert plain.metrics().shifts >= 5
    swift = Generator(lm, settings(), prompt, options=speed(ngram_topk=20, **NARROW_TREE), pinned=pinned)
    assert swift.run() == reference and swift.metrics().shifts >= 5
    window = swift._engine.buf[:swift._engine.length].tolist()
    assert window[:len(swift.plan.head)] == swift.plan.head  # system turn with the Memory, instruction, opener
    b1 = swift.plan.b1 - len(prompt)
    for cut in (b1, 600):  # at a shift's boundary and within a window, each on past two more shifts
        got, want = resumed(lm, settings(), prompt, reference, cut, 2 * swift.plan.step + 2, pinned,
                            speed(**NARROW_TREE))
        assert got == want, cut


@pytest.mark.slow
def test_continue_after_an_edit_goes_on_inside_the_assistant_turn(tmp_path, chat64):
    """The edited text went back as a new user message (the model answered it: "alone.Bonjour")."""
    from worker import WorkerConfig
    from worker.loop import Worker

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    s = Settings(seed=5, max_new_tokens=40, prompt_format="instruction", **SAMPLERS["minp-penalty"])
    asked = DraftSettings(s, Speculation(ngram_topk=8))
    first = store.enqueue_generation(INSTRUCTION, asked, memory=MEMORY, authors_note=NOTE)
    store.set_desired_model(ModelSpec(str(chat64.path), None, "cpu", "float64"))

    def serve():
        worker = Worker(store, WorkerConfig(worker_id="w", once=True, threads=1, poll_s=0.01))
        worker.holder._load = _reuse(worker.holder, chat64)
        worker.serve()

    serve()
    story = "Max ran to the park. He was alone."
    assert store.instruction(first.id) == INSTRUCTION
    edit = store.save_edit(first.id, story)  # the editor holds the story; the instruction stays apart
    assert edit.prompt_text == INSTRUCTION + story and store.instruction(edit.id) == INSTRUCTION
    assert (edit.memory, edit.authors_note) == (MEMORY, NOTE)  # an edit kept neither
    continued = store.continue_generation(edit.id, asked)
    serve()
    record, tokens = store.get_generation(continued.id), store.get_tokens(continued.id)
    assert record.status == "done", record.error
    assert tokens.prompt_ids == prompt_ids(chat64, INSTRUCTION, "instruction", story)
    pinned = pinned_ids(chat64, MEMORY, NOTE, INSTRUCTION)
    plain = Generator(chat64, s, tokens.prompt_ids, options=AR, pinned=pinned).run()
    assert tokens.generated_ids == plain
    detok = IncrementalDetokenizer(chat64.tokenizer, tokens.prompt_ids)
    assert record.text == detok.push(plain) + detok.flush()
    store.close()


def test_the_default_model_joins_an_edited_story_to_its_continuation(smollm2_q4):
    """SmolLM2 goes on from "… alone." inside its answer: a space or a new line, not a new reply. (In q4, as the app
    runs it on a CPU: float32's 12 steps took 10 s on this machine's memory. With the story in a turn of its own,
    q4 too starts a new reply, "As the last light…".)"""
    lm = smollm2_q4
    story = "Max the dog lived in a small house by the sea. One night the storm came, and he was alone."
    prompt = prompt_ids(lm, "Write a short story about a dog.", "instruction", story)
    s = Settings(max_new_tokens=12, temperature=0, ignore_eos=True)
    detok = IncrementalDetokenizer(lm.tokenizer, prompt)
    text = detok.push(Generator(lm, s, prompt, options=AR).run()) + detok.flush()
    assert text[:1].isspace() and text.strip()[:1].isupper(), text
