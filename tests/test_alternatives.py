"""Alternatives (tokenswift/sampling/alternatives.py, storage/): each generated token's likeliest alternatives
from the distribution it was drawn from. TokenSwift records exactly plain decoding's (float64, stories260k: trees,
n-grams, both drafters, adaptive, the fast path's passes, context shifts with Memory and Author's Note, a resume),
recording changes no token, and the store keeps them with their chunk (old chunks, from before migration 0007,
have none)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import DateTime, bindparam, text
from test_context_shift import MEMORY, NARROW, NOTE
from test_dry_xtc import DRY, XTC
from test_exactness import PROMPT, SAMPLERS, random_heads

from storage import open_store
from storage.alternatives import Choices, pack, unpack
from storage.db import make_engine
from storage.errors import Invalid
from storage.migrate import alembic_config, upgrade
from storage.records import Owner, Progress
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model.fastpath import FastOptions
from tokenswift.sampling.alternatives import TOP
from tokenswift.settings import DraftSettings, Settings, Speculation
from tokenswift.text.context_window import pinned_ids

RECORD = EngineOptions(alternatives=True)


def recorded(gen: Generator) -> tuple[list[int], list]:
    """The tokens and alternatives of a whole run, from its step events."""
    tokens, alternatives = [], []
    for event in gen.steps():
        assert event.alternatives is not None and len(event.alternatives) == len(event.tokens)
        tokens += event.tokens
        alternatives += event.alternatives
    return tokens, alternatives


def assert_same(got: list, want: list) -> None:
    """The same alternatives, token for token: ids exactly, probabilities to float64 rounding."""
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.ids == b.ids, f"token {i}: {a.ids} != {b.ids}"
        assert a.probability == pytest.approx(b.probability, rel=1e-9, abs=1e-12), f"token {i}"
        assert a.probs == pytest.approx(b.probs, rel=1e-9, abs=1e-12), f"token {i}"


CASES = [  # (drafter, k, adaptive, fast, sampling)
    ("fused", 20, False, False, SAMPLERS["minp-penalty"]),
    ("paper", 5, False, False, dict(temperature=1.0, top_p=0.95, penalty=1.2, penalty_window=32, **DRY, **XTC)),
    ("fused", 20, True, False, SAMPLERS["greedy"]),
    ("fused", 20, False, True, SAMPLERS["minp-penalty"]),  # sampled inside the verify pass (graphs="none" on CPU)
]


@pytest.mark.slow
@pytest.mark.parametrize(("drafter", "k", "adaptive", "fast", "sampling"), CASES)
def test_tokenswift_records_the_alternatives_of_plain_decoding(stories64, drafter, k, adaptive, fast, sampling):
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt = lm.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=2, ignore_eos=True, **sampling)
    ts = Speculation(ngram_topk=k, budget=48, tree=(1, 2, 2), drafter=drafter)
    options = dataclasses.replace(RECORD, adaptive=adaptive, speculation=ts,
                                  fast=FastOptions(attention="sdpa", bucket=64) if fast else None)
    expected, want = recorded(Generator(lm, s, prompt, options=RECORD.speculating(mode="ar")))
    gen = Generator(lm, s, prompt, options=options)
    tokens, got = recorded(gen)
    assert tokens == expected and gen.metrics().steps < len(tokens)  # drafts were accepted: several tokens a step
    assert_same(got, want)
    assert Generator(lm, s, prompt, options=EngineOptions(speculation=ts)).run() == expected  # recording changes none
    if fast:  # the plain steps of the fast path sample in their graph too
        assert_same(recorded(Generator(lm, s, prompt, options=options.speculating(mode="ar")))[1], want)


@pytest.mark.slow
def test_the_alternatives_are_the_distribution_the_token_was_drawn_from(stories64):
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=200, seed=5, ignore_eos=True, temperature=1.0, min_p=0.1)
    plain = RECORD.speculating(mode="ar")
    tokens, alternatives = recorded(Generator(stories64, s, prompt, options=plain))
    narrowed = 0
    for token, a in zip(tokens, alternatives, strict=True):
        kept = [p for i, p in zip(a.ids, a.probs, strict=True) if i >= 0]
        assert len(a.ids) == TOP and list(a.probs) == sorted(a.probs, reverse=True) and sum(a.probs) <= 1 + 1e-9
        assert all(p >= 0.1 * kept[0] for p in kept)  # min-p's filter: the rest has probability 0 (empty slots)
        assert all(p == 0 for i, p in zip(a.ids, a.probs, strict=True) if i < 0)
        narrowed += len(kept) < TOP
        if token in a.ids:
            assert a.probability == a.probs[a.ids.index(token)]
        assert a.probability > 0  # it was drawn from them
    assert narrowed > 0
    # Greedy draws from no distribution: its alternatives are the softmax at T = 1, the chosen token the likeliest.
    greedy = s.replace(temperature=0.0, min_p=0.0)
    tokens, alternatives = recorded(Generator(stories64, greedy, prompt, options=plain))
    assert all(a.ids[0] == t and a.probability == a.probs[0] for t, a in zip(tokens, alternatives, strict=True))
    assert any(a.probs[0] < 0.5 for a in alternatives) and all(min(a.ids) >= 0 for a in alternatives)


@pytest.mark.slow
def test_alternatives_across_context_shifts_with_memory_and_a_resume(stories64):
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    s = Settings(max_new_tokens=300, seed=4, ignore_eos=True, context_window=NARROW, note_depth=100,
                 **SAMPLERS["minp-penalty"])
    ts = RECORD.speculating(tree=(1, 2, 2), ngram_topk=20)
    expected, want = recorded(Generator(lm, s, prompt, pinned=pinned, options=RECORD.speculating(mode="ar")))
    gen = Generator(lm, s, prompt, pinned=pinned, options=ts)
    tokens, got = recorded(gen)
    assert tokens == expected and gen.metrics().shifts >= 3
    assert_same(got, want)
    resumed = Generator(lm, s, prompt, generated_ids=expected[:170], pinned=pinned, options=ts)  # past a shift
    tokens, got = recorded(resumed)
    assert tokens == expected[170:]
    assert_same(got, want[170:])


def test_packing_keeps_ids_exactly_and_probabilities_in_float32():
    records = [Choices(0.25, (7, 3, -1), (0.5, 0.25, 0.0)), Choices(1 / 3, (1, 2, 9), (0.4, 1 / 3, 0.1))]
    back = unpack(pack(records))
    assert [r.ids for r in back] == [r.ids for r in records]
    for r, b in zip(records, back, strict=True):
        assert b.probability == pytest.approx(r.probability, rel=1e-7)
        assert b.probs == pytest.approx(r.probs, rel=1e-7)
    assert len(pack(records)) == 1 + 2 * 4 * (1 + 2 * 3) and unpack(pack([])) == []
    with pytest.raises(ValueError, match="same number"):
        pack([records[0], Choices(0.5, (1,), (0.5,))])


def write_draft(store, pieces) -> int:
    """Play the worker: a finished draft whose chunks are `pieces` of (ids, text, alternatives or None)."""
    asked = DraftSettings(Settings(max_new_tokens=sum(len(p[0]) for p in pieces), seed=1))
    gen_id = store.enqueue_generation("Once", asked).id
    owner = Owner.here("test-worker")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, [1, 400], "stories", None)
    for i, (ids, words, alternatives) in enumerate(pieces):
        store.append_progress(gen_id, owner, Progress(ids, words, 0.1, alternatives=alternatives),
                              finish="done" if i == len(pieces) - 1 else None)
    return gen_id


def test_the_store_keeps_each_chunks_alternatives(db_url):
    store = open_store(db_url)
    first = [Choices(0.5, (10, 11, 12, 13, -1), (0.5, 0.3, 0.1, 0.1, 0.0)),
             Choices(0.2, (30, 21, 22, 23, 24), (0.4, 0.2, 0.2, 0.1, 0.1))]
    gen_id = write_draft(store, [([10, 21], " a b", first), ([5], " c", None)])
    at = store.token_at(gen_id, 1)
    assert (at.token, at.lead, at.context, at.text_before) == (21, [10], [1, 400], "")
    assert at.choices.ids == first[1].ids and at.choices.probs == pytest.approx(first[1].probs)
    later = store.token_at(gen_id, 2)  # a chunk written without them (as before 0007)
    assert (later.token, later.choices, later.text_before, later.context) == (5, None, " a b", [1, 400, 10, 21])
    span = store.span(gen_id, 1)
    assert (span.start, span.context, span.ids, span.recorded) == (1, [1, 400, 10], [21, 5], [True, False])
    for bad in (-1, 3, 10**30):
        with pytest.raises(Invalid, match="^position: "):
            store.token_at(gen_id, bad)
    store.close()


def test_migration_0007_leaves_old_chunks_without_alternatives(blank_db_url):
    before = ScriptDirectory.from_config(alembic_config()).get_revision("0007").down_revision
    engine = make_engine(blank_db_url)
    upgrade(engine, before)
    at = bindparam("at", type_=DateTime)
    with engine.begin() as c:
        c.execute(text("insert into sessions (id, title, author, created_at, updated_at) values (1, 't', '', :at, :at)"
                       ).bindparams(at), {"at": datetime(2026, 1, 1)})
        c.execute(text("insert into generations (id, session_id, prompt_text, prompt_ids, mode, seed, settings_json, "
                       "target_tokens, status, produced_tokens, chunk_count, created_at, elapsed_s) values "
                       "(1, 1, 'old', :ids, 'ar', 0, '{}', 2, 'done', 2, 1, :at, 0)").bindparams(at),
                  {"at": datetime(2026, 1, 1), "ids": bytes(8)})
        c.execute(text("insert into chunks (generation_id, seq, token_start, token_ids, text, source, created_at) "
                       "values (1, 0, 0, :ids, ' old', 'ai', :at)").bindparams(at),
                  {"at": datetime(2026, 1, 1), "ids": bytes(8)})
    engine.dispose()
    store = open_store(blank_db_url)
    assert store.token_at(1, 1).choices is None and store.span(1, 0).recorded == [False, False]
    assert store.get_generation(1).text == " old"
    store.close()


def test_a_chunk_with_tokens_missing_alternatives_stores_none(db_url):
    """A flush whose tokens did not all come with alternatives stores none for the chunk, never misaligned ones."""
    store = open_store(db_url)
    gen_id = write_draft(store, [([10, 21], " a b", [Choices(0.5, (10,), (0.5,))])])
    assert store.token_at(gen_id, 0).choices is None and store.span(gen_id, 0).recorded == [False, False]
    store.close()
