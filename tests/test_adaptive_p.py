"""Adaptive-P (sampling/adaptive_p.py): the transform and the history against a direct reading of the definition,
then on stories260k in float64: it changes the text, its average moves toward the target, and TokenSwift with it
on emits exactly plain decoding's tokens (a tree and n-grams, the adaptive engine, a resume from the middle,
context shifts); the fast path refuses it by name; the flags, the API's and the OpenAI endpoint's names."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from speed import AR, speed
from test_context_shift import MEMORY, NARROW, NOTE, first_difference
from test_exactness import PROMPT, random_heads
from test_top_n_sigma import check_exact_and_acting

from tokenswift.cli.main import main
from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.sampling.adaptive_p import AdaptiveP, steered
from tokenswift.sampling.in_graph import DeviceSampler
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Settings, SettingsError
from tokenswift.text.context_window import pinned_ids
from ui.api.openai_input import OpenAIError, parse_options


def reference_run(rows: list[list[float]], target: float, decay: float, pick) -> list[tuple[list[float], float]]:
    """The definition read step by step: each row's new scores and the adjusted target it was steered to."""
    weighted, weight, out = target / (1 - decay), 1 / (1 - decay), []
    for row in rows:
        top = max(x for x in row if math.isfinite(x))
        exps = [math.exp(x - top) if math.isfinite(x) else 0.0 for x in row]
        probs = [e / sum(exps) for e in exps]
        a = min(max(2 * target - weighted / weight, 0.0), 1.0)
        dists = [abs(p - a) / 0.3 for p in probs]
        new = [5.0 - 10.0 * d * d / (1 + d) if math.isfinite(x) else -math.inf for d, x in zip(dists, row, strict=True)]
        out.append((new, a))
        chosen = pick(new)
        weighted, weight = probs[chosen] + decay * weighted, 1 + decay * weight
    return out


def test_the_transform_and_history_follow_the_definition():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(40, 30, dtype=torch.float64, generator=gen) * 2
    rows[torch.rand(40, 30, generator=gen) < 0.3] = -math.inf
    rows[:, 0] = 1.0
    pick = lambda scores: max(range(len(scores)), key=scores.__getitem__)  # noqa: E731
    history = AdaptiveP(0.35, 0.8)
    history.restart(100)
    for i, (want, a) in enumerate(reference_run(rows.tolist(), 0.35, 0.8, pick)):
        assert history.adjusted(100 + i) == pytest.approx(a, abs=1e-12)
        got, probs = steered(rows[i:i + 1], history.adjusted(100 + i))
        assert got[0].tolist() == pytest.approx(want, abs=1e-12)
        history.chose(100 + i, float(probs[0, pick(got[0].tolist())]))
    with pytest.raises(RuntimeError, match="no history for position 200"):
        history.adjusted(200)


def test_the_history_is_keyed_by_position():
    history = AdaptiveP(0.5, 0.9)
    history.restart(10)
    assert history.adjusted(10) == pytest.approx(0.5) and history.average() == pytest.approx(0.5)
    for position, prob in zip(range(10, 15), (0.9, 0.8, 0.95, 0.7, 0.9), strict=True):
        history.chose(position, prob)
    assert history.adjusted(15) < 0.5  # a run of likely words: it aims lower
    after_two = history.adjusted(12)
    history.chose(12, 0.1)  # position 12 chosen again (a walk's cut, a rewind): what followed it is gone
    assert len(history.sums) == 4 and history.adjusted(12) == after_two and history.adjusted(13) > after_two


def test_out_of_range_values_are_refused_by_name():
    for field, bad in (("adaptive_target", 1.5), ("adaptive_target", math.nan), ("adaptive_decay", 1.0),
                       ("adaptive_decay", -0.1)):
        with pytest.raises(SettingsError, match=field):
            Settings(**{field: bad})
    assert Sampler(Settings(), 10, "cpu").adaptive is None and Settings(adaptive_target=-0.5).adaptive_target < 0


def test_the_fast_paths_sampler_refuses_it():
    with pytest.raises(SettingsError, match="adaptive_target"):
        DeviceSampler(Sampler(Settings(adaptive_target=0.5), 10, "cpu"), torch.zeros(8, dtype=torch.int64))


