"""Rules of shape over the whole source tree (tests aside), read from the code itself: a class name means one thing."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers import ROOT


def source_files() -> list[Path]:
    """Every Python file outside tests: each top-level package, the scripts and the top-level modules."""
    folders = sorted(path for path in ROOT.iterdir() if (path / "__init__.py").is_file() and path.name != "tests")
    files = sorted(ROOT.glob("*.py")) + sorted((ROOT / "scripts").rglob("*.py"))
    for folder in folders:
        files += sorted(folder.rglob("*.py"))
    return files


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_the_scan_sees_the_source_tree() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in source_files()}
    assert {"streamlit_app.py", "batching/engine/batcher.py", "app/common/streaming.py", "config/settings.py"} <= names
    assert not any(name.startswith("tests/") for name in names)


def test_no_class_name_is_defined_twice() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for path in source_files():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                places[node.name].append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    twice = {name: where for name, where in places.items() if len(where) > 1}
    assert not twice, f"class names defined more than once: {twice}"


# A function fits on a screen: from its `def` to its last line, docstring included.
MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = []
    for path in source_files():
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
