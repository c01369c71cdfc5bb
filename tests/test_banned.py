"""Banned phrases (sampling/banned.py): a phrase the model writes is rewound and never appears, nothing shown is
taken back, TokenSwift emits exactly the tokens of plain decoding with bans on (float64, stories260k: three
drafters, n-grams, adaptive, context shifts with Memory and Author's Note), a run resumed from any prefix of its
text writes the same ids, the end of a run (length, end-of-text, stop string) is right with tokens held back, and
bad phrases are refused by name (settings, command line, API). The Write tab's box, in a browser, is tested with the
other Write-tab settings in test_presets_browser.py (one browser profile for both)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from speed import AR, speed
from test_context_shift import MEMORY, NARROW, NOTE, first_difference
from test_exactness import PROMPT, random_heads, tiny_qwen  # noqa: F401 - tiny_qwen: a fixture

from tokenswift.cli.main import main
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model.draft_layer import initial_layer
from tokenswift.sampling.banned import PhraseWatch
from tokenswift.settings import DraftSettings, Settings, SettingsError, Speculation
from tokenswift.settings.phrases import STARTER_BANS, normal
from tokenswift.text.context_window import pinned_ids
from tokenswift.text.detok import IncrementalDetokenizer

# Phrases stories260k writes from PROMPT (greedy, seed 1: "...saw a big tree. They saw a big tree...").
BANS = ("big tree", "Smiled and said", "did not know", "very happy", "had fun")
GREEDY = dict(temperature=0.0)
MIN_P = dict(temperature=1.0, min_p=0.1)


def text_of(lm, ids: list[int]) -> str:
    return normal(IncrementalDetokenizer(lm.tokenizer, lm.encode(PROMPT)).push(ids))


def contains_ban(lm, ids: list[int]) -> bool:
    return any(normal(p) in text_of(lm, ids) for p in BANS)


def token_at(lm, ids: list[int], phrase: str) -> int:
    """The index of the token where the text's first `phrase` begins."""
    at = text_of(lm, ids).index(phrase)
    return next(i for i in range(len(ids)) if len(text_of(lm, ids[:i + 1])) > at)


def run(lm, s: Settings, **kw) -> tuple[list[int], int]:
    gen = Generator(lm, s, lm.encode(PROMPT), **kw)
    return gen.run(), gen.metrics().rewinds


@pytest.fixture(scope="module")
def lm(stories64):
    """stories260k (float64) with heads that read the next token, and an untrained draft layer: every drafter
    proposes (badly or well, the text is the same)."""
    vocab = torch.arange(stories64.config.vocab_size)
    layer = initial_layer(stories64.model, vocab, window=16).to("cpu", torch.float64).eval().requires_grad_(False)
    return dataclasses.replace(stories64, heads=random_heads(stories64, 3), draft_layer=layer)


@pytest.mark.slow
def test_a_banned_phrase_is_rewound_and_never_appears(lm):
    s = Settings(max_new_tokens=160, seed=1, ignore_eos=True, **GREEDY)
    plain, _ = run(lm, s, options=AR)
    banned, rewinds = run(lm, s.replace(ban=("BIG tree",)), options=AR)
    assert "big tree" in text_of(lm, plain) and "big tree" not in text_of(lm, banned) and rewinds >= 1
    # The same text up to the token where the phrase began; there the banned token gives way to another.
    start = token_at(lm, plain, "big tree")
    assert first_difference(plain, banned) == start


@pytest.mark.slow
def test_shown_text_never_ends_in_what_could_become_a_phrase(lm):
    """Every event but the last leaves the shown text without a tail that begins a banned phrase: a rewind only
    ever removes tokens that were held back."""
    s = Settings(max_new_tokens=300, seed=1, ignore_eos=True, ban=BANS, **MIN_P)
    shown, events, phrases = [], 0, [normal(p) for p in BANS]
    for event in Generator(lm, s, lm.encode(PROMPT), options=AR).steps():
        shown += event.tokens
        events += 1
        if not event.done:
            text = text_of(lm, shown)
            assert not any(p.startswith(text[-n:]) for p in phrases for n in range(1, len(p) + 1)), text[-30:]
    assert events < len(shown) and not contains_ban(lm, shown)  # tokens were held and let go in groups


