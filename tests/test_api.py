"""The REST contract, against a real store on each backend, a SQLite file and a PostgreSQL server (the worker's
side is played through the store's verbs)."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import threading
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import both_backends, need_shared, only_postgresql, only_sqlite, sqlite_db_url
from fastapi.testclient import TestClient
from sqlalchemy import event

from storage import open_store
from storage.records import ModelSpec, Owner, Progress
from ui.api.api import create_app
from ui.api.follow import Commits
from ui.drafts import tokens as tokens_module

GOOD = {"prompt": "Once upon a time", "max_new_tokens": 300, "mode": "tokenswift", "seed": 7,
        "settings": {"temperature": 0.8, "top_p": 0.9, "min_p": 0.05, "eta": 0.0, "penalty": 1.2,
                     "penalty_window": 512, "ngram_topk": 8, "tree": [1, 3, 3], "budget": 256, "drafter": "paper"}}


db_url = sqlite_db_url  # the API passes the store through: SQLite, and both_backends where they differ


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.close()


@pytest.fixture
def client(store):
    return TestClient(create_app(store))


def with_settings(**changes) -> dict:
    return {**GOOD, "settings": {**GOOD["settings"], **changes}}


def written(store, gen_id: int, pieces: list[tuple[list[int], str]], finish: str = "done") -> None:
    """Play the worker: claim the job and store its output."""
    owner = Owner.here("test-worker")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, [1, 400, 401], "stories", None)
    for i, (ids, text) in enumerate(pieces):
        last = i == len(pieces) - 1
        store.append_progress(gen_id, owner, Progress(ids, text, 0.5), finish=finish if last else None)


def test_create_and_read_back(client, store):
    created = client.post("/api/generations", json=GOOD)
    assert created.status_code == 201
    assert created.json()["status"] == "queued" and isinstance(created.json()["id"], int)
    gen = store.get_generation(created.json()["id"])
    assert gen.settings_json and '"penalty_window": 512' in gen.settings_json  # W mapped to Settings
    assert '"drafter": "paper"' in gen.settings_json
    body = client.get(f"/api/generations/{gen.id}").json()
    expected = {"id": gen.id, "status": "queued", "produced_tokens": 0, "target_tokens": 300, "text": "",
                "metrics": {}}
    assert {k: body[k] for k in expected} == expected
    written(store, gen.id, [([5, 6], "Hello"), ([7], " there")])
    body = client.get(f"/api/generations/{gen.id}").json()
    assert (body["status"], body["text"], body["produced_tokens"]) == ("done", "Hello there", 3)
    tokens = client.get(f"/api/generations/{gen.id}/tokens").json()
    assert tokens == {"prompt_tokens": [1, 400, 401], "tokens": [5, 6, 7]}


INVALID = [
    ({"prompt": "x"}, "max_new_tokens"),
    ({**GOOD, "prompt": ""}, "prompt"),
    ({**GOOD, "prompt": "   "}, "prompt"),
    ({**GOOD, "max_new_tokens": 0}, "max_new_tokens"),
    ({**GOOD, "max_new_tokens": "300"}, "max_new_tokens"),
    ({**GOOD, "max_new_tokens": 10**12}, "max_new_tokens"),  # weeks of the worker's time, once queued
    ({"max_new_tokens": 10**7 + 1, "continue_from": 1}, "max_new_tokens"),
    ({**GOOD, "mode": "fast"}, "mode"),
    ({**GOOD, "seed": -1}, "seed"),
    ({**GOOD, "model": "gpt"}, "model"),
    (with_settings(temperature=-1), "settings.temperature"),
    (with_settings(top_p=0), "settings.top_p"),
    (with_settings(min_p=1), "settings.min_p"),
    (with_settings(eta=2), "settings.eta"),
    (with_settings(penalty=0.5), "settings.penalty"),
    (with_settings(penalty_window=-1), "settings.penalty_window"),
    (with_settings(ngram_topk=1000), "settings.ngram_topk"),
    (with_settings(tree=[2, 3]), "settings.tree"),
    (with_settings(tree="1,3"), "settings.tree"),
    (with_settings(budget=3), "settings.budget"),
    (with_settings(drafter="medusa"), "settings.drafter"),
    (with_settings(penalty_length=5), "settings.penalty_length"),  # the store's old name is no API name
    (with_settings(dry_multiplier=-0.5), "settings.dry_multiplier"),
    (with_settings(dry_base=1.0), "settings.dry_base"),
    (with_settings(dry_range=10**6), "settings.dry_range"),
    (with_settings(dry_breakers=[""]), "settings.dry_breakers"),
    (with_settings(xtc_threshold=0.9), "settings.xtc_threshold"),
    (with_settings(xtc_probability=2.0), "settings.xtc_probability"),
    (with_settings(top_n_sigma=-1.0), "settings.top_n_sigma"),
    (with_settings(adaptive_target=1.5), "settings.adaptive_target"),
    (with_settings(adaptive_decay=1.0), "settings.adaptive_decay"),
    (with_settings(penalty_window=10**11), "settings.penalty_window"),  # a window of 800 GB, once
    (with_settings(tree=[1, 99999, 3]), "settings.tree"),  # more candidate rows than an iteration may verify
    ({**GOOD, "session_id": 999}, "session_id"),
    ({"max_new_tokens": 10, "continue_from": 999}, "continue_from"),
    ({**GOOD, "continue_from": 1}, "prompt"),
]


@only_sqlite  # refused before the store is asked: once is enough
@pytest.mark.parametrize(("payload", "field"), INVALID, ids=[f for _, f in INVALID])
def test_every_validation_error_names_its_field(client, payload, field):
    response = client.post("/api/generations", json=payload)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert any(d["msg"].startswith(f"{field}: ") and d["loc"][1:] == field.split(".") for d in detail), detail


@only_sqlite
def test_settings_messages_match_the_engine_settings(client):
    detail = client.post("/api/generations", json=with_settings(penalty=0.5)).json()["detail"]
    assert detail[0]["msg"] == "settings.penalty: theta must be a finite number >= 1"

def test_dry_and_xtc_go_through_the_api_by_their_settings_names(client, store):
    body = {**GOOD, "settings": {**GOOD["settings"], "drafter": "layer", "dry_multiplier": 0.8, "dry_base": 2.0,
                                 "dry_allowed_length": 3, "dry_range": 128, "dry_breakers": ["\n", "."],
                                 "xtc_threshold": 0.2, "xtc_probability": 0.5}}
    created = client.post("/api/generations", json=body)
    assert created.status_code == 201
    settings = json.loads(store.get_generation(created.json()["id"]).settings_json)
    assert {k: settings[k] for k in body["settings"] if k.startswith(("dry", "xtc", "drafter"))} == {
        "drafter": "layer", "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3, "dry_range": 128,
        "dry_breakers": ["\n", "."], "xtc_threshold": 0.2, "xtc_probability": 0.5}
    shown = client.get(f"/api/generations/{created.json()['id']}").json()["settings"]  # as they were sent
    assert {k: shown[k] for k in body["settings"]} == body["settings"]


def test_a_stored_row_from_before_a_limit_still_loads():
    """Rows the store kept before W and the candidate rows were bounded still open (Library, Write, worker)."""
    from tokenswift.settings import CAPACITY_SPARE, MAX_WINDOW, ROPE_SLACK, DraftSettings, max_nodes

    old = {**json.loads(DraftSettings().to_json()), "penalty_window": 10**9, "ngram_topk": 256, "tree": [1, 99999, 3]}
    kept = DraftSettings.from_json(json.dumps(old))
    assert kept.settings.penalty_window == MAX_WINDOW
    speed = kept.speed
    assert max_nodes(speed.tree, speed.ngram_topk) + CAPACITY_SPARE <= ROPE_SLACK < max_nodes(speed.tree, 256)


@only_sqlite
def test_the_readmes_example_draft_is_accepted(client, store):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    body = json.loads(re.search(r"/api/generations -d '(\{.*?\})'", readme, re.S).group(1))
    created = client.post("/api/generations", json=body)
    assert created.status_code == 201, created.text
    assert store.get_generation(created.json()["id"]).memory == body["memory"]


@only_sqlite
@pytest.mark.parametrize(("window", "field"), [({"context_window": 10**8}, "settings.context_window"),
                                               ({"shift_step": 10**9}, "settings.shift_step")])
def test_a_window_the_workers_model_cannot_take_is_422(client, store, window, field):
    """Refused up front in the engine's words, not accepted and then failed by the worker."""
    store.register_worker(Owner.here("gpu0"))
    store.report_model("gpu0", ModelSpec("stories"), "ready", max_context=512)
    response = client.post("/api/generations", json=with_settings(**window))
    assert response.status_code == 422 and response.json()["detail"][0]["msg"].startswith(f"{field}: ")
    assert store.list_generations() == []


