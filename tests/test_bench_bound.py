"""bench-bound (tokenswift/bench/bound.py): per-shape acceptance tallied on one run, and the bound's arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from tokenswift.bench.bound import bench_bound, bound
from tokenswift.bench.shapes import random_heads
from tokenswift.settings import Settings, Speculation


@pytest.fixture(scope="module")
def result(stories32):
    lm = dataclasses.replace(stories32, heads=random_heads(stories32.config, stories32.device, stories32.dtype))
    prompt = lm.encode("Once upon a time there was a little girl who")
    settings = Settings(max_new_tokens=120, temperature=0.0, seed=2)
    return bench_bound(lm, prompt, settings, contexts=[24, 64], repeats=2, spec=Speculation(ngram_topk=8))


def test_the_widest_shape_accounts_for_every_token_written(result):
    accepted = result["acceptance"]
    widest, *others = accepted["shapes"]
    # every iteration verified the widest shape: its tokens per iteration are what the run wrote after the prefill
    assert widest["tokens"] * accepted["iterations"] == pytest.approx(accepted["new_tokens"] - 1)
    assert accepted["new_tokens"] >= 120
    # a shape accepts at most what a shape containing it accepts, and at least its root
    assert all(1 <= s["tokens"] <= widest["tokens"] for s in others)
    assert any(s["tokens"] < widest["tokens"] for s in others)


def test_the_bound_is_tokens_times_the_plain_step_over_the_pass(result):
    assert [c["context"] for c in result["contexts"]] == [24, 64]
    for c in result["contexts"]:
        times = result["pass_ms"][str(c["context"])]
        assert c["plain_step_ms"] == times["1"]
        for s in c["shapes"]:
            assert s["bound"] == pytest.approx(s["tokens"] * times["1"] / times[str(s["rows"])])
        assert c["best_bound"] == max(s["bound"] for s in c["shapes"])
    assert result["best_bound"] == max(c["best_bound"] for c in result["contexts"])


def test_a_pass_that_costs_its_rows_bounds_the_speed_up_below_one():
    accepted = {"shapes": [{"shape": "a", "rows": 4, "tokens": 2.0}, {"shape": "b", "rows": 2, "tokens": 1.5}]}
    table = bound(accepted, {100: {1: 1.0, 2: 2.0, 4: 4.0}})
    assert [s["bound"] for s in table["contexts"][0]["shapes"]] == [0.5, 0.75]
    assert table["best_bound"] == 0.75 and table["contexts"][0]["best_shape"] == "b"


def test_the_run_bound_weighs_each_context_by_the_time_it_takes():
    accepted = {"shapes": [{"shape": "a", "rows": 2, "tokens": 1.5}]}
    # plain 1 s and 3 s; the pass 1 s then 4.5 s: bounds 1.5 and 1.0; 4 s of plain against 1/1.5 + 3 s of TokenSwift
    table = bound(accepted, {100: {1: 1.0, 2: 1.0}, 200: {1: 3.0, 2: 4.5}})
    assert [c["best_bound"] for c in table["contexts"]] == [1.5, 1.0]
    assert table["run_bound"] == pytest.approx(4 / (1 / 1.5 + 3))
