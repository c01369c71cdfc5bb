"""World Info (tokenswift/text/world_info.py): documents checked by entry and field; entries active while their keys are
in the story's last `depth` tokens (secondary keys, constant, disabled, case, whole words), within their budget;
placed after the Memory (in a chat draft's system turn); and exact: TokenSwift emits plain decoding's tokens in
float64 on stories260k while an entry enters mid-run, with n-grams, context shifts, Memory and note, and a run
resumed from stored ids continues the same stream. Then the store (SQLite, migration 0006), the worker picking an
edit up at a shift, the "what the model sees" view, the CLI, the API and the Write tab's import."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime

import pytest
from conftest import need_shared
from speed import AR, speed
from sqlalchemy import DateTime, bindparam, text
from test_context_shift import first_difference, lm_with, resumed
from test_exactness import SAMPLERS
from test_instruction_drafts import INSTRUCTION, chat64  # noqa: F401 - chat64 is a fixture used below

from storage import open_store
from storage.db import make_engine
from storage.migrate import upgrade
from storage.records import ModelSpec, Owner, Progress
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.settings import DraftSettings, Settings, SettingsError
from tokenswift.text.context_window import WindowPlan, pinned_ids
from tokenswift.text.prompting import prompt_ids
from tokenswift.text.world_info import CHECKPOINT, WorldInfo

PROMPT = "The old lighthouse keeper climbed the stairs and"
MEMORY = "Tom is a fisherman. Lily is his sister. They live by the sea."
NOTE = "Lily finds a shell."
N = 500
SLOW = 30_000  # ms: a shared 2-core machine under load answers the browser's events late
# "Lily" is first written some hundred tokens into these runs; the constant entry is in from the start.
LORE = {"depth": 128, "entries": [
    {"keys": ["Lily"], "content": "Lily has a red kite and a little dog."},
    {"keys": ["mom"], "secondary_keys": ["Lily"], "content": "Mom bakes bread every morning."},
    {"keys": [], "content": "The lighthouse stands on a cliff.", "constant": True},
    {"keys": ["Tom"], "content": "Tom never goes out in a storm.", "enabled": False}]}


def doc(*entries: dict, depth: int = 1024) -> WorldInfo:
    return WorldInfo.from_dict({"depth": depth, "entries": list(entries)})


def entry(keys, content="Some lore.", **more) -> dict:
    return {"keys": keys, "content": content, **more}


# -- the document ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "field", "words"), [
    ([], "world_info", "must be an object"),
    ({"depth": 0}, "world_info.depth", "1..100000"),
    ({"depth": True}, "world_info.depth", "whole number"),
    ({"entries": {}}, "world_info.entries", "list"),
    ({"entries": [entry(["x"])] * 257}, "world_info.entries", "at most 256"),
    ({"colour": "red"}, "world_info.colour", "unknown field"),
    ({"entries": [entry(["Lily"]), "Lily"]}, "world_info.entries[1]", "must be an object"),
    ({"entries": [entry(["Lily"]), entry("Lily")]}, "world_info.entries[1].keys", "list of words"),
    ({"entries": [entry(["Lily"]), entry([])]}, "world_info.entries[1].keys", "at least one key"),
    ({"entries": [entry(["/li+ly/"])]}, "world_info.entries[0].keys", "keys are plain words"),
    ({"entries": [entry([".*"])]}, "world_info.entries[0].keys", "keys are plain words"),
    ({"entries": [entry(["[a-z]"])]}, "world_info.entries[0].keys", "keys are plain words"),
    ({"entries": [entry(["/ly/"])]}, "world_info.entries[0].keys", "not patterns"),
    ({"entries": [entry(["x" * 101])]}, "world_info.entries[0].keys", "1 to 100 characters"),
    ({"entries": [entry(["Lily"], secondary_keys=["a|b"])]}, "world_info.entries[0].secondary_keys", "plain words"),
    ({"entries": [entry(["Lily"], content="  ")]}, "world_info.entries[0].content", "1 to 2000"),
    ({"entries": [entry(["Lily"], content="x" * 2001)]}, "world_info.entries[0].content", "1 to 2000"),
    ({"entries": [entry(["Lily"], content="\ud800")]}, "world_info.entries[0].content", "not valid Unicode"),
    ({"entries": [entry(["Lily"], constant="yes")]}, "world_info.entries[0].constant", "true or false"),
    ({"entries": [entry(["Lily"], priority=1)]}, "world_info.entries[0].priority", "unknown field"),
])
def test_bad_documents_are_refused_by_entry_and_field(value, field, words):
    with pytest.raises(SettingsError) as refused:
        WorldInfo.from_dict(value)
    assert refused.value.field == field and words in str(refused.value)


def test_documents_round_trip_and_bad_json_is_named():
    info = WorldInfo.from_dict(LORE)
    assert WorldInfo.from_json(info.to_json()) == info and WorldInfo.from_dict(None) == WorldInfo()
    assert WorldInfo.from_json("") == WorldInfo() and WorldInfo().to_json() == ""
    assert info.entries[1].secondary_keys == ("Lily",) and info.entries[3].enabled is False
    assert json.loads(info.to_json())["entries"][2] == {"keys": [], "secondary_keys": [], "constant": True,
                                                        "content": "The lighthouse stands on a cliff.",
                                                        "enabled": True}
    with pytest.raises(SettingsError) as bad:
        WorldInfo.from_json('{"entries": [')
    assert bad.value.field == "world_info" and "not valid JSON" in str(bad.value)


# -- which entries are in ----------------------------------------------------------------------------


def active(lm, info: WorldInfo, story: str, window: int = 4096) -> list[int]:
    """The entries a window built after `story` holds."""
    ids = lm.encode(story)
    plan = WindowPlan(ids, 1, pinned_ids(lm, "", "", world=info), size=window, step=window // 4, note_depth=8)
    return list(plan.active(ids, len(ids)))


def test_activation_keys_depth_secondary_constant_disabled_case_and_whole_words(stories64):
    info = doc(entry(["Lily"]), entry(["red ball"], secondary_keys=["park", "garden"]),
               entry([], constant=True), entry(["dog"], enabled=False), entry(["old mill"]))
    assert active(stories64, info, "Once upon a time there was a cat.") == [2]  # the constant one alone
    assert active(stories64, info, "Then LILY saw a dog.") == [0, 2]  # any case; a disabled entry never
    assert active(stories64, info, "They sat on the lilypad by Lilyan.") == [2]  # whole words only
    assert active(stories64, info, "Lily's hat") == [0, 2]
    assert active(stories64, info, "He found a red ball.") == [2]  # a secondary key is needed too
    assert active(stories64, info, "In the Garden he found a red\nball.") == [1, 2]  # phrase across a line break
    assert active(stories64, info, "They walked to the old   mill.") == [2, 4]
    far = "Lily went home. " + "The sun was warm and the birds sang. " * 30
    assert active(stories64, info, far) == [0, 2]  # within the default depth of 1,024 tokens
    assert active(stories64, doc(*info.to_dict()["entries"], depth=64), far) == [2]  # out of depth: out


def test_the_budget_takes_constant_entries_first_then_list_order(stories64):
    long = "The harbour town has narrow streets, a fish market and a chapel on the hill above the bay."
    info = doc(entry(["Lily"], long), entry(["Lily"], "Lily is nine."), entry([], long, constant=True))
    sizes = [len(c) for c in pinned_ids(stories64, "", "", world=info).world.contents]
    window = 4 * (sizes[2] + sizes[1])  # a quarter holds the constant entry and the short one, not the long
    assert active(stories64, info, "Lily ran.", window) == [1, 2]
    assert active(stories64, info, "Lily ran.", 4 * sum(sizes)) == [0, 1, 2]


def test_entries_sit_after_the_memory_and_a_checkpoint_rebuilds_the_window(stories64):
    info = doc(entry(["Lily"], "Lily has a dog."), depth=CHECKPOINT)
    pinned = pinned_ids(stories64, MEMORY, "", world=info)
    prompt = stories64.encode(PROMPT)
    plan = WindowPlan(prompt, 1, pinned, size=512, step=128, note_depth=8)
    assert plan.reserve == len(pinned.world.contents[0]) and plan.fixed == 1 + len(pinned.memory) + plan.reserve
    story = prompt + stories64.encode(" " + "The sea was calm. " * 60)[1:]
    ids = story[:len(prompt) + 70] + stories64.encode(" Lily.")[1:] + story[len(prompt) + 70:]
    key_at = len(prompt) + 70
    check = plan.next_checkpoint(key_at)
    assert check == len(prompt) + 2 * CHECKPOINT and plan.boundary(check) == len(prompt)
    assert plan.built(ids, check - 1) == len(prompt) and plan.built(ids, check) == check  # the entry came in
    before = ["shifted", "frame", "memory", "frame", "frame", "story", "story"]
    assert [kind for kind, _ in plan.seen(ids[:check - 1])] == before
    seen = plan.seen(ids[:check + 5])
    assert [kind for kind, _ in seen] == [*before[:3], "world info", *before[3:]]
    assert seen[3][1] == list(pinned.world.contents[0]) and seen[6][1] == ids[1:check]
    assert plan.window(ids, len(prompt), check)[:1 + len(pinned.memory) + plan.reserve] == \
        [1, *pinned.memory, *pinned.world.contents[0]]
    # out of depth again at a later checkpoint: rebuilt without it there
    gone = next(c for c in range(check, len(ids), CHECKPOINT) if plan.active(ids, c) == ())
    assert plan.built(ids, gone) == gone and "world info" not in [kind for kind, _ in plan.seen(ids[:gone])]


def test_an_instruction_draft_has_its_world_info_in_the_system_turn(chat64):  # noqa: F811 - the fixture
    info = doc(entry(["Max"], "Max is afraid of thunder."))
    prompt = prompt_ids(chat64, INSTRUCTION, "instruction", "Max ran to the park.")
    for memory, system in ((MEMORY, f"{MEMORY}\nMax is afraid of thunder."), ("", "\nMax is afraid of thunder.")):
        plan = WindowPlan(prompt, 0, pinned_ids(chat64, memory, "", INSTRUCTION, info), size=512, step=64,
                          note_depth=8)
        window = chat64.tokenizer.decode(plan.window(prompt, len(prompt), len(prompt)))
        want = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{INSTRUCTION}<|im_end|>\n"
                "<|im_start|>assistant\nMax ran to the park.")
        assert squeezed(window) == squeezed(want)  # pieces tokenized apart: compare all but the spaces


def squeezed(text: str) -> str:
    return "".join(text.split())


# -- exactness ----------------------------------------------------------------------------------------


def settings(sampler: str, **changes) -> Settings:
    return Settings(max_new_tokens=N, seed=4, ignore_eos=True, note_depth=64, **SAMPLERS[sampler]).replace(**changes)


def drafting(**changes) -> EngineOptions:
    return speed(budget=48, tree=(1, 2, 2), **changes)


def entered_mid_run(plan: WindowPlan, ids: list[int], prompt_len: int) -> int:
    """The first checkpoint whose entries hold entry 0 (keyed "Lily"), which the first window lacks."""
    assert 0 not in plan.active(ids, prompt_len)
    return next(c for c in range(prompt_len + CHECKPOINT, len(ids), CHECKPOINT) if 0 in plan.active(ids, c))


def rebuilt_between_shifts(plan: WindowPlan, ids: list[int], prompt_len: int) -> list[int]:
    """The checkpoints where the window was built again for its entries alone (no shift there)."""
    return [c for c in range(prompt_len + CHECKPOINT, len(ids), CHECKPOINT)
            if plan.built(ids, c) == c != plan.boundary(c)]


def followed(gen: Generator) -> list[int]:
    """Run gen, checking after every iteration that the window the engine predicted its last token from is the
    plan's for that token (WindowPlan.built: the one a plain step and a resume would use)."""
    for _ in gen.steps():
        engine = gen._engine
        ids, plan = engine.ids, engine.window.plan
        last = len(ids) - 1
        at = plan.built(ids, last)
        assert engine.buf[:engine.length + 1].tolist() == plan.window(ids, plan.boundary(last), at) + ids[at:], last
    return gen.produced


