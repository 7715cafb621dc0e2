"""The layer's sizes, checked on its source (issue 43): no module over 600 lines and no class over 400, so that
each part stays one a reader can hold; a module that grows past them is split along what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layer" / "idempotency_layer"
MODULE_LINES = 600
CLASS_LINES = 400


def oversized(path: Path, root: Path = PACKAGE) -> list[str]:
    """The module at `path` and each class in it (nested ones too) that is over its limit, named with its size."""
    text = path.read_text()
    name = path.relative_to(root).as_posix()
    found = []
    lines = len(text.splitlines())
    if lines > MODULE_LINES:
        found.append(f"{name}: {lines} lines (a module: at most {MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            size = node.end_lineno - node.lineno + 1
            if size > CLASS_LINES:
                found.append(f"{name}:{node.lineno} class {node.name}: {size} lines (a class: at most {CLASS_LINES})")
    return found


def test_no_module_over_600_lines_and_no_class_over_400():
    found = [entry for path in sorted(PACKAGE.rglob("*.py")) for entry in oversized(path)]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_long_module_and_a_long_class(tmp_path):
    # It cannot pass vacuously: a module of 601 lines and a class of 401 are both named.
    path = tmp_path / "big.py"
    path.write_text("class Big:\n" + "    x = 1\n" * 400 + "\n" * 199 + "y = 2\n")
    assert oversized(path, tmp_path) == ["big.py: 601 lines (a module: at most 600)",
                                         "big.py:1 class Big: 401 lines (a class: at most 400)"]
    path.write_text("class Small:\n" + "    x = 1\n" * 399 + "\n" * 199)
    assert oversized(path, tmp_path) == []