AP = dict(temperature=1.0, min_p=0.02, adaptive_target=0.35, adaptive_decay=0.9)
CASES = [("fused", 20, False, 1, AP), ("fused", 20, True, 2, {**AP, "penalty": 1.2, "penalty_window": 32}),
         ("paper", 5, False, 3, {**AP, "adaptive_target": 0.6, "adaptive_decay": 0.5, "top_n_sigma": 2.0,
                                 "dry_multiplier": 0.8, "dry_range": 64})]


@pytest.mark.slow
@pytest.mark.parametrize(("drafter", "k", "adaptive", "seed", "sampling"), CASES)
def test_tokenswift_equals_ar_with_adaptive_p(stories64, drafter, k, adaptive, seed, sampling):
    lm, s, prompt, expected, ts = check_exact_and_acting(stories64, drafter, k, adaptive, seed, sampling,
                                                         {"adaptive_target": -1.0})
    # the history recomputed from replayed rows
    resumed = Generator(lm, s, prompt, generated_ids=expected[:150], options=ts)
    assert first_difference(resumed.run(), expected) is None


@pytest.mark.slow
def test_tokenswift_equals_ar_with_adaptive_p_across_shifts(stories64):
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    s = Settings(max_new_tokens=300, seed=4, ignore_eos=True, context_window=NARROW, note_depth=100,
                 **AP)
    expected = Generator(lm, s, prompt, options=AR, pinned=pinned).run()
    gen = Generator(lm, s, prompt, options=speed(tree=(1, 2, 2)), pinned=pinned)
    assert first_difference(gen.run(), expected) is None and gen.metrics().shifts >= 3
    for cut in (170, 230):  # past a shift, the history restarted there and recomputed since
        resumed = Generator(lm, s, prompt, generated_ids=expected[:cut], options=speed(tree=(1, 2, 2)), pinned=pinned)
        assert first_difference(resumed.run(), expected) is None


def chosen_average(lm, settings: Settings, prompt: list[int], steps: int) -> float:
    """The plain average of the original probabilities of the tokens a run chose (Adaptive-P's own history)."""
    engine = Engine(lm, settings, prompt, len(prompt), AR)
    engine.start()
    for _ in range(steps):
        engine.ar_step()
    history = engine.sampler.adaptive
    probs = [b - settings.adaptive_decay * a for (a, _), (b, _) in zip(history.sums, history.sums[1:], strict=False)]
    return sum(probs) / len(probs)


@pytest.mark.slow
def test_the_average_moves_toward_the_target(stories64):
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=400, seed=6, ignore_eos=True, temperature=1.0, min_p=0.02)
    low = chosen_average(stories64, s.replace(adaptive_target=0.1, adaptive_decay=0.9), prompt, 300)
    high = chosen_average(stories64, s.replace(adaptive_target=0.9, adaptive_decay=0.9), prompt, 300)
    assert low < 0.35 < high, (low, high)


def test_the_flags_reach_the_settings(stories_path, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "16",
                 "--warmup-tokens", "0", "--adaptive-target", "0.4", "--adaptive-decay", "0.8",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical"] and (result["settings"]["adaptive_target"], result["settings"]["adaptive_decay"]) == (
        0.4, 0.8)
    capsys.readouterr()
    code = main(["generate", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "3",
                 "--adaptive-decay", "1.5"])
    assert code == 2 and "error: adaptive_decay:" in capsys.readouterr().err


def test_openai_clients_names_for_adaptive_p():
    settings = parse_options({"adaptive_target": 0.3, "adaptive_decay": 0.95}, "chat").settings
    assert (settings.adaptive_target, settings.adaptive_decay) == (0.3, 0.95)
    assert parse_options({"adaptive_target": -1}, "completion").settings.adaptive_target == -1  # llama.cpp's "off"
    with pytest.raises(OpenAIError) as error:
        parse_options({"adaptive_target": 1.2}, "completion")
    assert error.value.param == "adaptive_target" and error.value.status == 400