# (sampler, k, context window, with Memory and note, adaptive). A 384-token window shifts by 96: three shifts, and
# entries change between them too.
CASES = [("minp-penalty", 20, 384, True, False), ("top-p", 0, None, False, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "k", "window", "with_pinned", "adaptive"), CASES)
def test_tokenswift_equals_ar_while_entries_come_and_go(stories64, sampler, k, window, with_pinned, adaptive):
    lm, prompt = lm_with(stories64, 4), stories64.encode(PROMPT)
    pinned = pinned_ids(lm, *((MEMORY, NOTE) if with_pinned else ("", "")), world=WorldInfo.from_dict(LORE))
    s = settings(sampler, context_window=window)
    plain = Generator(lm, s, prompt, options=AR, pinned=pinned)
    expected = plain.run()
    entered = entered_mid_run(plain.plan, prompt + expected, len(prompt))
    assert rebuilt_between_shifts(plain.plan, prompt + expected, len(prompt))
    options = dataclasses.replace(drafting(ngram_topk=k), adaptive=adaptive)
    gen = Generator(lm, s, prompt, pinned=pinned, options=options)
    assert first_difference(followed(gen), expected) is None
    assert gen.metrics().steps < N  # drafts were accepted between the checkpoints
    use = gen.context_use()
    assert use.frame + use.memory + use.recent == gen._engine.length + 1 and use.frame + use.memory <= gen.plan.fixed
    if window is not None:
        assert gen.plan.b1 + gen.plan.step < len(prompt) + N  # regular shifts too, not only checkpoints
    else:  # no shift: World Info alone changed the text, from the checkpoint where "Lily" came in
        without = WorldInfo.from_dict({**LORE, "entries": LORE["entries"][1:]})
        bare = Generator(lm, s, prompt, options=AR, pinned=pinned_ids(lm, "", "", world=without)).run()
        differ = first_difference(bare, expected)
        assert differ is not None and differ >= entered - len(prompt)


