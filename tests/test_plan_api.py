"""The plan's REST routes (ui/plan_api.py) on a real SQLite store: a book planned, its chapters written, moved,
chosen and exported; bad input is a 422 naming the field."""

from __future__ import annotations

import io
import re
import zipfile

import pytest
from fastapi.testclient import TestClient

from storage import open_store
from storage.records import Owner, Progress
from ui.api.api import create_app


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    yield s
    s.close()


@pytest.fixture
def client(store):
    return TestClient(create_app(store))


def finish(store, gen_id: int, text: str) -> None:
    owner = Owner.here("w")
    assert store.claim_next(owner).id == gen_id
    store.record_start(gen_id, owner, [1, 2], "m", None)
    store.append_progress(gen_id, owner, Progress([3, 4], text, 0.1), finish="done")


def field(response) -> str:
    assert response.status_code == 422, response.text
    return response.json()["detail"][0]["msg"].split(":")[0]


def test_a_book_planned_written_and_exported_by_chapters(client, store):
    book = client.post("/api/books", json={"title": "The Lighthouse", "author": "Ann"}).json()
    plan = client.put(f"/api/books/{book['id']}/plan", json={
        "premise": "A keeper finds a diary.",
        "characters": [{"name": "Ann", "description": "the keeper", "keys": ["keeper"]}]}).json()
    assert plan["characters"] == [{"name": "Ann", "description": "the keeper", "keys": ["keeper"]}]
    chapters = [client.post(f"/api/books/{book['id']}/chapters", json={"title": t, "beats": b}).json()
                for t, b in (("Arrival", ["Ann takes the post"]), ("The Storm", ["the lamp fails"]), ("Dawn", []))]
    assert [(c["number"], c["state"]) for c in chapters] == [(1, "not written"), (2, "not written"), (3, "not written")]
    base = f"/api/books/{book['id']}/chapters"

    first = client.post(f"{base}/{chapters[0]['id']}/write", json={"max_new_tokens": 30, "seed": 3})
    assert first.status_code == 201, first.text
    draft = client.get(f"/api/generations/{first.json()['id']}").json()
    assert draft["origin"] == "chapter" and draft["memory"].endswith("Premise: A keeper finds a diary.")
    assert draft["world_info"]["entries"][0]["constant"] is True  # Ann is named in the chapter's beats
    assert client.post(f"{base}/{chapters[0]['id']}/write", json={"max_new_tokens": 30}).status_code == 409
    finish(store, first.json()["id"], "Ann came on the ferry.")
    second = client.post(f"{base}/{chapters[1]['id']}/write", json={"max_new_tokens": 30}).json()
    written = store.get_generation(second["id"])
    assert "the lamp fails" in written.prompt_text and written.memory.endswith("ends:\n\nAnn came on the ferry.")
    finish(store, second["id"], "The wind rose.")

    edited = client.post(f"/api/generations/{second['id']}/edit", json={"text": "The wind rose at dusk."}).json()
    moved = client.put(f"{base}/{chapters[2]['id']}", json={"position": 1, "title": "Dawn, before"}).json()
    assert (moved["number"], moved["title"]) == (1, "Dawn, before")
    listed = client.get(f"/api/books/{book['id']}/plan").json()["chapters"]
    assert [(c["title"], c["state"], c["words"], c["draft_id"]) for c in listed] == [
        ("Dawn, before", "not written", 0, None), ("Arrival", "written", 5, first.json()["id"]),
        ("The Storm", "written", 5, edited["id"])]  # the chapter follows the writer's edit

    epub = client.get(f"/api/books/{book['id']}/export?format=epub")
    assert epub.status_code == 200 and epub.headers["content-type"] == "application/epub+zip"
    with zipfile.ZipFile(io.BytesIO(epub.content)) as archive:
        nav = archive.read("OEBPS/nav.xhtml").decode()
    # Chapters are numbered as the plan numbers them; one not written yet is left out.
    assert re.findall(r"<a href=\"[^\"]+\">([^<]+)</a>", nav) == ["Chapter 2: Arrival", "Chapter 3: The Storm"]
    md = client.get(f"/api/books/{book['id']}/export?format=md").text
    assert "## Chapter 3: The Storm\n\nThe wind rose at dusk." in md

    back = client.put(f"{base}/{chapters[1]['id']}", json={"draft_id": second["id"]}).json()
    assert back["draft_id"] == second["id"] and back["words"] == 3
    assert client.delete(f"{base}/{chapters[0]['id']}").status_code == 204
    assert [c["title"] for c in client.get(f"/api/books/{book['id']}/plan").json()["chapters"]] == [
        "Dawn, before", "The Storm"]
    assert store.get_generation(first.json()["id"]).id  # its draft stays in the book


def test_bad_input_is_a_422_naming_the_field_and_missing_things_404(client, store):
    book = client.post("/api/books", json={"title": "B"}).json()["id"]
    other = client.post("/api/books", json={"title": "Other"}).json()["id"]
    chapter = client.post(f"/api/books/{book}/chapters", json={"title": "One"}).json()["id"]
    assert field(client.post("/api/books", json={"title": " "})) == "title"
    assert field(client.put(f"/api/books/{book}/plan", json={"premise": 5})) == "premise"
    assert field(client.put(f"/api/books/{book}/plan", json={"premise": "x" * 10_001})) == "premise"
    assert field(client.put(f"/api/books/{book}/plan", json={"characters": [{"name": "Ann", "keys": ["a*"]}]})) == (
        "characters[0].keys")
    assert field(client.put(f"/api/books/{book}/plan", json={"characters": [{"nom": "Ann"}]})) == "characters.0.name"
    assert field(client.post(f"/api/books/{book}/chapters", json={"title": "T", "beats": ["x" * 1001]})) == "beats[0]"
    assert field(client.post(f"/api/books/{book}/chapters", json={"title": "T", "position": 0})) == "position"
    assert field(client.put(f"/api/books/{book}/chapters/{chapter}", json={"draft_id": 999})) == "draft_id"
    write = f"/api/books/{book}/chapters/{chapter}/write"
    assert field(client.post(write, json={"max_new_tokens": 10**12})) == "max_new_tokens"
    assert field(client.post(write, json={"max_new_tokens": 10, "settings": {"temperature": -1}})) == (
        "settings.temperature")
    assert field(client.post(write, json={})) == "max_new_tokens"
    assert field(client.get(f"/api/books/{book}/export?format=pdf")) == "format"
    assert client.get(f"/api/books/{book + 99}/plan").status_code == 404
    assert client.put(f"/api/books/{other}/chapters/{chapter}", json={"title": "x"}).status_code == 404
    assert client.post(f"/api/books/{other}/chapters/{chapter}/write", json={"max_new_tokens": 5}).status_code == 404
    assert client.delete(f"/api/books/{book}/chapters/{chapter + 99}").status_code == 404
    assert store.list_generations() == []  # nothing was queued by any of them
