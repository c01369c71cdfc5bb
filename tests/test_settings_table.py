"""The settings table (tokenswift/settings/table.py) is the one list of what shapes the text: every front door takes
exactly its rows, under their one name; drafts saved by earlier versions, under older names, still load."""

from __future__ import annotations

import dataclasses

import pytest

from tokenswift.settings import (
    RENAMED,
    TEXT_FIELDS,
    WRITING_DEFAULTS,
    DraftSettings,
    Settings,
    SettingsError,
    writing_settings,
)
from tokenswift.settings.table import Range

# Settings.to_json() as the version before the table wrote it (commit bc1049c): the penalty's window was
# penalty_length. Drafts saved then sit in writers' databases.
SAVED_BEFORE_THE_TABLE = (
    '{"adaptive_decay": 0.9, "adaptive_target": 0.5, "ban": ["a testament to"], "ban_eos": true, "budget": null, '
    '"context_shift": null, "context_window": null, "drafter": "auto", "dry_allowed_length": 2, "dry_base": 1.75, '
    '"dry_breakers": ["\\n", ":"], "dry_multiplier": 0.8, "dry_range": 320, "eta": 0.0, "gamma": 3, '
    '"ignore_eos": false, "max_new_tokens": 5000, "min_keep": 1, "min_p": 0.1, "mode": "tokenswift", '
    '"ngram_lag": null, "ngram_topk": 20, "no_repeat_ngram": 10, "note_depth": 256, "penalty": 1.1, '
    '"penalty_length": 512, "prompt_format": "continue", "seed": 7, "shift_step": null, "sinks": 16, '
    '"stop": ["THE END"], "temperature": 0.9, "top_k": 0, "top_n_sigma": 1.5, "top_p": 1.0, "tree": [1, 3, 3, 3], '
    '"xtc_probability": 0.0, "xtc_threshold": 0.1}')
# An older draft still: before DRY, XTC, bans, no-repeat, top-nσ and Adaptive-P existed (their defaults: off).
SAVED_EARLY = ('{"mode": "ar", "seed": 3, "max_new_tokens": 300, "temperature": 1.0, "top_k": 0, "top_p": 0.9, '
               '"min_p": 0.0, "eta": 0.0, "min_keep": 1, "penalty": 1.2, "penalty_length": 1024, "gamma": 3, '
               '"tree": [1, 3, 3, 3], "ngram_topk": 20, "budget": null, "sinks": 16, "ignore_eos": false, '
               '"stop": []}')


def test_a_draft_saved_before_the_table_loads_with_its_settings():
    asked = DraftSettings.from_json(SAVED_BEFORE_THE_TABLE)
    assert asked == DraftSettings(writing_settings(max_new_tokens=5000, seed=7, penalty_window=512, top_n_sigma=1.5,
                                                   adaptive_target=0.5, dry_breakers=("\n", ":"),
                                                   ban=("a testament to",), stop=("THE END",)))
    assert DraftSettings.from_json(asked.to_json()) == asked  # and is stored again under today's name
    assert "penalty_length" not in asked.to_json()


def test_an_early_draft_loads_with_the_later_samplers_off():
    asked = DraftSettings.from_json(SAVED_EARLY)
    settings = asked.settings
    assert (asked.mode, settings.top_p, settings.penalty, settings.penalty_window) == ("ar", 0.9, 1.2, 1024)
    assert (settings.dry_multiplier, settings.xtc_probability, settings.ban, settings.no_repeat_ngram,
            settings.top_n_sigma, settings.adaptive_target) == (0.0, 0.0, (), 0, 0.0, -1.0)


def test_an_old_name_is_only_read_from_the_store():
    assert RENAMED == {"penalty_length": "penalty_window"}
    with pytest.raises(SettingsError, match="penalty_length: unknown setting"):
        Settings.from_dict({"penalty_length": 64})  # the API, the form and the command line take today's names


def test_the_store_and_the_api_show_an_old_draft_under_todays_names(sqlite_db_url):
    from sqlalchemy import text

    from storage import open_store
    from ui.api.api import settings_view

    store = open_store(sqlite_db_url)
    draft = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=8)))
    with store.engine.begin() as connection:  # as an earlier version left the row
        connection.execute(text("UPDATE generations SET settings_json = :saved WHERE id = :id"),
                           {"saved": SAVED_BEFORE_THE_TABLE, "id": draft.id})
    stored = store.get_generation(draft.id).settings_json
    store.close()
    assert DraftSettings.from_json(stored).settings.penalty_window == 512
    view = settings_view(stored)
    assert view["penalty_window"] == 512 and "penalty_length" not in view


def test_every_front_door_takes_the_tables_rows():
    from tokenswift.cli.main import build_parser
    from tokenswift.text.writing_presets import FIELDS
    from ui.api.api_input import SamplingIn
    from ui.api.openai_input import SAMPLERS
    from ui.forms.forms import LABELS, SettingsForm
    from ui.forms.samplers_panel import NAMES

    api = {row.name for row in TEXT_FIELDS if row.knob.api}
    assert set(FIELDS) == api and api <= set(SamplingIn.model_fields)
    assert {field for field, _ in SAMPLERS.values()} == {row.name for row in TEXT_FIELDS if row.knob.openai} | {
        "max_new_tokens"}
    generate = next(a for a in build_parser()._actions if a.choices and "generate" in a.choices).choices["generate"]
    flags = {a.dest: a.option_strings for a in generate._actions}
    assert all(flags[row.name] == [row.flag] for row in TEXT_FIELDS if row.knob.flag)
    assert all(LABELS[row.name] == row.knob.label for row in TEXT_FIELDS)
    form = {f.name for f in dataclasses.fields(SettingsForm)}
    assert tuple(row.name for row in TEXT_FIELDS if row.knob.panel) == NAMES and set(NAMES) <= form


def test_writing_defaults_are_the_tables():
    assert WRITING_DEFAULTS == {"temperature": 0.9, "min_p": 0.1, "penalty": 1.1, "penalty_window": 256,
                                "ban_eos": True, "dry_multiplier": 0.8, "no_repeat_ngram": 10}


@pytest.mark.parametrize(("rule", "good", "bad", "says"), [
    (Range(0, 1, open_low=True), [1, 0.5], [0, 1.01, float("nan"), True], "must be in (0, 1]"),
    (Range(0, 1, open_high=True), [0, 0.99], [1, -0.1], "must be in [0, 1)"),
    (Range(2, 4096), [2, 4096], [1, 4097], "must be in 2..4096"),
    (Range(0), [0, 10**9], [-1], "must be >= 0"),
    (Range(4, 64, off=0, says="must be 0 (off) or in 4..64 tokens"), [0, 4, 64], [1, 3, 65], "must be 0 (off)"),
])
def test_a_rows_range_checks_and_says_it(rule, good, bad, says):
    assert all(rule.holds(v, "number") for v in good)
    assert not any(rule.holds(v, "number") for v in bad)
    assert rule.problem().startswith(says)


def test_an_integer_row_refuses_a_fraction():
    with pytest.raises(SettingsError, match="dry_range: must be in 2..4096"):
        Settings(dry_range=64.5)