@pytest.mark.slow
def test_resume_from_stored_ids_continues_the_same_stream(stories64):
    """Cut just before, at and after a checkpoint where the entries changed, and at a shift; each resumed run
    goes on past two more checkpoints (a shorter run writes a prefix of the longer one)."""
    lm, prompt = lm_with(stories64, 4), stories64.encode(PROMPT)
    pinned = pinned_ids(lm, MEMORY, NOTE, world=WorldInfo.from_dict(LORE))
    s, ts = settings("minp-penalty", context_window=384), drafting(ngram_topk=20)
    straight = Generator(lm, s, prompt, options=ts, pinned=pinned)
    ids = straight.run()
    plan = straight.plan
    changed = rebuilt_between_shifts(plan, prompt + ids, len(prompt))[0]
    cuts = [("tokenswift", changed - 1), ("ar", changed), ("tokenswift", changed + 1), ("tokenswift", plan.b1)]
    for mode, cut in cuts:
        got, want = resumed(lm, s, prompt, ids, cut - len(prompt), 2 * CHECKPOINT, pinned, ts.speculating(mode=mode))
        assert got == want, (mode, cut)


# -- the store, the worker and the views ---------------------------------------------------------------


def test_the_store_keeps_world_info_per_draft_and_carries_it_on(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    lore = WorldInfo.from_dict(LORE).to_json()
    gen = store.enqueue_generation("Once", DraftSettings(Settings(max_new_tokens=4)), memory="Tom fishes.",
                                   world_info=lore)
    assert gen.world_info == lore and store.get_generation(gen.id).world_info == lore
    owner = Owner.here("w")
    assert store.claim_next(owner).world_info == lore  # what the worker builds windows from
    assert store.record_start(gen.id, owner, [1, 4], "model", None)
    store.append_progress(gen.id, owner, Progress([5, 6], " upon", 0.1), finish="done", finish_reason="length")
    assert store.set_context_text(gen.id, "Tom fishes.", "Rain.").world_info == lore  # None: left as it is
    other = WorldInfo.from_dict({"entries": [entry(["Tom"])]}).to_json()
    assert store.set_context_text(gen.id, "Tom fishes.", "Rain.", other).world_info == other
    assert store.context_text(gen.id) == ("Tom fishes.", "Rain.", other)
    assert store.continue_generation(gen.id, DraftSettings(Settings(max_new_tokens=4))).world_info == other
    assert store.save_edit(gen.id, "Once upon a time").world_info == other  # a writer's revision keeps it
    store.close()


def test_migration_0006_gives_existing_drafts_no_world_info(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    upgrade(engine, "0005")
    at = bindparam("at", type_=DateTime)
    with engine.begin() as c:
        c.execute(text("insert into sessions (id, title, author, created_at, updated_at) values (1, 't', '', :at, :at)"
                       ).bindparams(at), {"at": datetime(2026, 1, 1)})
        c.execute(text("insert into generations (id, session_id, prompt_text, mode, seed, settings_json, "
                       "target_tokens, status, produced_tokens, chunk_count, created_at, elapsed_s, memory) values "
                       "(1, 1, 'old', 'ar', 0, '{}', 5, 'done', 0, 0, :at, 0, 'Tom.')").bindparams(at),
                  {"at": datetime(2026, 1, 1)})
    engine.dispose()
    store = open_store(url)
    gen = store.get_generation(1)
    assert (gen.prompt_text, gen.memory, gen.world_info) == ("old", "Tom.", "")
    store.close()


@pytest.mark.slow
def test_the_worker_places_world_info_and_picks_an_edit_up_at_the_next_shift(tmp_path, stories64, stories_path):
    from worker.job import FlushPolicy, JobRun, draft_pinned

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    s = settings("minp-penalty", max_new_tokens=400, context_window=256)
    lore, edited = WorldInfo.from_dict(LORE).to_json(), json.dumps({"entries": [entry([], "Tom is a giant.",
                                                                                      constant=True)]})
    gen_id = store.enqueue_generation(PROMPT, DraftSettings(s, drafting(mode="ar").speculation), world_info=lore).id
    owner = Owner.here("w")

    def stopping() -> bool:  # the writer edits the World Info early on, before the first shift
        if run.gen.produced and store.context_text(gen_id)[2] == lore:
            store.set_context_text(gen_id, "", "", edited)
        return False

    run = JobRun(store, owner, store.claim_next(owner), stories64, ModelSpec(str(stories_path), None, "cpu",
                                                                              "float64"), FlushPolicy(0.0, 8), stopping)
    assert run.run() == "done"
    prompt = stories64.encode(PROMPT)
    expected = Generator(stories64, s, prompt, options=AR, pinned=draft_pinned(stories64, "", "", lore, None),
                         pinned_source=lambda: draft_pinned(stories64, "", "", edited, None)).run()
    assert store.get_tokens(gen_id).generated_ids == expected
    assert expected != Generator(stories64, s, prompt, options=AR,
                                 pinned=draft_pinned(stories64, "", "", lore, None)).run()
    store.close()


def test_what_the_model_sees_labels_the_world_info(tmp_path):
    from ui.drafts.tokens import PromptTokens
    from ui.write import seen

    model = str(need_shared())
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    store.set_desired_model(ModelSpec(model, None, "cpu", "float32"))
    lore = doc(entry(["fox"], "Red is a fox who loves berries."), entry(["owl"], "The owl is wise.")).to_json()
    gen = store.enqueue_generation("The fox ran into the woods.", DraftSettings(Settings(max_new_tokens=20)),
                                   world_info=lore)
    view = seen.context_html(store, PromptTokens(store), gen.id)
    pieces = re.findall(r'<span class="ts-seen-world-info"[^>]*>([^<]*)</span>', view)
    assert [p.strip() for p in pieces] == ["Red is a fox who loves berries."]  # no owl in the story
    assert re.search(r"World Info \d+ · Author", view) and "World Info</span>" in view  # count and legend
    store.close()


# -- the command line, the API, the Write tab -----------------------------------------------------------


@pytest.mark.slow
def test_cli_generate_and_bench_take_a_world_info_file(stories_path, stories64, tmp_path, capsys):
    from tokenswift.cli import main as cli

    lore = tmp_path / "lore.json"
    lore.write_text(json.dumps(LORE))
    out = tmp_path / "out.json"
    common = ["--model", str(stories_path), "--device", "cpu", "--dtype", "float64", "--threads", "1",
              "--prompt", PROMPT, "--max-new-tokens", "200", "--temperature", "0", "--world-info", str(lore)]
    assert cli.main(["generate", *common, "--mode", "ar", "--json", str(out)]) == 0
    written = json.loads(out.read_text())["tokens"]
    pinned = pinned_ids(stories64, "", "", world=WorldInfo.from_dict(LORE))
    asked = DraftSettings.from_dict(json.loads(out.read_text())["settings"])
    s, options = asked.settings, EngineOptions(speculation=asked.speed)
    assert written == Generator(stories64, s, stories64.encode(PROMPT), options=options, pinned=pinned).run()
    assert written != Generator(stories64, s, stories64.encode(PROMPT), options=options).run()  # the entry is seen
    assert cli.main(["bench", *common, "--warmup-tokens", "0", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["identical"] and "identical: yes" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": [entry(["Lily"]), entry(["/ly/"])]}))
    for command in ("generate", "bench"):
        assert cli.main([command, *common[:-1], str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: world_info.entries[1].keys: '/ly/': keys are plain words") and "bad.json" in err
    assert cli.main(["generate", *common[:-1], str(tmp_path / "missing.json")]) == 2
    assert "world-info: cannot read" in capsys.readouterr().err


def test_api_takes_world_info_on_create_and_context_edits(tmp_path):
    from fastapi.testclient import TestClient

    from ui.api.api import create_app

    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    client = TestClient(create_app(store))
    body = {"prompt": "Once upon a time", "max_new_tokens": 20, "world_info": LORE}
    made = client.post("/api/generations", json=body)
    assert made.status_code == 201
    gen_id = made.json()["id"]
    assert client.get(f"/api/generations/{gen_id}").json()["world_info"] == WorldInfo.from_dict(LORE).to_dict()
    bad = client.post("/api/generations", json={**body, "world_info": {"entries": [entry(["Lily"]), entry(".*")]}})
    assert bad.status_code == 422
    detail = bad.json()["detail"][0]
    assert detail["loc"] == ["body", "world_info", "entries[1]", "keys"]
    assert detail["msg"].startswith("world_info.entries[1].keys: must be a list")
    regex = client.post("/api/generations", json={**body, "world_info": {"entries": [entry(["[a-z]+"])]}})
    assert regex.status_code == 422 and "keys are plain words" in regex.json()["detail"][0]["msg"]
    context = f"/api/generations/{gen_id}/context"
    kept = client.put(context, json={"memory": "Tom.", "authors_note": ""})
    assert kept.status_code == 200 and kept.json()["world_info"] == WorldInfo.from_dict(LORE).to_dict()  # unchanged
    refused = client.put(context, json={"memory": "", "authors_note": "", "world_info": {"depth": -1}})
    assert refused.status_code == 422 and refused.json()["detail"][0]["msg"].startswith("world_info.depth:")
    assert store.get_generation(gen_id).world_info == WorldInfo.from_dict(LORE).to_json()  # nothing lost
    cleared = client.put(context, json={"memory": "", "authors_note": "", "world_info": None})
    assert cleared.json()["world_info"] is None and store.get_generation(gen_id).world_info == ""
    both = client.post("/api/generations", json={"continue_from": gen_id, "max_new_tokens": 5, "world_info": LORE})
    assert both.status_code == 422 and both.json()["detail"][0]["loc"] == ["body", "world_info"]
    store.close()


def test_the_write_tab_names_a_bad_entry_in_plain_words():
    from ui.forms.forms import FormError
    from ui.write.world_info_panel import shown, stored

    with pytest.raises(FormError, match=r"^World Info: entry 2, secondary keys: 'a\|b': keys are plain words"):
        stored(json.dumps({"entries": [entry(["Lily"]), entry(["Tom"], secondary_keys=["a|b"])]}))
    with pytest.raises(FormError, match=r"^World Info: depth: must be a whole number"):
        stored('{"depth": "deep"}')
    with pytest.raises(FormError, match=r"^World Info: the document: is not valid JSON"):
        stored("{")
    kept = stored(json.dumps(LORE))
    assert stored(shown(kept)) == kept and stored("  ") == "" and shown("") == ""


@pytest.mark.browser
def test_an_imported_world_info_reaches_the_draft_and_what_the_model_sees(app_page, studio_app, tmp_path):
    from playwright.sync_api import expect
    from studio_app import SHOTS

    lore = tmp_path / "lore.json"
    lore.write_text(json.dumps({"entries": [entry([], "Red is a fox who loves berries.", constant=True),
                                            entry(["Lily"], secondary_keys=["x y"])]}))
    page = app_page
    page.set_default_timeout(SLOW)
    page.locator("#write-world").get_by_text("World Info (lorebook)").first.click()
    with page.expect_file_chooser() as chooser:
        page.locator("#write-world-import").click()
    chooser.value.set_files(str(lore))
    status = page.locator("#write-status")
    expect(status).to_contain_text("lore.json imported: 2 entries", timeout=SLOW)
    expect(page.locator("#write-world-info")).to_contain_text("Red is a fox who loves berries.", timeout=SLOW)
    page.locator("#write-world").screenshot(path=SHOTS / "10-world-info.png")
    page.locator("#write-prompt textarea").fill("The fox ran into the woods.")
    page.locator("#write-target input").fill("40")
    page.locator("#write-start").click()
    expect(status).to_contain_text("Done", timeout=90_000)
    draft = int(re.search(r"Draft #(\d+)", status.inner_text()).group(1))
    page.locator("#write-seen-box").get_by_text("What the model sees").first.click()
    page.locator("#write-seen-show").click()
    expect(page.locator("#write-seen .ts-seen-world-info")).to_have_text("Red is a fox who loves berries.\n",
                                                                         timeout=SLOW)
    store = open_store(f"sqlite:///{studio_app.db}")
    assert json.loads(store.get_generation(draft).world_info)["entries"][1]["secondary_keys"] == ["x y"]
    store.close()


def test_the_entry_form_adds_an_entry_to_the_json_box():
    """World Info was JSON only, and nothing said an entry waits for its key: the form adds one (keys, text, always in
    view) to the same JSON, checked as the engine checks it, and the help says when the model sees it."""
    from ui.forms.forms import FormError
    from ui.write.world_info_panel import HELP, with_entry

    one = with_entry("", " Lily, the girl ,", "Lily is Tom's younger sister.", False)
    two = json.loads(with_entry(one, "", "It is the winter of 1850.", True))
    assert [(e["keys"], e["content"], e["constant"]) for e in two["entries"]] == [
        (["Lily", "the girl"], "Lily is Tom's younger sister.", False), ([], "It is the winter of 1850.", True)]
    assert WorldInfo.from_dict(two).dynamic
    for keys, content, constant, why in (("Lily", " ", False, "entry's text"), ("", "A fact.", False, "key")):
        with pytest.raises(FormError, match=why):
            with_entry(one, keys, content, constant)
    with pytest.raises(FormError, match="World Info: the document"):
        with_entry("[1, 2]", "Lily", "A fact.", False)  # a box that is not World Info is not overwritten
    assert "waits for one of its keys to appear in the recent story" in HELP
