"""An instruction draft past the end of the model's answer (context_window.AfterAnswer), on the default model in q4:
where the model would end its answer, the story takes a section break and the writer's turn asks the model to go on
with the story; plain decoding, TokenSwift and a run resumed around the break write the same tokens."""

from __future__ import annotations

from speed import AR

from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.settings import writing_settings
from tokenswift.text.context_window import draft_context

INSTRUCTION = "Write one short sentence about a cat."
SETTINGS = writing_settings(max_new_tokens=110, seed=2, prompt_format="instruction", context_window=256)
APP = EngineOptions(adaptive=True)


def test_the_story_goes_on_past_the_answer_exactly(smollm2_q4):
    lm = smollm2_q4
    prompt, pinned = draft_context(lm, INSTRUCTION, "instruction", memory="A cat named Tom lives in a lighthouse.",
                                   note="Keep it gentle.")
    run = Generator(lm, SETTINGS, prompt, pinned=pinned, options=APP)
    ids = run.run()
    end = pinned.after_answer.section_break
    assert end in ids and ids.index(end) < 80  # a one-sentence answer ends early
    cut = ids.index(end)
    engine = run._engine
    window = lm.tokenizer.decode(engine.buf[:engine.length].tolist())
    assert engine.window.plan.answered_from is not None and "Go on with the story from where it stops." in window
    assert Generator(lm, SETTINGS, prompt, options=AR, pinned=pinned).run() == ids
    for at in (cut, cut + 1, cut + 5):
        assert Generator(lm, SETTINGS, prompt, pinned=pinned, generated_ids=ids[:at], options=APP).run() == ids


def test_the_turn_that_asks_for_more_is_no_memory(smollm2_q4):
    """Without a Memory or note, the status line's "memory" stays 0 past the answer: the turn that asks the model
    to go on is part of the chat's frame, not the writer's."""
    prompt, pinned = draft_context(smollm2_q4, INSTRUCTION, "instruction")
    run = Generator(smollm2_q4, SETTINGS.replace(max_new_tokens=90), prompt, pinned=pinned, options=APP)
    ids = run.run()
    assert pinned.after_answer.section_break in ids and run._engine.window.plan.answered_from is not None
    use = run.context_use()
    assert use.memory == 0 and use.frame > len(pinned.frame.prompt)


def test_without_keep_writing_the_answer_ends_the_draft(smollm2_q4):
    prompt, pinned = draft_context(smollm2_q4, INSTRUCTION, "instruction")
    run = Generator(smollm2_q4, SETTINGS.replace(ban_eos=False), prompt, pinned=pinned)
    ids = run.run()
    assert ids[-1] in smollm2_q4.eos_ids and pinned.after_answer.section_break not in ids
