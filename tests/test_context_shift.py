"""Context shifting (tokenswift/text/context_window.py): drafts longer than the window, with Memory and Author's
Note, emit exactly the same tokens in plain decoding and TokenSwift (float64, stories260k with a 512-token
window; the many-shifts and resume cases a 160-token one), uninterrupted or resumed anywhere, also right at a shift."""

from __future__ import annotations

import dataclasses

import pytest
from speed import AR, speed
from test_exactness import SAMPLERS, random_heads

from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.decode.window import Rebuild
from tokenswift.model.fastpath import FastOptions
from tokenswift.settings import Settings, SettingsError
from tokenswift.text.context_window import PinnedText, WindowPlan, pinned_ids

N = 1000
WINDOW = 512
# The many-shifts cases: a 160-token window shifts a quarter of it (40 tokens) at a time, the first time about 80
# tokens in with Memory and note: MANY tokens through it shift 10 times or more.
NARROW = 160
MANY = 520
PROMPT = "The old lighthouse keeper climbed the stairs and"
MEMORY = "Tom is a fisherman. Lily is his sister. They live by the sea."
NOTE = "Lily finds a shell."


def lm_with(lm, seed: int | None):
    """A copy of the shared fixture with random draft heads (or none)."""
    heads = random_heads(lm, seed) if seed is not None else None
    return dataclasses.replace(lm, heads=heads)


@pytest.fixture(scope="module")
def pinned(stories64):
    return pinned_ids(stories64, MEMORY, NOTE)


def settings(sampler: str, seed: int, **changes) -> Settings:
    return Settings(max_new_tokens=N, seed=seed, ignore_eos=True, context_window=WINDOW, note_depth=100,
                    **SAMPLERS[sampler]).replace(**changes)


def drafting(**changes) -> EngineOptions:
    # A narrow tree (two heads, 1 + 2 + 4 rows) keeps the verify pass cheap on one CPU core.
    return speed(budget=48, tree=(1, 2, 2), **changes)


def resumed(lm, s: Settings, prompt: list[int], ids: list[int], cut: int, more: int,
            pinned: PinnedText | None = None, options: EngineOptions | None = None) -> tuple[list[int], list[int]]:
    """(a run resumed from the generated ids[:cut] that stops `more` tokens later, or where ids end; the ids it
    must write): a shorter run writes a prefix of the longer one, so a resume is checked past its cut only."""
    upto = min(cut + more, len(ids))
    run = Generator(lm, s.replace(max_new_tokens=upto), prompt, generated_ids=ids[:cut], options=options,
                    pinned=pinned)
    return run.run(), ids[:upto]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


# Every sampler, k in {0, 20} twice each, always with heads; with and without Memory and note; the adaptive
# engine (plain steps and smaller batches next to the shifts) too. Four cases keep the file near a minute.
CASES = [("greedy", 0, False, False), ("minp-penalty", 20, True, True), ("top-p", 20, True, False),
         ("eta", 0, True, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "k", "with_pinned", "adaptive"), CASES)
def test_tokenswift_equals_ar_across_many_shifts(stories64, ar_runs, pinned, sampler, k, with_pinned, adaptive):
    prompt, seed = stories64.encode(PROMPT), 3
    s = settings(sampler, seed, max_new_tokens=MANY, context_window=NARROW)
    pins = pinned if with_pinned else None
    options = dataclasses.replace(drafting(ngram_topk=k), adaptive=adaptive)
    gen = Generator(lm_with(stories64, seed), s, prompt, options=options, pinned=pins)
    tokens = gen.run()
    assert first_difference(tokens, ar_runs(stories64, s, prompt, pins)) is None
    m = gen.metrics()
    assert m.shifts >= 10 and m.steps < MANY  # many shifts, and drafts were accepted between them
    use = gen.context_use()
    assert use.memory == (len(pinned.memory) + len(pinned.note) if with_pinned else 0) and use.frame == 1  # BOS
    assert use.frame + use.memory + use.recent <= NARROW


@pytest.mark.slow
def test_resume_anywhere_continues_the_same_stream(stories64, pinned):
    """Paused just before, at and just after a shift, and mid-window: the resumed run rebuilds the window of
    the last shift and continues exactly; n-grams keep the whole draft's statistics (they are rebuilt from
    every stored id)."""
    prompt = stories64.encode(PROMPT)
    s, ts = settings("minp-penalty", 5, max_new_tokens=360, context_window=NARROW), drafting(ngram_topk=20)
    lm = lm_with(stories64, 5)
    straight = Generator(lm, s, prompt, options=ts, pinned=pinned).run()
    plan = Generator(lm, s, prompt, options=ts, pinned=pinned).plan
    b1, b2 = plan.b1, plan.b1 + plan.step + 1
    generated = lambda t: t - len(prompt)  # noqa: E731 - story index -> generated count
    assert generated(b2) + 37 < s.max_new_tokens
    cuts = [("tokenswift", generated(b1) - 1), ("tokenswift", generated(b1)), ("ar", generated(b1)),
            ("tokenswift", generated(b1) + 1), ("tokenswift", generated(b2) + 37)]
    for mode, cut in cuts:  # each on past two more shifts
        got, want = resumed(lm, s, prompt, straight, cut, 2 * plan.step + 2, pinned, ts.speculating(mode=mode))
        assert got == want, (mode, cut)


