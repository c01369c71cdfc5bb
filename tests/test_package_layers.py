"""The engine's packages import each other in one direction (tokenswift/settings/__init__.py gives the order): a
package never imports, directly or through others, one that imports it. Every import counts, the ones inside
functions and under TYPE_CHECKING too: each is a dependency a reader has to follow."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tokenswift"


def package_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Package -> the other tokenswift packages its modules import."""
    edges: dict[str, set[str]] = {}
    for path in root.glob("*/*.py"):
        package = path.parent.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "tokenswift" and len(parts) > 1 and parts[1] != package and (root / parts[1]).is_dir():
                    edges.setdefault(package, set()).add(parts[1])
    return edges


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def loops(edges: dict[str, set[str]]) -> list[str]:
    """'a -> b' for each import of b by a where b leads back to a."""
    return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets if a in reachable(edges, b))


def test_engine_packages_import_in_one_direction():
    edges = package_imports()
    assert {"text", "sampling", "model", "draft", "decode"} <= set(edges)  # the walk finds their imports
    assert loops(edges) == []


def test_settings_imports_no_other_package():
    assert "settings" not in package_imports()  # the lowest level: every package may import it


def test_a_loop_is_found(tmp_path):
    # The check itself can fail: two packages that import each other, one through a function's import.
    for package, other in (("low", "high"), ("high", "low")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "a.py").write_text(f"def f():\n    from tokenswift.{other}.a import f\n")
    (tmp_path / "top").mkdir()
    (tmp_path / "top" / "a.py").write_text("import tokenswift.low.a\n")
    edges = package_imports(tmp_path)
    assert loops(edges) == ["high -> low", "low -> high"]