def test_targets_beyond_the_workers_context_are_rejected_with_shifting_off(client, store):
    owner = Owner.here("gpu0")
    store.register_worker(owner)
    store.report_model("gpu0", ModelSpec("stories"), "ready", max_context=512)
    assert client.post("/api/generations", json={**GOOD, "max_new_tokens": 500}).status_code == 201
    # The worker's model "stories" has no tokenizer here: only max_new_tokens is checked (the worker does the rest).
    off = {**with_settings(context_shift=False)}
    response = client.post("/api/generations", json={**off, "max_new_tokens": 513})
    assert response.status_code == 422
    message = "max_new_tokens: max_new_tokens (513) exceeds the model's context of 512 tokens (context shifting is off)"
    assert response.json()["detail"][0]["msg"] == message
    parent = client.post("/api/generations", json=GOOD).json()["id"]
    store.request_cancel(1)  # the first job: out of the way so the worker claims `parent`
    written(store, parent, [([5] * 100, "word " * 100)])
    too_long = client.post("/api/generations", json={"max_new_tokens": 410, "continue_from": parent,
                                                      "settings": {"context_shift": False}})
    assert too_long.status_code == 422  # 3 prompt + 100 generated tokens
    assert "prompt (103 tokens) + max_new_tokens (410) = 513 exceeds" in too_long.json()["detail"][0]["msg"]
    assert client.post("/api/generations", json={**GOOD, "max_new_tokens": 5000}).status_code == 201  # shifts