def test_held_text_includes_what_an_earlier_token_boundary_could_still_complete(lm):
    """With "big cat" and "dog run" banned, "a big dog" holds " big" too, not only " dog": were "dog run" to
    complete, the rewind to " dog" could go on with " cat" and complete "big cat" from text already shown."""
    context = lm.encode("Once upon a time")
    watch = PhraseWatch(["big cat", "dog run"], lm.tokenizer, context)
    tokens = lm.encode("Once upon a time a big dog")[len(context):]
    hits = [watch.push(t) for t in tokens]
    big = next(i for i in range(len(tokens)) if watch.pieces[i] == " big")
    assert hits == [None] * len(tokens) and watch.keep() == big
    more = lm.encode("Once upon a time a big dog run")[len(context) + len(tokens):]
    assert [watch.push(t) for t in more] == [None] * (len(more) - 1) + [big + 1]  # the rewind goes to " dog"


CASES = [("fused", 20, False, GREEDY), ("fused", 20, True, MIN_P), ("paper", 5, False, dict(**MIN_P, penalty=1.2,
         penalty_window=32)), ("layer", 20, False, MIN_P)]


@pytest.mark.slow
@pytest.mark.parametrize(("drafter", "k", "adaptive", "sampling"), CASES)
def test_tokenswift_equals_ar_with_bans(lm, drafter, k, adaptive, sampling):
    s = Settings(max_new_tokens=300, seed=1, ignore_eos=True, ban=BANS, **sampling)
    expected, ar_rewinds = run(lm, s, options=AR)
    ts = EngineOptions(adaptive=adaptive, speculation=Speculation(ngram_topk=k, budget=48, drafter=drafter))
    ids, rewinds = run(lm, s, options=ts)
    assert first_difference(ids, expected) is None and rewinds == ar_rewinds >= 1
    assert not contains_ban(lm, ids) and contains_ban(lm, run(lm, s.replace(ban=()), options=AR)[0])


