"""The engine's packages import each other in one direction (tokenswift/settings/__init__.py gives the order): a
package never imports, directly or through others, one that imports it (the graph: import_graph.py)."""

from __future__ import annotations

from pathlib import Path

from import_graph import group_imports, loops

ROOT = Path(__file__).resolve().parents[1] / "tokenswift"


def package_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Package -> the other tokenswift packages its modules import (its modules at the top, such as __main__, are
    no package)."""
    edges = {package: {name for name in names if (root / name).is_dir()}
             for package, names in group_imports(root, "tokenswift").items()}
    return {package: names for package, names in edges.items() if names}


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
