"""Branches (storage/branches.py, ui/branches.py, ui/write_branches.py): a draft written by the real worker code on
stories260k (float64) records its alternatives; the API shows them with their texts, a branch takes one and the
worker writes on from it exactly as plain decoding would from that text; branches are listed, exported and
deleted, and the original is kept. Bad positions and tokens are 422s naming the field, with the draft unchanged.
The Write tab does it in a real browser: click a word, pick an alternative, the branch opens and is listed."""

from __future__ import annotations

import re

import pytest
from conftest import sqlite_db_url
from fastapi.testclient import TestClient
from speed import AR
from studio_app import SHOTS, start_draft
from test_worker import one_torch_thread

from storage import open_store
from storage.records import ModelSpec, Owner
from tokenswift.decode.generate import Generator
from tokenswift.settings import DraftSettings, Settings, Speculation
from ui.api.api import create_app
from worker.job import FlushPolicy, JobRun

PROMPT = "Once upon a time, there was a little dog named Max."
SETTINGS = Settings(seed=5, max_new_tokens=60, temperature=1.0, min_p=0.05, ignore_eos=True)


def run_next_job(store, lm, model: str) -> int:
    """The worker's code, in this process: claim the next job and run it to the end."""
    owner = Owner.here("test-worker")
    job = store.claim_next(owner)
    with one_torch_thread():
        outcome = JobRun(store, owner, job, lm, ModelSpec(model, None, "cpu", "float64"), FlushPolicy(0.0, 8),
                         lambda: False).run()
    assert outcome == "done"
    return job.id


db_url = sqlite_db_url  # the branch verbs are plain queries: the store's own tests run both backends


@pytest.fixture
def drafted(db_url, stories64, stories_path):
    store = open_store(db_url)
    gen_id = store.enqueue_generation(PROMPT, DraftSettings(SETTINGS, Speculation(ngram_topk=8))).id
    run_next_job(store, stories64, str(stories_path))
    yield store, gen_id, TestClient(create_app(store))
    store.close()


def an_alternative(client, gen_id: int, start: int = 5) -> tuple[int, dict]:
    """The first position from `start` where the model had another likely token, and its view."""
    for position in range(start, 60):
        view = client.get(f"/api/generations/{gen_id}/alternatives", params={"position": position}).json()
        if any(a["token"] != view["token"] for a in view["alternatives"]):
            return position, view
    raise AssertionError("no position with an alternative")


def test_alternatives_and_a_branch_through_the_api(drafted, stories64, stories_path):
    store, gen_id, client = drafted
    ids = store.get_tokens(gen_id)
    position, view = an_alternative(client, gen_id)
    assert view["recorded"] and view["token"] == ids.generated_ids[position] and 0 < view["probability"] <= 1
    assert [a["probability"] for a in view["alternatives"]] == sorted((a["probability"] for a in
                                                                       view["alternatives"]), reverse=True)
    own = next(a for a in view["alternatives"] if a["token"] == view["token"])
    assert own["text"] == view["text"] and own["probability"] == pytest.approx(view["probability"])
    other = next(a for a in view["alternatives"] if a["token"] != view["token"])

    made = client.post(f"/api/generations/{gen_id}/branch", json={"position": position, "token": other["token"]})
    assert made.status_code == 201, made.text
    branch = made.json()
    assert (branch["parent_id"], branch["origin"], branch["status"]) == (gen_id, "branch", "queued")
    run_next_job(store, stories64, str(stories_path))
    got = store.get_tokens(branch["id"])
    assert got.prompt_ids == ids.prompt_ids + ids.generated_ids[:position]
    assert got.generated_ids[0] == other["token"] and len(got.generated_ids) == 60 - position
    # Exactly what plain decoding writes on from the original's text up to there and the chosen token.
    ar = Generator(stories64, SETTINGS, ids.prompt_ids, options=AR,
                   generated_ids=ids.generated_ids[:position] + [other["token"]]).run()
    assert got.prompt_ids[len(ids.prompt_ids):] + got.generated_ids == ar
    original, made_text = store.get_generation(gen_id), store.get_generation(branch["id"])
    whole = original.prompt_text + original.text
    assert whole.startswith(made_text.prompt_text) and made_text.text.startswith(other["text"])
    assert client.get(f"/api/generations/{branch['id']}/alternatives", params={"position": 0}).json()[
        "alternatives"] == view["alternatives"]  # chosen from these: they stay with it

    # The family: the original first, then each branch after its parent; the same list from any of them.
    nested_at, nested = an_alternative(client, branch["id"], start=1)
    alt = next(a["token"] for a in nested["alternatives"] if a["token"] != nested["token"])
    second = client.post(f"/api/generations/{branch['id']}/branch", json={"position": nested_at, "token": alt})
    assert second.status_code == 201
    family = client.get(f"/api/generations/{second.json()['id']}/branches").json()
    assert family["original"] == gen_id
    assert [(b["id"], b["parent_id"], b["position"]) for b in family["branches"]] == [
        (gen_id, None, None), (branch["id"], gen_id, position), (second.json()["id"], branch["id"], nested_at)]
    assert client.get(f"/api/generations/{gen_id}/branches").json() == {**family, "id": gen_id}

    exported = client.get(f"/api/generations/{branch['id']}/export", params={"format": "txt"})
    assert exported.status_code == 200 and made_text.text.strip()[:20] in exported.text
    # Deleting: an original (or a branch) with branches is refused; a branch goes, and the original stays whole.
    refused = client.delete(f"/api/generations/{gen_id}")
    assert refused.status_code == 409 and "1 branch" in refused.json()["detail"]
    client.post(f"/api/generations/{second.json()['id']}/cancel")
    assert client.delete(f"/api/generations/{second.json()['id']}").status_code == 204
    assert client.delete(f"/api/generations/{branch['id']}").status_code == 204
    assert store.get_generation(gen_id).text == original.text
    assert client.get(f"/api/generations/{gen_id}/branches").json()["branches"] == [
        {"id": gen_id, "parent_id": None, "position": None, "status": "done", "produced_tokens": 60,
         "target_tokens": 60}]
    assert client.delete(f"/api/generations/{gen_id}").status_code == 204