@pytest.mark.slow
def test_tokenswift_equals_ar_with_bans_across_shifts_with_memory_and_resume(lm):
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    s = Settings(max_new_tokens=300, seed=4, ignore_eos=True, context_window=NARROW, note_depth=100,
                 ban=(*BANS, "her mom", "the sky", "one day"), **MIN_P)
    expected = Generator(lm, s, prompt, options=AR, pinned=pinned).run()
    gen = Generator(lm, s, prompt, options=speed(tree=(1, 2, 2)), pinned=pinned)
    assert first_difference(gen.run(), expected) is None and not contains_ban(lm, expected)
    assert gen.metrics().shifts >= 2 and gen.metrics().rewinds >= 2
    for e in (60, 170):  # before the first shift and past it
        resumed = Generator(lm, s, prompt, generated_ids=expected[:e], options=speed(tree=(1, 2, 2)), pinned=pinned)
        assert first_difference(resumed.run(), expected) is None, e


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ar", "tokenswift"])
def test_a_run_resumed_from_any_prefix_writes_the_same_ids(lm, mode):
    """A pause (the ids shown so far) or a crash (the ids stored so far) resumes exactly: also from just before,
    at and just after the first rewind's token, where the uninterrupted run held that token back."""
    s, options = Settings(max_new_tokens=200, seed=1, ignore_eos=True, ban=BANS, **MIN_P), speed(mode=mode)
    shown, boundaries = [], []
    for event in Generator(lm, s, lm.encode(PROMPT), options=options).steps():
        shown += event.tokens
        boundaries.append(len(shown))
    rewound = first_difference(shown, run(lm, s.replace(ban=()), options=options)[0])
    assert rewound is not None
    assert len(boundaries) >= 20  # shown in many groups: only what could still become a phrase is held back
    for e in sorted({1, rewound - 1, rewound, rewound + 1, *boundaries[::len(boundaries) // 4]}):
        assert first_difference(run(lm, s, generated_ids=shown[:e], options=options)[0], shown) is None, e


@pytest.mark.slow
def test_the_end_of_a_run_with_tokens_held_back(lm):
    s = Settings(seed=1, ignore_eos=True, **GREEDY)
    plain, _ = run(lm, s.replace(max_new_tokens=160))
    big = token_at(lm, plain, "big tree")
    # Length: the run ends on the token that begins "big tree", held back: shown at the end, exactly n tokens.
    gen = Generator(lm, s.replace(max_new_tokens=big + 1, ban=("big tree",)), lm.encode(PROMPT), options=AR)
    events = list(gen.steps())
    assert gen.produced == plain[:big + 1] and events[-1].finish_reason == "length"
    assert gen.metrics().steps == big  # shown as the last token came: no step past the end (1st: the prefill)
    # A stop string inside held text ends the run where the final text has it.
    ids = Generator(lm, s.replace(max_new_tokens=160, ban=("big tree",), stop=("bird",)), lm.encode(PROMPT)).run()
    assert text_of(lm, ids).endswith("bird") and "bird" not in text_of(lm, ids[:-1])


@pytest.mark.slow
def test_end_of_text_shows_the_tokens_held_back(tiny_qwen):  # noqa: F811 - the fixture
    """test_exactness's tiny Qwen2 ends with end-of-text at token 267 (seed 8; whole characters before it). With a
    phrase banned that its last three tokens begin, they are held when end-of-text comes, and shown then: the same
    ids in both modes."""
    prompt = tiny_qwen.encode(PROMPT)
    rule = dict(max_new_tokens=600, seed=8, temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)
    free = Generator(tiny_qwen, Settings(**rule), prompt, options=AR).run()
    end = len(free) - 1
    assert end == 266
    tail = IncrementalDetokenizer(tiny_qwen.tokenizer, prompt + free[:end - 3]).push(free[end - 3:end]).strip()
    s = Settings(ban=(f"{tail} zq",), **rule)
    events = list(Generator(tiny_qwen, s, prompt, options=AR).steps())
    ids = [t for e in events for t in e.tokens]
    assert ids == free and events[-1].finish_reason == "eos" and free[-1] in tiny_qwen.eos_ids
    assert len(events[-1].tokens) >= 4  # the three held back, and end-of-text
    assert Generator(tiny_qwen, s, prompt).run() == free


def test_bad_phrases_are_refused_by_name():
    for bad in ("big tree", ["a"], ["  x  "], ["x" * 201], ["..."], [" \n "], ["ab"] * 501):
        with pytest.raises(SettingsError, match="^ban: ") as error:
            Settings(ban=bad)
        assert error.value.field == "ban"
    s = Settings(ban=["  Big tree ", "big TREE", "had fun"])
    assert s.ban == ("Big tree", "had fun") and DraftSettings.from_json(DraftSettings(s).to_json()).settings == s
    assert len(Settings(ban=STARTER_BANS).ban) == len(STARTER_BANS)


def test_ban_flags_and_files_on_the_command_line(stories_path, tmp_path, capsys):
    base = ["generate", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "3"]
    bans = tmp_path / "bans.txt"
    bans.write_text("# stock phrases\n\nbig tree\n  had fun  \n", encoding="utf-8")
    out = tmp_path / "o.json"
    assert main([*base, "--ban", "very happy", "--ban-file", str(bans), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["ban"] == ["very happy", "big tree", "had fun"]
    capsys.readouterr()
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    for path in (tmp_path / "missing.txt", latin, tmp_path):
        assert main([*base, "--ban-file", str(path)]) == 2
        assert capsys.readouterr().err.startswith("error: --ban-file: ")
    assert main([*base, "--ban", "!"]) == 2 and capsys.readouterr().err.startswith("error: ban: ")
    assert main(["bench", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "3",
                 "--ban-file", str(tmp_path / "missing.txt")]) == 2
    assert "--ban-file" in capsys.readouterr().err


def test_the_api_takes_bans_and_refuses_bad_ones_by_name(tmp_path):
    from fastapi.testclient import TestClient

    from storage import open_store
    from ui.api.api import create_app

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    try:
        client = TestClient(create_app(store))
        body = {"prompt": PROMPT, "max_new_tokens": 20, "settings": {"ban": ["big tree", "Had fun"]}}
        created = client.post("/api/generations", json=body)
        assert created.status_code == 201
        stored = DraftSettings.from_json(store.get_generation(created.json()["id"]).settings_json).settings
        assert stored.ban == ("big tree", "Had fun")
        for bad in (["x"], ["?!"], "big tree", ["\ud800 lone"]):
            payload = json.dumps({**body, "settings": {"ban": bad}})  # escaped: a lone surrogate gets through
            response = client.post("/api/generations", content=payload, headers={"content-type": "application/json"})
            assert response.status_code == 422, bad
            detail = response.json()["detail"][0]
            assert detail["msg"].startswith("settings.ban") and detail["loc"][:3] == ["body", "settings", "ban"]
    finally:
        store.close()