def test_continue_from_a_finished_draft(client, store):
    book = store.create_session("Dragons", "Ann")
    parent = client.post("/api/generations", json={**GOOD, "session_id": book.id}).json()["id"]
    busy = client.post("/api/generations", json={"max_new_tokens": 10, "continue_from": parent})
    assert busy.status_code == 422 and busy.json()["detail"][0]["loc"] == ["body", "continue_from"]
    written(store, parent, [([5, 6], " and a dragon")])
    child = client.post("/api/generations", json={"max_new_tokens": 10, "continue_from": parent})
    assert child.status_code == 201 and child.json()["session_id"] == book.id
    tokens = client.get(f"/api/generations/{child.json()['id']}/tokens").json()
    assert tokens == {"prompt_tokens": [1, 400, 401, 5, 6], "tokens": []}


def test_edit_a_draft_then_continue_from_the_edit(client, store):
    parent = client.post("/api/generations", json=GOOD).json()["id"]
    running = client.post(f"/api/generations/{parent}/edit", json={"text": "Once upon a time, a fox."})
    assert running.status_code == 409  # queued: the worker may be writing it
    written(store, parent, [([5, 6], " and a dragon")])
    for body, why in (({"text": "  "}, "empty"), ({"text": "Once upon a time and a dragon"}, "nothing was changed"),
                      ({"txt": "x"}, "nothing else"), ({"text": 5}, "nothing else")):
        bad = client.post(f"/api/generations/{parent}/edit", json=body)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "text"]
        assert why in bad.json()["detail"][0]["msg"]
    assert client.post("/api/generations/999/edit", json={"text": "x"}).status_code == 404
    edit = client.post(f"/api/generations/{parent}/edit", json={"text": "Once upon a time and a red dragon"})
    assert edit.status_code == 201 and edit.json()["parent_id"] == parent and edit.json()["status"] == "done"
    revision = client.get(f"/api/generations/{edit.json()['id']}").json()
    assert revision["origin"] == "edit" and client.get(f"/api/generations/{parent}").json()["text"] == " and a dragon"
    assert revision["text"] == "Once upon a time and a red dragon"  # an edit's text is the writer's whole text
    assert client.get(f"/api/generations/{edit.json()['id']}", params={"since": 0}).json()["text"] == ""  # no chunks
    child = client.post("/api/generations", json={"max_new_tokens": 10, "continue_from": edit.json()["id"]})
    assert child.status_code == 201
    assert store.get_generation(child.json()["id"]).prompt_text == "Once upon a time and a red dragon"


def test_prompts_are_counted_with_the_models_tokenizer_before_any_worker(client, store):
    stories = need_shared()
    store.set_desired_model(ModelSpec(str(stories)))  # chosen in the Model tab; no worker has started yet
    prompt = {**GOOD, "prompt": "Once upon a time"}  # <s> + 4 tokens, as the worker counts them
    too_long = client.post("/api/generations", json={**prompt, "max_new_tokens": 32_768 - 4,
                                                      "settings": {"context_shift": False}})
    assert too_long.status_code == 422
    assert too_long.json()["detail"] == [{
        "loc": ["body", "max_new_tokens"], "type": "value_error",
        "msg": "max_new_tokens: prompt (5 tokens) + max_new_tokens (32764) = 32769 exceeds the model's context of "
               "32768 tokens (context shifting is off)"}]
    assert client.post("/api/generations", json={**prompt, "max_new_tokens": 32_768 - 5}).status_code == 201
    assert client.post("/api/generations", json={**prompt, "max_new_tokens": 100_000}).status_code == 201  # shifts
    store.set_desired_model(ModelSpec("/no/such/model"))  # no tokenizer, no worker: the worker will check
    assert client.post("/api/generations", json={**prompt, "max_new_tokens": 40_000}).status_code == 201


def test_tokenizers_are_loaded_once_per_model_and_failures_retried_later(store, monkeypatch):
    loads = []

    def fake_load(model):
        loads.append(model)
        if model == "broken":
            raise OSError("no tokenizer files")
        return tokens_module._Loaded(lambda text: SimpleNamespace(input_ids=text.split()), 100)

    monkeypatch.setattr(tokens_module, "_load", fake_load)
    counter = tokens_module.PromptTokens(store, retry_s=3600)
    assert counter.measure("a b c") is None  # no model chosen, no worker: nothing to count with
    store.set_desired_model(ModelSpec("good"))
    assert counter.measure("a b c") == tokens_module.Measured("good", 3, 100)
    assert counter.measure("a b") == tokens_module.Measured("good", 2, 100)
    store.set_desired_model(ModelSpec("broken"))
    assert counter.measure("a") is None and counter.measure("a") is None
    assert loads == ["good", "broken"]  # cached, and a failure is not retried at every request
    counter.retry_s = 0
    assert counter.measure("a") is None and loads == ["good", "broken", "broken"]