def test_the_window_moves_at_its_boundary_as_a_resume_builds_it(stories64, pinned):
    """Window.due: no rebuild inside a window, one at the plan's next boundary; the window rebuilt there is the one a
    run resumed from the same ids loads (slots, offset)."""
    prompt = stories64.encode(PROMPT)
    s = settings("greedy", 1, max_new_tokens=200, context_window=NARROW)
    plan = Generator(stories64, s, prompt, options=AR, pinned=pinned).plan
    engine = Engine(stories64, s, list(prompt), len(prompt), AR, plan=plan)
    engine.start()
    boundary = engine.window.next_boundary
    while len(engine.ids) < boundary:
        assert engine.window.due(engine.ids) is None
        engine.ar_step()
    assert engine.window.due(engine.ids) == Rebuild(None) and engine.window.shifts == 0
    engine.ar_step()
    assert engine.window.shifts == 1 and engine.window.next_boundary > boundary
    resume = Engine(stories64, s, list(engine.ids), len(prompt), AR, plan=plan)
    resume.start()
    assert (resume.length, resume.window.offset) == (engine.length, engine.window.offset)
    assert resume.buf[:resume.length + 1].tolist() == engine.buf[:engine.length + 1].tolist()


@pytest.mark.slow
def test_memory_and_note_edits_apply_from_the_resume(stories64, pinned):
    prompt = stories64.encode(PROMPT)
    s, ts = settings("greedy", 1, max_new_tokens=700), drafting(ngram_topk=20)
    lm = lm_with(stories64, 1)
    first = Generator(lm, s, prompt, options=ts, pinned=pinned).run()
    edited = pinned_ids(stories64, "Max is a big brown dog who loves to run.", "The dog barks.")
    gen = Generator(lm, s, prompt, generated_ids=first[:400], options=ts, pinned=edited)
    resumed = gen.run()
    assert resumed[:400] == first[:400] and resumed != first
    engine = gen._engine
    window = engine.buf[: engine.length + 1].tolist()
    assert window[1:1 + len(edited.memory)] == list(edited.memory)  # pinned right after BOS
    note_at = next(i for i in range(len(window)) if window[i:i + len(edited.note)] == list(edited.note))
    assert len(window) - note_at - len(edited.note) >= s.note_depth  # the note stays near the end
    assert resumed == Generator(lm, s, prompt, options=AR, generated_ids=first[:400], pinned=edited).run()


@pytest.mark.slow
def test_an_edit_during_a_run_applies_from_the_next_shift(stories64, pinned):
    """The worker reads Memory and note again at every shift: both modes pick an edit up at the same token,
    and a run resumed later with the edited text continues exactly."""
    prompt = stories64.encode(PROMPT)
    s, ts = settings("minp-penalty", 7, max_new_tokens=360, context_window=NARROW), drafting(ngram_topk=20)
    lm = lm_with(stories64, 7)
    edited = pinned_ids(stories64, "Max is a big brown dog who loves to run and play.", "")

    def source():
        calls.append(1)
        return pinned if len(calls) < 2 else edited  # the edit lands between the first and second shift

    runs = {}
    for mode in ("ar", "tokenswift"):
        calls = []
        gen = Generator(lm, s, prompt, options=ts.speculating(mode=mode), pinned=pinned, pinned_source=source)
        runs[mode] = gen.run()
        assert gen.metrics().shifts == len(calls) >= 3 and gen._engine.window.plan.pinned == edited
    assert runs["ar"] == runs["tokenswift"]
    assert runs["ar"] != Generator(lm, s, prompt, options=ts, pinned=pinned).run()  # the edit changed what came next
    cut = len(runs["ar"]) - 60
    assert Generator(lm, s, prompt, generated_ids=runs["ar"][:cut], options=ts, pinned=edited).run() == runs["ar"]


@pytest.mark.slow
def test_fast_path_keys_the_noise_by_story_index_across_shifts(stories64):
    prompt = stories64.encode(PROMPT)
    s = settings("minp-penalty", 2, max_new_tokens=450, context_window=160)
    expected = Generator(stories64, s, prompt, options=AR).run()
    lm, fast = lm_with(stories64, 2), dataclasses.replace(drafting(ngram_topk=5), fast=FastOptions(attention="sdpa",
                                                                                                     bucket=64))
    assert Generator(lm, s, prompt, options=fast.speculating(mode="ar")).run() == expected
    for drafter in ("paper", "fused"):  # the fused drafter reads the new window's state after each shift
        gen = Generator(lm, s, prompt, options=fast.speculating(drafter=drafter))
        assert gen.run() == expected and gen.metrics().shifts >= 4


