"""The import graph between a package's sub-packages (tokenswift's packages, ui's rooms), for the tests that keep
them in one direction (test_package_layers.py, test_ui_layers.py). Every import counts, the ones inside functions
and under TYPE_CHECKING too: each is a dependency a reader has to follow."""

from __future__ import annotations

import ast
from pathlib import Path


def group_imports(root: Path, top: str) -> dict[str, set[str]]:
    """Group (a folder of `root`, the package `top`) -> the names directly under `top` that its modules import,
    its own excepted; `from top import name` counts as importing `top.name`."""
    edges: dict[str, set[str]] = {}
    for path in root.glob("*/*.py"):
        group = path.parent.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == top:
                names = [f"{top}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == top and len(parts) > 1 and parts[1] != group:
                    edges.setdefault(group, set()).add(parts[1])
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
