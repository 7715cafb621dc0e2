"""The README's settings table lists exactly the IDEMPOTENCY_* variables the layer reads: every one the code
names (the package but its operator CLI, and the exec wrapper), no more, no fewer (issue 30)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layer" / "idempotency_layer"
NAME = re.compile(r"IDEMPOTENCY_[A-Z][A-Z_]*[A-Z]")


def read_by_the_layer() -> set[str]:
    """Every IDEMPOTENCY_* name the layer's modules hold as a string of its own (what they read from the environment
    and name in their messages), and every one the wrapper script uses."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue  # the operator CLI's own (IDEMPOTENCY_CLI_TRACEBACK), documented with it
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                found.add(node.value)
    found |= set(NAME.findall((ROOT / "wrapper" / "idempotency-wrapper").read_text()))
    return found


def in_the_table() -> set[str]:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Settings"):text.index("## Sources")]
    return set(re.findall(r"^\| `(IDEMPOTENCY_[A-Z_]+)`", table, re.M))


def test_the_settings_table_lists_exactly_what_the_layer_reads():
    table = in_the_table()
    assert len(table) > 20
    # The wrapper sets these itself; the README says so under the table. The CLI's own is documented with it.
    wrappers = {"IDEMPOTENCY_ORIGINAL_HANDLER", "IDEMPOTENCY_WRAPPER_CHAINED"}
    assert read_by_the_layer() - table - {"IDEMPOTENCY_CLI_TRACEBACK"} == wrappers
    assert table - read_by_the_layer() == set()
    assert ("`IDEMPOTENCY_ORIGINAL_HANDLER` and `IDEMPOTENCY_WRAPPER_CHAINED` are set by the wrapper"
            in (ROOT / "README.md").read_text())


def test_the_check_sees_what_config_reads():
    # Cannot pass vacuously: names read through config's tables and its helpers are all found.
    found = read_by_the_layer()
    assert {"IDEMPOTENCY_TABLE", "IDEMPOTENCY_SCOPE", "IDEMPOTENCY_STATUS_ATTR", "IDEMPOTENCY_NEXT_WRAPPER",
            "IDEMPOTENCY_BATCH_RESPONSE", "IDEMPOTENCY_DISABLED"} <= found


def test_the_names_init_accepts_are_exactly_those_the_layer_reads():
    """config.NAMES (any other IDEMPOTENCY_* name fails init, issue 29) holds every name the layer, its wrapper and
    its CLI read, and nothing else."""
    from idempotency_layer import config

    cli = set()
    for path in (PACKAGE / "cli").rglob("*.py"):
        cli |= {node.value for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)}
    assert "IDEMPOTENCY_CLI_TRACEBACK" in cli
    assert set(config.NAMES) == read_by_the_layer() | cli
