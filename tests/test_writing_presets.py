"""Writing presets (tokenswift/text/writing_presets.py): parsing refuses bad files by the key at fault; the command line
reads --preset under its explicit flags and prints the built-ins; the API lists them; the app's panel shows a
preset or refuses it whole; and every built-in preset keeps TokenSwift exact (float64, stories260k, n-grams,
context shifts with Memory and Author's Note, resume from stored ids)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fastapi.testclient import TestClient
from speed import AR, speed
from test_context_shift import MEMORY, NOTE, first_difference
from test_exactness import PROMPT, random_heads

from storage import open_store
from tokenswift.cli.main import main
from tokenswift.decode.generate import Generator
from tokenswift.settings import WRITING_DEFAULTS, DraftSettings, Settings, SettingsError, writing_settings
from tokenswift.text.context_window import pinned_ids
from tokenswift.text.writing_presets import (
    FIELDS,
    MAX_BYTES,
    built_in,
    parse_preset,
    preset_json,
    preset_of,
    read_preset,
    to_settings,
)
from ui.api.api import create_app
from ui.api.api_input import GenerationIn
from ui.api.api_input import to_settings as api_settings
from ui.forms.forms import FormError, SettingsForm, form_from_settings
from ui.write.presets import panel_form

CREATIVE = "Creative (XTC)"


@pytest.mark.parametrize(("text", "field", "words"), [
    ('{"temprature": 0.5}', "temprature", "unknown setting"),
    ('{"seed": 3}', "seed", "not part of a preset"),  # a draft's own, not a way of writing
    ('{"penalty_length": 64}', "penalty_length", "write it as penalty_window"),  # the store's old name
    ('{"dry_base": 1.0}', "dry_base", "must be in (1, 10]"),
    ('{"xtc_threshold": 0.7}', "xtc_threshold", "must be in 0..0.5"),
    ('{"penalty_window": -1}', "penalty_window", "must be in 0..131072"),
    ('{"temperature": "hot"}', "temperature", "must be a number"),
    ('{"dry_range": 64.5}', "dry_range", "must be a whole number"),
    ('{"ban_eos": 1}', "ban_eos", "must be true or false"),
    ('{"dry_breakers": "\\n"}', "dry_breakers", "must be a list of texts"),  # a string would split into letters
    ('{"dry_breakers": [1]}', "dry_breakers", "must be a list of texts"),
    ('{"min_p": NaN}', "min_p", "must be a number"),
    ('{"dry_multiplier": 1e999}', "dry_multiplier", "must be a number"),
    ('{"penalty_window": 99999999999999999999}', "penalty_window", "must be a whole number"),
    ('[{"temperature": 0.5}]', "preset", "must be a JSON object"),
    ('"temperature"', "preset", "must be a JSON object"),
    ('{"temperature": 0.5', "preset", "is not valid JSON"),
    ("[" * 50_000, "preset", "is not valid JSON"),
    (b"\xff\xfe{}", "preset", "is not valid JSON"),
])
def test_a_bad_preset_is_refused_by_its_key(text, field, words):
    with pytest.raises(SettingsError) as caught:
        parse_preset(text)
    assert caught.value.field == field and words in str(caught.value)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path):
    huge = tmp_path / "huge.json"
    huge.write_text('{"temperature": 0.5, "dry_breakers": [' + ", ".join(['"x"'] * 20_000) + "]}")
    assert huge.stat().st_size > MAX_BYTES
    with pytest.raises(SettingsError, match="larger than 64 KB") as caught:
        read_preset(huge)
    assert caught.value.field == "preset"
    with pytest.raises(SettingsError, match="cannot read") as caught:
        read_preset(tmp_path / "absent.json")
    assert caught.value.field == "preset"


def test_a_preset_round_trips_and_a_left_out_key_takes_its_writing_default(tmp_path):
    mine = writing_settings(temperature=0.7, min_p=0.0, top_p=0.92, penalty_window=128, dry_breakers=("\n", "."),
                            xtc_probability=0.3, ban_eos=False)
    path = tmp_path / "mine.json"
    path.write_text(preset_json(preset_of(mine)))
    back = to_settings(read_preset(path))
    assert all(getattr(back, field) == getattr(mine, field) for field in FIELDS)
    assert parse_preset('{"temperature": 0.5}') == {"temperature": 0.5}
    assert to_settings({"temperature": 0.5}) == writing_settings(temperature=0.5)
    assert set(WRITING_DEFAULTS) <= set(FIELDS)  # a writer's default is in a preset


def test_built_in_presets_are_complete_distinct_and_valid_api_settings():
    presets = built_in()
    assert {"Writing defaults", "Greedy (deterministic)", CREATIVE, "Penalty only (DRY off)"} <= set(presets)
    assert to_settings(presets["Writing defaults"]) == writing_settings()
    assert to_settings(presets["Greedy (deterministic)"]).temperature == 0
    assert to_settings(presets[CREATIVE]).xtc_probability > 0
    assert to_settings(presets["Penalty only (DRY off)"]).dry_multiplier == 0
    assert len({json.dumps(p, sort_keys=True) for p in presets.values()}) == len(presets)
    for preset in presets.values():
        # every key but the banned phrases, which a built-in leaves as the writer has them
        assert set(preset) == set(FIELDS) - {"ban"} and parse_preset(preset_json(preset)) == preset
        request = GenerationIn.model_validate({"prompt": "x", "max_new_tokens": 5, "settings": preset})
        assert api_settings(request).settings.replace(max_new_tokens=1024) == to_settings(preset)  # the same


# -- command line ------------------------------------------------------------------------------------------


def generated_settings(stories_path, tmp_path, *flags: str) -> dict:
    out = tmp_path / "out.json"
    code = main(["generate", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "2",
                 "--json", str(out), *flags])
    assert code == 0
    return json.loads(out.read_text())["settings"]


def test_cli_preset_under_explicit_flags(stories_path, tmp_path, capsys):
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"temperature": 0.5, "penalty_window": 64, "dry_multiplier": 0.3,
                                  "dry_breakers": ["."], "xtc_probability": 0.4, "ban_eos": False,
                                  "ban": ["a testament to"]}))
    got = generated_settings(stories_path, tmp_path, "--preset", str(preset))
    assert (got["temperature"], got["penalty_window"], got["dry_multiplier"], got["dry_breakers"],
            got["xtc_probability"], got["ban_eos"], got["ban"]) == (0.5, 64, 0.3, ["."], 0.4, False,
                                                                    ["a testament to"])
    assert got["min_p"] == WRITING_DEFAULTS["min_p"]  # not in the file: the writing default
    # A flag given on the command line wins, even when it repeats the flag's default value (0.9, --ban-eos).
    got = generated_settings(stories_path, tmp_path, "--preset", str(preset), "--temperature", "0.9",
                             "--ban-eos", "--dry-breakers", "\\n", "--penalty-window", "256", "--ban", "tapestry of")
    assert (got["temperature"], got["ban_eos"], got["dry_breakers"], got["penalty_window"], got["ban"]) == (
        0.9, True, ["\n"], 256, ["tapestry of"])
    assert (got["dry_multiplier"], got["xtc_probability"]) == (0.3, 0.4)  # the rest still the preset's
    capsys.readouterr()


@pytest.mark.parametrize(("content", "start"), [
    ('{"dry_base": 0.5}', "error: dry_base: must be in (1, 10] (in "),
    ('{"sead": 1}', "error: sead: unknown setting"),
    ('{"temperature": "warm"}', "error: temperature: must be a number"),
    ("not json", "error: preset: is not valid JSON"),
    (None, "error: preset: cannot read"),
])
def test_cli_refuses_a_bad_preset_with_exit_2(stories_path, tmp_path, capsys, content, start):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    for command in (["generate"], ["bench", "--warmup-tokens", "0"]):
        code = main([*command, "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "4",
                     "--preset", str(path)])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(start) and "Traceback" not in err


def test_cli_bench_takes_a_preset(stories_path, tmp_path, capsys):
    preset = tmp_path / "creative.json"
    assert main(["presets", CREATIVE]) == 0
    preset.write_text(capsys.readouterr().out)
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "24",
                 "--warmup-tokens", "0", "--preset", str(preset), "--xtc-threshold", "0.2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical"] and result["new_tokens"] == 24
    assert (result["settings"]["xtc_probability"], result["settings"]["xtc_threshold"]) == (0.5, 0.2)  # flag wins
    capsys.readouterr()


def test_cli_prints_the_built_in_presets(capsys):
    assert main(["presets"]) == 0
    assert json.loads(capsys.readouterr().out) == built_in()
    assert main(["presets", "Greedy (deterministic)"]) == 0
    assert json.loads(capsys.readouterr().out)["temperature"] == 0
    assert main(["presets", "Fancy"]) == 2
    assert capsys.readouterr().err.startswith("error: name: no built-in preset 'Fancy'")


# -- API -------------------------------------------------------------------------------------------------


def test_api_lists_the_built_in_presets(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    try:
        client = TestClient(create_app(store))
        answer = client.get("/api/presets")
        assert answer.status_code == 200 and answer.json() == built_in()
        made = client.post("/api/generations", json={"prompt": "Once", "max_new_tokens": 30,
                                                     "settings": answer.json()[CREATIVE]})
        assert made.status_code == 201
        stored = DraftSettings.from_json(store.get_generation(made.json()["id"], with_text=False).settings_json)
        assert stored.settings == to_settings(built_in()[CREATIVE]).replace(max_new_tokens=30)
    finally:
        store.close()


# -- the app's panel -------------------------------------------------------------------------------------


def test_the_panel_shows_a_preset_and_gives_it_back():
    for preset in built_in().values():
        form = panel_form(preset)
        assert preset_of(Settings.from_dict(form.text_settings())) == {**preset, "ban": []}  # the built-ins hold no ban
    form = panel_form({"top_p": 0.9, "min_p": 0.0, "dry_breakers": ["\n", "\\", "."]})
    assert (form.sampler, form.sampler_value, form.dry_breakers) == ("top-p", 0.9, ("\\n", "\\\\", "."))
    assert form.to_settings().settings.dry_breakers == ("\n", "\\", ".")


def test_the_panel_refuses_what_it_cannot_show():
    with pytest.raises(FormError, match=r"^top_p: the Write tab draws with one of top_p, min_p and eta at a time"):
        panel_form({"top_p": 0.9})  # the writing defaults' min-p is on too
    with pytest.raises(FormError, match=r"^eta: .* turns on min_p and eta"):
        panel_form({"eta": 0.001})
    with pytest.raises(FormError, match=r"^temperature: the Write tab's slider goes up to 2"):
        panel_form({"temperature": 2.5})


def test_dry_and_xtc_boxes_reach_the_settings_by_one_path():
    form = dataclasses.replace(SettingsForm(), dry_multiplier=1.2, dry_base=2.0, dry_allowed_length=3, dry_range=64,
                               dry_breakers=("\\n", "."), xtc_threshold=0.15, xtc_probability=0.4)
    asked = form.to_settings()
    s = asked.settings
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_range, s.dry_breakers, s.xtc_threshold,
            s.xtc_probability) == (1.2, 2.0, 3, 64, ("\n", "."), 0.15, 0.4)
    assert form_from_settings(s, asked.speed).panel() == form.panel()  # opening a stored draft shows them again
    assert SettingsForm().to_settings() == DraftSettings(writing_settings(max_new_tokens=1000))
    assert dataclasses.replace(SettingsForm(), dry_breakers=[]).to_settings().settings.dry_breakers == ()  # none
    for name, value, label in (("dry_base", 1.0, "DRY growth"), ("dry_range", None, "DRY look-back"),
                               ("xtc_probability", 2, "XTC probability"), ("dry_allowed_length", 2.5,
                                                                           "DRY free repeats")):
        with pytest.raises(FormError, match=f"^{label}: "):
            dataclasses.replace(SettingsForm(), **{name: value}).to_settings()


# -- exactness -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_built_in_preset_keeps_tokenswift_exact(stories64):
    """Each built-in preset, across context shifts with Memory and Author's Note, n-grams on, and resumed from
    stored ids: TokenSwift writes the tokens of plain decoding."""
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    texts = []
    for name, preset in built_in().items():
        # A 160-token window shifts every 40 tokens from the 79th: 240 tokens cross four shifts, and the resumed
        # run starts between two of them (it rebuilds the window of the last). Lag 0: n-grams from the freshest text.
        s = to_settings(preset).replace(max_new_tokens=240, seed=5, context_window=160, note_depth=100)
        ts = speed(ngram_topk=20, ngram_lag=0, tree=(1, 2, 2))
        expected = Generator(lm, s, prompt, options=AR, pinned=pinned).run()
        gen = Generator(lm, s, prompt, options=ts, pinned=pinned)
        assert first_difference(gen.run(), expected) is None, name
        assert gen.metrics().shifts >= 3 and gen.metrics().ngram_accepted > 0, name  # shifted, n-grams accepted
        resumed = Generator(lm, s, prompt, generated_ids=expected[:130], options=ts, pinned=pinned)
        assert first_difference(resumed.run(), expected) is None, name
        texts.append(expected)
    assert len({tuple(t) for t in texts}) == len(texts)  # each preset writes its own text