@pytest.mark.parametrize(("query", "body", "field"), [
    ({"position": 60}, {"position": 60}, "position"),  # past the end: 60 generated tokens are 0..59
    ({"position": -1}, {"position": 10**6}, "position"),
    ({"position": "x"}, {"position": "3"}, "position"),
    ({}, {"position": 3, "token": 10**4}, "token"),  # no such alternative there
])
def test_bad_positions_and_tokens_are_refused_by_name_and_change_nothing(drafted, query, body, field):
    store, gen_id, client = drafted
    before = (store.get_generation(gen_id), store.get_tokens(gen_id), len(store.list_generations()))
    if query:
        got = client.get(f"/api/generations/{gen_id}/alternatives", params=query)
        assert got.status_code == 422 and got.json()["detail"][0]["msg"].startswith("position: ")
    made = client.post(f"/api/generations/{gen_id}/branch", json={"token": 1, **body})
    assert made.status_code == 422, made.text
    assert made.json()["detail"][0]["msg"].startswith(f"{field}: ")
    assert (store.get_generation(gen_id), store.get_tokens(gen_id), len(store.list_generations())) == before
    own = store.get_tokens(gen_id).generated_ids[3]
    same = client.post(f"/api/generations/{gen_id}/branch", json={"position": 3, "token": own})
    assert same.status_code == 422 and "the draft's own token" in same.json()["detail"][0]["msg"]
    assert client.get("/api/generations/999/alternatives", params={"position": 0}).status_code == 404


@pytest.mark.browser
def test_click_a_word_pick_an_alternative_and_follow_the_branch(app_page, studio_app):
    from playwright.sync_api import expect

    page, wait = app_page, {"timeout": 30_000}
    page.set_default_timeout(30_000)
    original = start_draft(page, studio_app.db, "Once upon a time, a little fox found a key by the sea.", 80,
                           120_000)
    page.locator("#write-branch-box").get_by_text("Alternatives and branches").click()
    expect(page.locator("#write-branches input")).to_have_value(re.compile(rf"^#{original} original"), **wait)
    words, info = page.locator("#write-words .ts-tok"), page.locator("#write-alt-info")
    expect(words.first).to_be_visible(**wait)
    options = page.locator("#write-alternatives label")
    for i in range(words.count()):  # the first word where the model had another likely one
        words.nth(i).click()
        expect(info).to_contain_text(f"At token {int(words.nth(i).get_attribute('data-pos')):,} the model wrote",
                                     **wait)
        if options.count():
            break
    picked = options.first.inner_text()
    options.first.click()
    page.locator("#write-branch").click()
    expect(page.locator("#write-status")).to_contain_text("Branched: Draft #", **wait)
    branch = re.search(r"Branched: Draft #(\d+)", page.locator("#write-status").inner_text()).group(1)
    expect(page.locator("#write-branches input")).to_have_value(
        re.compile(rf"^#{branch} branch of #{original} at token"), **wait)
    expect(page.locator("#write-status")).to_contain_text("Done", timeout=120_000)
    # The list of branches says so once it ends (it said "running · 1 tokens" until the page was reloaded).
    expect(page.locator("#write-branches input")).to_have_value(
        re.compile(rf"^#{branch} branch of #{original} at token [\d,]+ · done · "), **wait)
    chosen = re.search(r"“(.*)”", picked).group(1).replace("␣", " ")
    assert chosen.strip() in page.locator("#write-text textarea").input_value()
    page.screenshot(path=SHOTS / "10-branch.png", full_page=True)
    page.locator("#write-branches input").click()  # switch back to the original
    page.locator("#write-branches li", has_text=f"#{original} original").click()
    expect(page.locator("#write-status")).to_contain_text(f"Draft #{original}", **wait)
    expect(page.locator("#write-branches input")).to_have_value(re.compile(rf"^#{original} original"), **wait)
