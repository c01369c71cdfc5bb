"""The speed options apart from the text's settings (tokenswift/settings/speculation.py): Speculation checks its own
fields, a draft's two halves travel as one flat set of names (the front doors, the store), and rows the store kept
before the split load unchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tokenswift.settings import (
    PLAIN,
    ROPE_SLACK,
    SPEED_FIELDS,
    DraftSettings,
    Settings,
    SettingsError,
    Speculation,
)


def test_the_speed_fields_are_not_the_texts():
    assert SPEED_FIELDS == ("mode", "gamma", "tree", "ngram_topk", "ngram_lag", "budget", "sinks", "drafter")
    assert not set(SPEED_FIELDS) & {f.name for f in dataclasses.fields(Settings)}
    with pytest.raises(SettingsError, match="drafter: unknown setting"):
        Settings.from_dict({"drafter": "fused"})  # Settings alone takes only what shapes the text


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"mode": "fast"}, "mode", "must be one of tokenswift, ar"),
    ({"gamma": 0}, "gamma", "must be in 1..8"),
    ({"tree": (2, 3)}, "tree", "the first level is the base head's top-1"),
    ({"tree": (1, 3, 3, 3, 3)}, "tree", r"at most gamma\+1 = 4 levels"),
    ({"ngram_topk": 257}, "ngram_topk", "k must be in 0..256"),
    ({"ngram_lag": -1}, "ngram_lag", "must be >= 0"),
    ({"budget": 20}, "budget", r"must be >= sinks \+ 8"),
    ({"drafter": "medusa"}, "drafter", "must be one of auto, fused, paper, layer, model"),
])
def test_speculation_refuses_by_name(changes, field, words):
    with pytest.raises(SettingsError, match=words) as refused:
        Speculation(**changes)
    assert refused.value.field == field


def test_the_candidate_row_limit_binds_tokenswift_only():
    wide = dict(tree=(1, 40, 40), ngram_topk=0)
    with pytest.raises(SettingsError, match=f"at most {ROPE_SLACK} fit"):
        Speculation(**wide)
    assert Speculation(mode="ar", **wide).tree == (1, 40, 40)  # plain decoding verifies no candidates


def test_the_lag_default_follows_the_penalty_window():
    penalised, free = Settings(penalty=1.2, penalty_window=300), Settings(penalty=1.0, penalty_window=300)
    assert (Speculation().lag(penalised), Speculation().lag(free), Speculation(ngram_lag=5).lag(penalised)) == (
        300, 0, 5)


def test_a_draft_is_one_flat_set_of_names_each_to_its_half():
    asked = DraftSettings.from_dict({"max_new_tokens": 40, "min_p": 0.1, "drafter": "paper", "tree": [1, 2],
                                     "mode": "ar"})
    assert asked.settings == Settings(max_new_tokens=40, min_p=0.1)
    assert asked.speed == Speculation(drafter="paper", tree=(1, 2), mode="ar") and asked.mode == "ar"
    assert asked.replace(seed=3, ngram_topk=4) == DraftSettings(asked.settings.replace(seed=3),
                                                               asked.speed.replace(ngram_topk=4))
    flat = json.loads(asked.to_json())
    assert flat["drafter"] == "paper" and flat["min_p"] == 0.1 and "settings" not in flat  # the store's row: flat
    assert DraftSettings.from_json(asked.to_json()) == asked
    with pytest.raises(SettingsError, match="speed: unknown setting"):
        DraftSettings.from_dict({"speed": 2})


def test_a_row_kept_before_the_split_loads_unchanged():
    """The store kept Settings' 34 fields in one object; they load as the same draft (old names too)."""
    old = {**dataclasses.asdict(Settings(seed=9, penalty=1.2)), **dataclasses.asdict(PLAIN), "penalty_length": 64}
    del old["penalty_window"]
    asked = DraftSettings.from_json(json.dumps(old))
    assert asked == DraftSettings(Settings(seed=9, penalty=1.2, penalty_window=64), PLAIN)


def test_the_api_and_the_form_route_the_speed_fields():
    from ui.api.api_input import GenerationIn, to_settings
    from ui.forms.forms import SettingsForm, ar_twin

    request = GenerationIn.model_validate({"prompt": "x", "max_new_tokens": 5, "mode": "ar",
                                           "settings": {"drafter": "fused", "tree": [1, 2], "min_p": 0.2}})
    asked = to_settings(request)
    assert asked.speed == Speculation(mode="ar", drafter="fused", tree=(1, 2)) and asked.settings.min_p == 0.2
    form = SettingsForm(k=4, budget=64, drafter="paper").to_settings()
    assert form.speed == Speculation(ngram_topk=4, budget=64, drafter="paper")
    assert ar_twin(form) == DraftSettings(form.settings, PLAIN)


def test_the_engine_resolves_the_drafter_without_rewriting_the_options(stories64):
    from tokenswift.decode.engine import Engine
    from tokenswift.decode.options import EngineOptions

    ids = stories64.encode("Once upon a time")
    options = EngineOptions(speculation=Speculation(ngram_topk=4))
    engine = Engine(stories64, Settings(max_new_tokens=8, ignore_eos=True), ids, len(ids), options)
    assert engine.chosen == "fused" and engine.spec is options.speculation and engine.spec.drafter == "auto"