@pytest.mark.slow
def test_a_run_that_fits_is_unchanged_and_shifting_off_refuses(stories64):
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=4, ignore_eos=True, **SAMPLERS["top-p"])
    gen = Generator(stories64, s.replace(context_window=WINDOW), prompt, options=AR)
    assert gen.run() == Generator(stories64, s, prompt, options=AR).run() and gen.metrics().shifts == 0
    with pytest.raises(SettingsError) as refused:
        Generator(stories64, s.replace(max_new_tokens=600, context_window=WINDOW, context_shift=False), prompt)
    assert refused.value.field == "max_new_tokens" and "context shifting is off" in str(refused.value)
    with pytest.raises(SettingsError) as too_big:
        Generator(stories64, s.replace(context_window=stories64.max_context + 1), prompt)
    assert too_big.value.field == "context_window"  # a window past the trained context: no RoPE scaling


def test_window_plan_boundaries_and_layout():
    prompt = [1, *range(10, 40)]  # BOS + 30 story tokens
    plan = WindowPlan(prompt, 1, PinnedText((5, 6), (7,)), size=64, step=16, note_depth=4)
    assert (plan.fixed, plan.keep) == (4, 44)
    assert plan.window(prompt, 31) == [1, 5, 6, *range(10, 36), 7, *range(36, 40)]
    # The first window has 34 tokens, so tokens up to 31 + 30 are predicted in it.
    assert plan.b1 == 31 + 64 - 34 + 1
    ids = list(range(200))
    assert [plan.boundary(t) for t in (31, plan.b1 - 1, plan.b1, plan.b1 + 16, plan.b1 + 17)] == \
        [31, 31, plan.b1, plan.b1, plan.b1 + 17]
    after = plan.window(ids, plan.b1)
    assert len(after) == 64 - 16 and after[:3] == [1, 5, 6] and after[-5:] == [7, *ids[plan.b1 - 4:plan.b1]]
    with pytest.raises(SettingsError) as full:
        WindowPlan(prompt, 1, PinnedText(tuple(range(50)), ()), size=64, step=16, note_depth=4)
    assert full.value.field == "shift_step"


def test_the_note_goes_between_words_not_inside_one():
    """The note went `note_depth` tokens before the end wherever that fell ("they" … note … "'re"); it moves back to
    the nearest token that begins a word, as a function of the ids alone (plain, TokenSwift and a resume agree)."""
    prompt = [1, *range(10, 40)]
    starts = frozenset({30, 33})  # ids 30 and 33 begin words; 34..39 continue 33
    plan = WindowPlan(prompt, 1, PinnedText((5, 6), (7,), word_starts=starts), size=64, step=16, note_depth=4)
    assert plan.window(prompt, 31) == [1, 5, 6, *range(10, 33), 7, *range(33, 40)]  # before 33, not inside it at 36
    far = WindowPlan(prompt, 1, PinnedText((5, 6), (7,), word_starts=frozenset({11})), size=64, step=16, note_depth=4)
    assert far.window(prompt, 31) == [1, 5, 6, *range(10, 36), 7, *range(36, 40)]  # no word start within reach
    assert len(plan.window(prompt, 31)) == len(far.window(prompt, 31))  # the boundaries do not move


def test_the_note_sits_before_a_word_of_the_real_tokenizer(stories64):
    tokenizer = stories64.tokenizer
    ids = tokenizer("Lily and Tom said that they're going home", add_special_tokens=False).input_ids
    note = pinned_ids(stories64, "", NOTE)
    for depth in range(1, len(ids)):
        plan = WindowPlan([1, *ids], 1, note, size=256, step=16, note_depth=depth)
        layout = plan.layout([1, *ids], len(ids) + 1)
        after = next(piece for kind, piece in reversed(layout) if kind == "story")
        assert tokenizer.convert_ids_to_tokens(after[:1])[0].startswith("\u2581"), (depth, after)  # "▁they", not "'"


@pytest.mark.slow
def test_bench_shift_prints_a_table_and_writes_json(stories_path, tmp_path, capsys):
    import json

    from tokenswift.cli import main as cli

    out = tmp_path / "shift.json"
    code = cli.main(["bench-shift", "--model", str(stories_path), "--device", "cpu", "--dtype", "float64",
                     "--threads", "1", "--prompt", PROMPT, "--max-new-tokens", "360", "--context-window", "160",
                     "--memory", MEMORY, "--authors-note", NOTE, "--temperature", "0", "--warmup-tokens", "4",
                     "--slice-tokens", "100", "--json", str(out)])
    table = capsys.readouterr().out
    assert code == 0 and "shift %" in table and "identical: yes" in table
    result = json.loads(out.read_text())
    assert result["identical"] and result["window"] == 160 and result["pinned_tokens"] > 1
    # The modes took turns: each slice's tokens were timed on both sides, the last one cut at the draft's end.
    assert [s["end"] for s in result["slices"]] == [100, 200, 300, 360]
    assert all(s["ar_tokens"] > 0 and s["ts_tokens"] > 0 for s in result["slices"])
    for mode in ("ar", "tokenswift"):
        m = result[mode]
        assert m["tokens"] == 360 and m["shifts"] >= 5 and 0 < m["shift_share"] < 1
        assert m["context_pinned"] + m["context_recent"] <= 160
