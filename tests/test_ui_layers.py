"""ui's rooms (ui/<room>/<module>.py, the README's table) import each other in one direction, as the engine's
packages do (test_package_layers.py): a room never imports, directly or through others, one that imports it, and
none imports the page or the server (ui/page.py, ui/server.py), which import them all."""

from __future__ import annotations

from pathlib import Path

from import_graph import group_imports, loops

ROOT = Path(__file__).resolve().parents[1] / "ui"


def room_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Room -> the other rooms (or ui's own modules: page, server) its modules import (import_graph.py)."""
    return group_imports(root, "ui")


def test_ui_rooms_import_in_one_direction():
    edges = room_imports()
    assert {"api", "drafts", "forms", "write", "plan", "library", "compare", "model"} <= set(edges)
    assert loops(edges) == []


def test_no_room_imports_the_page_or_the_server():
    assert {room for room, targets in room_imports().items() if targets & {"page", "server"}} == set()


def test_display_imports_no_other_room():
    assert "display" not in room_imports()  # the lowest room: every other one may import it


def test_a_loop_between_rooms_is_found(tmp_path):
    for room, other in (("low", "high"), ("high", "low")):
        (tmp_path / room).mkdir()
        (tmp_path / room / "a.py").write_text(f"def f():\n    from ui.{other} import a\n")
    assert loops(room_imports(tmp_path)) == ["high -> low", "low -> high"]
