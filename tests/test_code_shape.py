"""The house's size rules, checked rather than remembered: no function over MAX_FUNCTION lines anywhere but the
database migrations (each a one-off script, replayed as written), and no module of the app's over MAX_MODULE lines
(tests may run longer: a file per subject)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_FUNCTION = 80
MAX_MODULE = 400
SKIPPED = {"migrations", "node_modules"}


def sources(root: Path = REPO) -> list[Path]:
    """The project's Python files: not the migrations, nor hidden folders (.venv, .git, a device run's .carry)."""
    return sorted(p for p in root.rglob("*.py")
                  if not SKIPPED & set(p.relative_to(root).parts)
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def long_functions(paths: list[Path], limit: int = MAX_FUNCTION) -> list[str]:
    """'path:line name (n lines)' for each function or method longer than `limit` lines, decorators not counted."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno} "
                                 f"{node.name} ({lines} lines)")
    return found


def test_no_function_is_over_80_lines():
    paths = sources()
    assert any(p.parts[-2:] == ("decode", "engine.py") for p in paths)  # the walk finds the code
    assert long_functions(paths) == []


def test_no_module_of_the_app_is_over_400_lines():
    long = [f"{p.relative_to(REPO)} ({n})" for p in sources() if p.relative_to(REPO).parts[0] != "tests"
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE]
    assert long == []


def test_a_long_function_is_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION))
    (tmp_path / "a.py").write_text(f"class A:\n    def short(self):\n        return 1\n\n\ndef long():\n{body}")
    assert long_functions(sources(tmp_path)) == [f"{tmp_path / 'a.py'}:6 long ({MAX_FUNCTION + 1} lines)"]