def test_the_app_keeps_converted_gguf_files_in_its_own_folder(stories_path, tmp_path, monkeypatch):
    """The engine caches a GGUF conversion where it is told (by default $TOKENSWIFT_CACHE); the app tells it
    $TOKENSWIFT_HOME/gguf-cache (storage/home.py), so the studio's files stay in one folder."""
    from gguf_files import write_gguf

    monkeypatch.setenv("TOKENSWIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "engine-cache"))
    write_gguf(tmp_path / "tiny.gguf", stories_path)
    assert tokens_module._load(str(tmp_path / "tiny.gguf")).tokenizer("Once upon a time").input_ids
    assert any((tmp_path / "home" / "gguf-cache").iterdir()) and not (tmp_path / "engine-cache").exists()


def test_delete_a_draft(client, store):
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    refused = client.delete(f"/api/generations/{gen_id}")
    assert refused.status_code == 409 and "queued" in refused.json()["detail"]
    owner = Owner.here("test-worker")
    store.claim_next(owner)
    store.append_progress(gen_id, owner, Progress([5, 6], "Hello", 0.5))
    assert client.delete(f"/api/generations/{gen_id}").status_code == 409  # the worker is writing to it
    client.post(f"/api/generations/{gen_id}/cancel")
    store.release(gen_id, owner)  # the worker sees the request and stops
    assert store.get_generation(gen_id).status == "cancelled"
    deleted = client.delete(f"/api/generations/{gen_id}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert client.get(f"/api/generations/{gen_id}").status_code == 404
    assert client.delete(f"/api/generations/{gen_id}").status_code == 404


def test_unknown_ids_are_404(client):
    for path in ("", "/tokens", "/export?format=txt"):
        assert client.get(f"/api/generations/999{path}").status_code == 404
    for verb in ("pause", "resume", "cancel"):
        assert client.post(f"/api/generations/999/{verb}").status_code == 404
    assert client.delete("/api/generations/999").status_code == 404


def test_pause_resume_cancel(client):
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    assert client.post(f"/api/generations/{gen_id}/pause").json()["status"] == "paused"
    assert client.post(f"/api/generations/{gen_id}/resume").json()["status"] == "queued"
    assert client.post(f"/api/generations/{gen_id}/cancel").json()["status"] == "cancelled"
    conflict = client.post(f"/api/generations/{gen_id}/resume")
    assert conflict.status_code == 409 and "cancelled" in conflict.json()["detail"]


def test_exports_parse_in_every_format(client, store):
    book = store.create_session("The Lighthouse", "Ada Byron")
    gen_id = client.post("/api/generations", json={**GOOD, "session_id": book.id}).json()["id"]
    written(store, gen_id, [([5, 6], "\nShe climbed the stairs.\n\nThe lamp was lit."), ([7], " Ünïcode!")])
    base = f"/api/generations/{gen_id}/export"
    txt = client.get(f"{base}?format=txt")
    assert txt.status_code == 200 and "attachment" in txt.headers["content-disposition"]
    assert "The Lighthouse" in txt.text and "The lamp was lit. Ünïcode!" in txt.text
    assert "Once upon a time" in client.get(f"{base}?format=md").text  # the prompt opens the book
    check_epub(client.get(f"{base}?format=epub").content, "The Lighthouse")
    check_docx(client.get(f"{base}?format=docx&title=Beacon&author=Bo").content, "Beacon", "Bo")
    bad = client.get(f"{base}?format=pdf")
    assert bad.status_code == 422 and bad.json()["detail"][0]["msg"].startswith("format: ")


def test_an_instruction_draft_exports_as_its_story_with_its_paragraphs(client, store):
    """The book starts with the story, not the instruction; the model's single line breaks stay paragraph breaks
    in every format (the reflow for hard-wrapped openings would join these short lines into one)."""
    import docx

    book = store.create_session("The Keeper", "")
    body = {**GOOD, "prompt": "Write a story about a lighthouse keeper.", "prompt_format": "instruction",
            "session_id": book.id}
    gen_id = client.post("/api/generations", json=body).json()["id"]
    story = "The keeper climbed.\nThe lamp was cold.\nHe lit it and waited for the ships to come home."
    written(store, gen_id, [([5, 6], story)])
    base = f"/api/generations/{gen_id}/export"
    md = client.get(f"{base}?format=md").text
    assert "lighthouse keeper." not in md and "Write a story" not in md
    assert "The keeper climbed.\n\nThe lamp was cold.\n\nHe lit it" in md
    paragraphs = [p.text for p in docx.Document(io.BytesIO(client.get(f"{base}?format=docx").content)).paragraphs]
    assert paragraphs[-3:] == story.split("\n")
    epub = zipfile.ZipFile(io.BytesIO(client.get(f"{base}?format=epub").content))
    pages = "".join(epub.read(n).decode() for n in epub.namelist() if n.endswith(".xhtml"))
    assert "<p>The keeper climbed.</p>" in pages and "<p>The lamp was cold.</p>" in pages


def check_epub(data: bytes, title: str) -> None:
    archive = zipfile.ZipFile(io.BytesIO(data))
    first = archive.infolist()[0]
    assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
    assert archive.read("mimetype") == b"application/epub+zip"
    container = ET.fromstring(archive.read("META-INF/container.xml"))
    opf_path = container.find(".//{urn:oasis:names:tc:opendocument:xmlns:container}rootfile").get("full-path")
    opf = ET.fromstring(archive.read(opf_path))
    ns = {"opf": "http://www.idpf.org/2007/opf", "dc": "http://purl.org/dc/elements/1.1/"}
    assert opf.find(".//dc:title", ns).text == title
    folder = opf_path.rsplit("/", 1)[0] + "/" if "/" in opf_path else ""
    for item in opf.findall(".//opf:manifest/opf:item", ns):
        name = folder + item.get("href")
        if name.endswith(".xhtml"):
            ET.fromstring(archive.read(name))  # every content document is well-formed XML


def check_docx(data: bytes, title: str, author: str) -> None:
    from docx import Document

    document = Document(io.BytesIO(data))
    assert (document.core_properties.title, document.core_properties.author) == (title, author)
    assert any("The lamp was lit." in p.text for p in document.paragraphs)


def test_health_reports_the_worker_and_queue(client, store):
    assert client.get("/api/health").json()["load_status"] == "no worker"
    store.register_worker(Owner.here("gpu0"))
    store.report_model("gpu0", ModelSpec("stories", None, "cuda", "bfloat16"), "ready", max_context=4096,
                       heads_info="decoding path: sdpa (passed its self-test); not flex: RuntimeError: boom")
    client.post("/api/generations", json=GOOD)
    health = client.get("/api/health").json()
    assert (health["model"], health["device"], health["queue_length"]) == ("stories", "cuda", 1)
    assert health["model_info"].startswith("decoding path: sdpa (passed its self-test); not flex")
    assert 0 <= health["worker_heartbeat_age_s"] < 5


def test_basic_auth_when_credentials_are_given(store):
    client = TestClient(create_app(store, credentials=[("ann", "s3cret"), ("bo", "pw")]))
    assert client.get("/api/health").status_code == 401
    assert client.get("/api/health", auth=("ann", "wrong")).status_code == 401
    assert client.get("/api/health", auth=("bo", "pw")).status_code == 200
    assert client.post("/api/generations", json=GOOD, auth=("ann", "s3cret")).status_code == 201


@only_sqlite
def test_a_read_only_store_answers_503_with_the_reason(tmp_path, store):
    read_only = open_store(f"sqlite:///file:{tmp_path / 'studio.db'}?mode=ro&uri=true")
    response = TestClient(create_app(read_only)).post("/api/generations", json=GOOD)
    assert response.status_code == 503 and "readonly" in response.json()["detail"]
    read_only.close()


@only_postgresql
def test_a_database_server_that_is_down_answers_503_and_is_used_again_once_back(client, pg_cluster):
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    pg_cluster.stop("immediate")
    try:
        response = client.get(f"/api/generations/{gen_id}")
        assert response.status_code == 503 and "connection" in response.json()["detail"]
    finally:
        pg_cluster.start()
    assert client.get(f"/api/generations/{gen_id}").json()["status"] == "queued"  # reconnected, nothing lost


BIG = [2**63, 2**70, -(2**70)]
OUT_OF_RANGE = [
    *[({**GOOD, "seed": n}, "seed") for n in BIG],
    *[({**GOOD, "session_id": n}, "session_id") for n in BIG],
    *[({"max_new_tokens": 10, "continue_from": n}, "continue_from") for n in BIG],
    ({**GOOD, "max_new_tokens": 2**70}, "max_new_tokens"),
    (with_settings(budget=2**70), "settings.budget"),
    (with_settings(tree=[1, 2**70]), "settings.tree.1"),
    ({**GOOD, "prompt": "Once \ud800 upon"}, "prompt"),
    ({**GOOD, "mode": "\udfff"}, "mode"),
    *[(with_settings(**{name: ["\ud800"]}), f"settings.{name}") for name in ("dry_breakers", "stop", "ban")],
    ({**GOOD, "\ud800": 1}, "body"),  # a key that is not Unicode names no field
]


@both_backends  # the store's integer range is the backend's
@pytest.mark.parametrize(("payload", "field"), OUT_OF_RANGE, ids=[f"{f}-{i}" for i, (_, f) in enumerate(OUT_OF_RANGE)])
def test_integers_beyond_the_store_and_broken_unicode_are_422_not_500(client, store, payload, field):
    response = post_raw(client, payload)
    assert response.status_code == 422, response.text
    assert any(d["msg"].startswith(f"{field}: ") for d in response.json()["detail"]), response.json()
    assert store.list_generations() == []  # nothing half-written


def post_raw(client, payload: dict):
    """JSON as a client in any language may send it: a lone surrogate goes out as its \\ud800 escape."""
    body = json.dumps(payload).encode()  # ensure_ascii: escapes, never raw surrogates
    return client.post("/api/generations", content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("body", [b"[" * 50_000 + b"]" * 50_000, b"not json", b"", b"\xff\xfe", b"[1, 2]"])
def test_bodies_that_are_no_json_object_are_422_naming_the_body(client, body):
    response = client.post("/api/generations", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["msg"].startswith("body: ")


def test_lone_surrogate_is_named(client):
    detail = post_raw(client, {**GOOD, "prompt": "Once \ud800"}).json()["detail"]
    assert detail[0]["msg"] == "prompt: is not valid Unicode: a lone surrogate (U+D800) at character 5"


@pytest.mark.parametrize("ident", [0, -1, 2**63, 2**70])
def test_path_ids_outside_the_store_range_are_422(client, ident):
    for path in ("", "/tokens", "/export?format=txt"):
        response = client.get(f"/api/generations/{ident}{path}")
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == "gen_id"
    for verb in ("pause", "resume", "cancel"):
        assert client.post(f"/api/generations/{ident}/{verb}").status_code == 422
    assert client.delete(f"/api/generations/{ident}").status_code == 422
    assert client.get(f"/api/generations/1?since={ident}").status_code == (422 if ident != 0 else 404)


@both_backends  # SQLite's commit counter, or none: every poll reads
def test_polls_since_a_chunk_read_only_the_new_text(client, store):
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    owner = Owner.here("test-worker")
    store.claim_next(owner)
    store.record_start(gen_id, owner, [1], "stories", None)
    base = f"/api/generations/{gen_id}"
    assert client.get(f"{base}?since=0").json()["text"] == "" and client.get(base).json()["next_since"] == 0
    store.append_progress(gen_id, owner, Progress([5], "Once", 0.1))
    store.append_progress(gen_id, owner, Progress([6], " upon", 0.2))
    first = client.get(f"{base}?since=0").json()
    assert (first["text"], first["next_since"], first["produced_tokens"]) == ("Once upon", 2, 2)
    assert client.get(base).json()["text"] == "Once upon"  # whole text, now cached up to chunk 2
    store.append_progress(gen_id, owner, Progress([7], " a time", 0.3), finish="done")
    later = client.get(f"{base}?since={first['next_since']}").json()
    assert (later["text"], later["next_since"], later["status"]) == (" a time", 3, "done")
    assert client.get(base).json()["text"] == "Once upon a time"  # extended from the cache
    assert client.get(f"{base}?since=99").json()["text"] == ""


@only_sqlite
def test_the_whole_text_cache_is_not_fooled_by_a_reused_id(client, store):
    """SQLite hands the id of a deleted last row to the next one: the cache must notice the new draft."""
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    written(store, gen_id, [([5, 6], "Old text that is long")])
    assert client.get(f"/api/generations/{gen_id}").json()["text"] == "Old text that is long"
    assert client.delete(f"/api/generations/{gen_id}").status_code == 204
    again = client.post("/api/generations", json=GOOD).json()["id"]
    assert again == gen_id
    written(store, again, [([7], "New")])
    assert client.get(f"/api/generations/{again}").json()["text"] == "New"


@only_sqlite
def test_health_says_when_the_store_cannot_be_written(client, store):
    """An injected OperationalError stands for a full disk (tests/test_worker.py meets a real SQLITE_FULL)."""
    assert client.get("/api/health").json()["store"] == "ok"
    full = {"on": True}

    def refuse_writes(conn, cursor, statement, parameters, context, executemany):
        if full["on"] and statement.lstrip().upper().startswith(("UPDATE", "INSERT")):
            raise sqlite3.OperationalError("database or disk is full")

    event.listen(store.engine, "before_cursor_execute", refuse_writes)
    refused = client.post("/api/generations", json=GOOD)
    assert refused.status_code == 503 and "database or disk is full" in refused.json()["detail"]
    assert client.get("/api/health").json()["store"] == "store unwritable: database or disk is full"
    assert client.get("/api/health").json()["store"] != "ok"  # still, while it lasts
    full["on"] = False
    assert client.get("/api/health").json()["store"] == "ok"
    assert client.post("/api/generations", json=GOOD).status_code == 201


def test_prompt_format_and_end_of_text_ban_reach_the_stored_settings(client, store):
    from tokenswift.settings import DraftSettings

    def stored(payload):
        response = client.post("/api/generations", json=payload)
        assert response.status_code == 201, response.text
        stored = store.get_generation(response.json()["id"], with_text=False).settings_json
        return DraftSettings.from_json(stored).settings

    short = stored(GOOD)
    assert short.prompt_format == "continue" and short.ban_eos  # the one rule: a draft reaches its length
    long = stored({**GOOD, "max_new_tokens": 5000, "prompt_format": "instruction"})
    assert long.prompt_format == "instruction" and long.ban_eos
    told = stored({**GOOD, "settings": {"ban_eos": False}})
    assert not told.ban_eos
    response = client.post("/api/generations", json={**GOOD, "prompt_format": "sonnet"})
    assert response.status_code == 422 and response.json()["detail"][0]["msg"].startswith("prompt_format: ")


def test_write_form_maps_prompt_format_and_end_of_text_both_ways():
    from ui.forms.forms import SettingsForm, form_from_settings

    settings = SettingsForm(target=5000, prompt_format="Follow my instruction").to_settings().settings
    assert settings.prompt_format == "instruction" and settings.ban_eos
    assert not SettingsForm(target=5000, past_eos="Stop there").to_settings().settings.ban_eos
    for form in (SettingsForm(target=5000, prompt_format="Follow my instruction"),
                 SettingsForm(target=500, past_eos="Keep writing"), SettingsForm(target=5000, past_eos="Stop there")):
        asked = form.to_settings()
        back = form_from_settings(asked.settings, asked.speed)
        assert (back.prompt_format, back.past_eos) == (form.prompt_format, form.past_eos)


def test_one_end_of_text_rule_whatever_the_length_for_write_compare_api_and_cli():
    """It used to ban end-of-text only above 3,000 tokens: a 500-token comparison stopped where the model
    ended the text while a 5,000-token draft went on, and the command line never banned it."""
    from tokenswift.cli.main import build_parser
    from ui.api.api_input import GenerationIn, to_settings
    from ui.compare.compare import queue_runs
    from ui.drafts.drafts import DraftService
    from ui.forms.forms import DEFAULTS, SAMPLERS, SettingsForm
    from ui.forms.samplers_panel import NAMES

    write = [SettingsForm(target=n).to_settings().settings.ban_eos for n in (100, 500, 3000, 3001, 50_000)]
    api = [to_settings(GenerationIn(prompt="x", max_new_tokens=n)).settings.ban_eos for n in (100, 5000)]
    cli = build_parser().parse_args(["generate", "--prompt", "x", "--max-new-tokens", "100"]).ban_eos
    assert set(write) == set(api) == {cli} == {True}
    assert not build_parser().parse_args(["generate", "--prompt", "x", "--max-new-tokens", "9", "--no-ban-eos"]).ban_eos

    class Queue:  # records what Compare would queue
        def __init__(self):
            self.settings = []

        def create_session(self, *args, **kwargs):
            return type("Book", (), {"id": 1})()

        def enqueue_generation(self, prompt, settings, **kwargs):
            self.settings.append(settings)
            return type("Gen", (), {"id": len(self.settings)})()

        def list_workers(self):
            return []

    class NoTokenizer:  # the prompt cannot be counted here: only the worker checks its length
        def measure(self, text):
            return None

    queue = Queue()
    column = [DEFAULTS["penalty"], DEFAULTS["penalty_window"], DEFAULTS["k"], DEFAULTS["sampler"],
              SAMPLERS[DEFAULTS["sampler"]][1], "fused", *[getattr(SettingsForm(), name) for name in NAMES]]
    queue_runs(DraftService(queue, NoTokenizer()), "x", 0, 500, 1.0, 1, column)
    assert [s.settings.ban_eos for s in queue.settings] == [True, True]  # the column and its AR twin


def running(client, store) -> tuple[int, Owner]:
    """A draft the test plays the worker of, with one chunk written."""
    gen_id = client.post("/api/generations", json=GOOD).json()["id"]
    owner = Owner.here("test-worker")
    store.claim_next(owner)
    store.record_start(gen_id, owner, [1], "stories", None)
    store.append_progress(gen_id, owner, Progress([5], "Once", 0.1))
    return gen_id, owner


class Waits:
    """Counts the status reads that found nothing new and wait for a commit (ui/follow.py), so a test acts once
    they wait, in that order, not after a guessed delay. `began`: waits begun so far (a read woken by a commit
    that was not its draft's, or by PostgreSQL's fallback, waits again); `waiting`: those waiting now."""

    def __init__(self, monkeypatch):
        self.began = self.waiting = 0
        after = Commits.after

        async def counted(commits, version, timeout_s):
            self.began += 1
            self.waiting += 1
            try:
                await after(commits, version, timeout_s)
            finally:
                self.waiting -= 1

        monkeypatch.setattr(Commits, "after", counted)

    def until(self, n: int) -> None:
        deadline = time.monotonic() + 60
        while self.waiting < n:
            assert time.monotonic() < deadline, f"{self.waiting} of {n} status reads wait after 60 s"
            time.sleep(0.01)


class Poll(threading.Thread):
    """A status read in a thread of its own; answer() waits for it (60 s at most) and says how long it took."""

    def __init__(self, client, path: str):
        super().__init__()
        self.client, self.path, self.began = client, path, time.monotonic()
        self.start()

    def run(self) -> None:
        self.body = self.client.get(self.path).json()
        self.took = time.monotonic() - self.began

    def answer(self) -> tuple[dict, float]:
        self.join(60)
        assert not self.is_alive(), f"{self.path}: no answer within 60 s"
        return self.body, self.took


@both_backends  # woken by the commit counter, or by the fallback tick
def test_a_long_poll_answers_as_soon_as_text_past_its_chunk_arrives(client, store, monkeypatch):
    gen_id, owner = running(client, store)
    waits = Waits(monkeypatch)
    poll = Poll(client, f"/api/generations/{gen_id}?since=1&wait=10")
    waits.until(1)  # it found nothing past chunk 1 and waits
    store.append_progress(gen_id, owner, Progress([6], " upon", 0.2))
    body, took = poll.answer()
    assert (body["text"], body["next_since"], body["status"]) == (" upon", 2, "running")
    assert took < 10  # woken by the commit (within a tick, or PostgreSQL's fallback), not at its 10 s timeout
    began = waits.began
    body = client.get(f"/api/generations/{gen_id}?since=1&wait=10").json()
    assert body["text"] == " upon" and waits.began == began  # text past chunk 1 is there already: no wait


@both_backends
def test_a_long_poll_without_new_text_answers_at_its_timeout_and_a_stopped_draft_at_once(client, store, monkeypatch):
    gen_id, owner = running(client, store)
    waits = Waits(monkeypatch)
    poll = Poll(client, f"/api/generations/{gen_id}?since=1&wait=1.5")
    waits.until(1)
    assert client.post("/api/generations", json=GOOD).status_code == 201  # a commit while it waits, not its draft's
    body, took = poll.answer()
    assert (body["text"], body["next_since"], body["status"]) == ("", 1, "running")
    assert took >= 1.5  # not answered at the other draft's commit
    store.append_progress(gen_id, owner, Progress([6], " upon", 0.2), finish="done")
    began = waits.began
    body = client.get(f"/api/generations/{gen_id}?since=2&wait=10").json()
    assert (body["text"], body["status"]) == ("", "done") and waits.began == began  # nothing more will come: no wait
    assert client.get(f"/api/generations/{gen_id}?wait=0").json()["text"] == "Once upon"  # wait=0: a plain read


@pytest.mark.parametrize("query", ["since=0&wait=-1", "since=0&wait=10.5", "since=0&wait=nan", "since=0&wait=inf",
                                   "since=0&wait=soon", "since=0&wait=", "wait=5"])
def test_bad_waits_are_422_naming_wait(client, query):
    response = client.get(f"/api/generations/1?{query}")
    assert response.status_code == 422  # checked before the draft is looked up (there is none)
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["query", "wait"] and detail["msg"].startswith("wait: ")


@both_backends
def test_many_long_polls_share_one_watcher_that_stops_when_they_are_answered(client, store, monkeypatch):
    gen_id, owner = running(client, store)
    waits = Waits(monkeypatch)
    polls = [Poll(client, f"/api/generations/{gen_id}?since=1&wait=10") for _ in range(8)]
    waits.until(8)
    watchers = [t for t in threading.enumerate() if t.name == "status-long-poll"]
    assert len(watchers) == 1  # one thread asks the store for all eight
    store.append_progress(gen_id, owner, Progress([6], " upon", 0.2))
    assert [poll.answer()[0]["text"] for poll in polls] == [" upon"] * 8
    watchers[0].join(60)
    assert not watchers[0].is_alive()  # nobody waits: no thread left polling the store


def test_memory_and_authors_note_per_draft(client, store):
    body = {**GOOD, "memory": "Ann is a lighthouse keeper.", "authors_note": "Storm tonight."}
    gen_id = client.post("/api/generations", json=body).json()["id"]
    got = client.get(f"/api/generations/{gen_id}").json()
    assert (got["memory"], got["authors_note"]) == ("Ann is a lighthouse keeper.", "Storm tonight.")
    put = client.put(f"/api/generations/{gen_id}/context", json={"memory": "Ann and Bo.", "authors_note": ""})
    assert put.status_code == 200 and put.json() == {"id": gen_id, "memory": "Ann and Bo.", "authors_note": "",
                                                     "world_info": None}
    assert store.get_generation(gen_id).memory == "Ann and Bo."
    for bad, field in (({"memory": 5, "authors_note": ""}, "memory"), ({"memory": ""}, "authors_note"),
                       ({"memory": "x" * 20_001, "authors_note": ""}, "memory"),
                       ({"memory": "", "authors_note": "\ud800"}, "authors_note")):
        response = client.put(f"/api/generations/{gen_id}/context", content=json.dumps(bad),  # escapes \ud800
                              headers={"content-type": "application/json"})
        assert response.status_code == 422, bad
        assert response.json()["detail"][0]["msg"].startswith(f"{field}: ")
    assert client.put("/api/generations/999/context", json={"memory": "", "authors_note": ""}).status_code == 404
    created = client.post("/api/generations", json={**GOOD, "authors_note": 3})
    assert created.status_code == 422 and created.json()["detail"][0]["loc"] == ["body", "authors_note"]
    shift = client.post("/api/generations", json=with_settings(context_window=8, note_depth=-1))
    assert shift.status_code == 422 and shift.json()["detail"][0]["msg"].startswith("settings.context_window: ")
