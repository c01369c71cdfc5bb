"""Each room of ui/ sees only the store operations it uses: its store_ops.py declares them as a Protocol that
storage.Store satisfies, its modules take the store as that type and call nothing else on it. Only the places that
build the app from a whole Store (the page, the server, the REST API's app, and the drafts' text cache, whose commit
counter reads the database itself) name the Store."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Protocol

from storage import Store

UI = Path(__file__).resolve().parents[1] / "ui"
WHOLE_STORE = {"page.py", "server.py", "api/api.py", "drafts/texts.py"}


def room_protocol(room: str) -> type:
    module = importlib.import_module(f"ui.{room}.store_ops")
    (protocol,) = [v for v in vars(module).values()
                   if isinstance(v, type) and v.__module__ == module.__name__ and Protocol in v.__mro__]
    return protocol


def operations(protocol: type) -> set[str]:
    """The operations a store Protocol declares, its bases' included."""
    return {name for cls in protocol.__mro__ if cls.__module__.startswith("ui.")
            for name, value in vars(cls).items() if inspect.isfunction(value) and not name.startswith("_")}


def store_calls(path: Path) -> set[str]:
    """What a module reads of a store: `store.x`, `self.store.x`, `drafts.store.x`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "store") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "store"):
                found.add(node.attr)
    return found


def rooms() -> list[str]:
    return sorted(p.parent.name for p in UI.glob("*/store_ops.py"))


def test_every_room_declares_its_store():
    assert rooms() == ["api", "compare", "display", "drafts", "library", "model", "plan", "write"]


def test_each_declared_operation_is_the_stores_own():
    for room in rooms():
        protocol = room_protocol(room)
        for name in operations(protocol):
            assert inspect.signature(getattr(protocol, name)) == inspect.signature(getattr(Store, name)), (room, name)


def test_each_room_calls_only_what_it_declares():
    for room in rooms():
        declared = operations(room_protocol(room))
        for path in (UI / room).glob("*.py"):
            assert store_calls(path) <= declared, (path.name, store_calls(path) - declared)


def test_only_the_builders_name_the_whole_store():
    naming = {str(p.relative_to(UI)) for p in UI.rglob("*.py")
              if any(isinstance(n, ast.ImportFrom) and n.module == "storage" and "Store" in {a.name for a in n.names}
                     for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))}
    assert naming == WHOLE_STORE


def test_a_call_outside_the_declaration_is_found(tmp_path):
    (tmp_path / "a.py").write_text("def f(store, self):\n    store.get_tokens(1)\n    self.store.delete_everything()\n")
    assert store_calls(tmp_path / "a.py") - operations(room_protocol("display")) == {"get_tokens", "delete_everything"}
