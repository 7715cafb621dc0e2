"""The layer's shape, checked on its source (issue 30): every module has a row, and every import, at the top of a
module or inside a function (a lazy import counts), goes to a module of a lower row: no circle, nothing upward.
docs/design.md draws the same rows."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "layer" / "idempotency_layer"

# Each module's row, higher imports lower; modules of one row never import each other.
ROWS = {
    "__main__": 100,
    "cli": 90,
    "cli.doctor": 80, "cli.derive": 80, "cli.records": 80,
    "cli.settings": 75, "cli.output": 75, "cli.checks.dynamodb": 75, "cli.checks.valkey": 75, "cli.checks.bucket": 75,
    "cli.checks.check": 74, "cli.checks": 74,
    "interceptor": 70,
    "metrics": 65,
    "executor": 60,
    "sources": 55,
    "sources.http": 50, "sources.batch": 50,
    "sources.kafka": 45, "sources.mq": 45,
    "sources.records": 42, "sources.redelivery": 42, "sources.durable": 42, "powertools": 42, "previous": 42,
    "cycle": 40,
    "keeping": 38, "precheck": 38,
    "invocation": 35,
    "stores": 34,
    "stores.valkey": 33,
    "stores.valkey.store": 32,
    "stores.dynamodb.store": 30,
    "record_mac": 29,
    "stores.protocol": 28,
    "stores.dynamodb": 26,
    "stores.dynamodb.client": 25, "stores.dynamodb.boto3_client": 25, "stores.valkey.auth": 25,
    "stores.dynamodb.connection": 24, "stores.valkey.client": 24, "stores.s3": 24, "aws.secrets": 24,
    "stores.dynamodb.environment": 23, "stores.dynamodb.botocore_source": 23, "stores.dynamodb.wire": 23,
    "aws.sigv4": 23, "stores.dynamodb.retry": 23, "stores.dynamodb.http_connection": 23,
    "stores.dynamodb.errors": 22, "aws.target": 22, "aws.trust": 22, "aws.environment": 22, "stores.valkey.resp": 22,
    "aws": 21,
    "results": 20, "keys": 20,
    "config": 15, "codec": 15,
    "store_settings": 13,
    "setting_readers": 12,
    "errors": 10, "deadline": 10, "log": 10, "plan": 10,
    "__init__": 0,
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, level: int, name: str) -> str:
    """The module an import names, relative to the package (`from ..x import y` in sources.batch: x)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (level - 1)] if level else []
    return ".".join([*base, *([name] if name else [])]).removeprefix("idempotency_layer.")


def imports(module: str, path: Path) -> list[str]:
    """Every module of the package `module` imports, wherever in it (a function's body, a TYPE_CHECKING block)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith("idempotency_layer"):
                continue
            target = _resolve(module, path, node.level, node.module or "")
            names = [f"{target}.{a.name}" if target else a.name for a in node.names]
            known = [n for n in names if n in ROWS]  # `from . import codec`: the module itself
            found.extend(known or [target])
        elif isinstance(node, ast.Import):
            found += [a.name.removeprefix("idempotency_layer.") for a in node.names
                      if a.name.startswith("idempotency_layer")]
    return [name for name in found if name != module]


def test_every_module_has_a_row():
    assert set(_modules()) == set(ROWS)


@pytest.mark.parametrize("module", sorted(ROWS))
def test_a_module_imports_only_from_rows_below_its_own(module):
    path = _modules()[module]
    for target in imports(module, path):
        assert target in ROWS, f"{module} imports {target}, which has no row"
        assert ROWS[target] < ROWS[module], f"{module} (row {ROWS[module]}) imports {target} (row {ROWS[target]})"


def test_the_check_finds_an_upward_import_in_a_function(tmp_path):
    # It cannot pass vacuously: a lazy upward import, as results once reached up to the cycle, is found.
    path = tmp_path / "results.py"
    path.write_text("def encode():\n    from .cycle import Undeliverable\n")
    assert imports("results", path) == ["cycle"]
    assert ROWS["cycle"] > ROWS["results"]
    path.write_text("from ..keys import KeyDeriver\nfrom . import kafka\n")
    (tmp_path / "sources").mkdir()
    moved = tmp_path / "sources" / "batch.py"
    moved.write_text(path.read_text())
    assert imports("sources.batch", moved) == ["keys", "sources.kafka"]


def test_design_md_draws_these_rows():
    text = (PACKAGE.parents[1] / "docs" / "design.md").read_text()
    block = text.split("```text\nrows  ", 1)[1].split("```", 1)[0]
    drawn = [line.split() for line in block.splitlines() if line.strip()]
    rows: dict[int, list[str]] = {}
    for module, row in ROWS.items():
        if module != "__init__":
            rows.setdefault(row, []).append(module)
    expected = [sorted(rows[row]) for row in sorted(rows, reverse=True)]
    assert [sorted(line) for line in drawn] == expected


# The storage floor's rules (docs/design.md, "The storage floor"), the design review's Appendix A made tests.
BACKENDS = {"dynamodb": "stores.dynamodb", "valkey": "stores.valkey", "s3": "stores.s3"}
OPENER = "stores"
KIT = "aws"
# Outside stores/, only the opener and a backend's own operator checks import it; powertools.py reads
# Powertools' records, which live in DynamoDB.
CHECKS = {"dynamodb": ("cli.checks.dynamodb", "powertools"), "valkey": ("cli.checks.valkey",),
          "s3": ("cli.checks.bucket",)}
# The layers above the stores, which speak the protocol only: in code and in what they say.
ABOVE = ("cycle", "executor", "sources", "plan", "invocation", "results", "codec", "keeping", "precheck")
BACKEND_WORDS = re.compile(r"DynamoDB(?!\s+Streams)|BatchGetItem|dynamodb:|Valkey|valkey|\bS3\b")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def backend_of(module: str) -> str | None:
    return next((name for name, prefix in BACKENDS.items() if _under(module, prefix)), None)


def floor_violations(modules: dict[str, Path]) -> list[str]:
    found = []
    for module, path in modules.items():
        mine = backend_of(module)
        for target in imports(module, path):
            theirs = backend_of(target)
            if theirs is None or theirs == mine:
                continue
            if mine is not None:
                found.append(f"rule 1: the backend {module} imports another backend, {target}")
            elif module != OPENER and not any(_under(module, c) for c in CHECKS[theirs]):
                found.append(f"rule 2: {module} imports the backend {target}; only the opener may")
        if _under(module, KIT) and any(_under(t, "stores") for t in imports(module, path)):
            found.append(f"rule 3: the AWS kit's {module} imports the stores")
        if any(_under(module, above) for above in ABOVE):
            said = _said(path)
            if said:
                found.append(f"rule 4: {module} names a backend: {said[:3]}")
    return found


def _said(path: Path) -> list[str]:
    """Backend words in a module's code and strings, docstrings and comments aside."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)}
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docs] + [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    return [m.group(0) for text in texts for m in BACKEND_WORDS.finditer(text)]


def test_the_storage_floor_keeps_its_rules():
    assert floor_violations(_modules()) == []


def test_the_floor_check_finds_each_kind_of_break(tmp_path):
    # It cannot pass vacuously: a planted import of each kind, and a backend's name in a message, are found.
    planted = {
        "stores.valkey.store": "from ..dynamodb.store import DynamoDBStore\n",
        "cli.records": "from ..stores.s3 import pointer\n",
        "aws.sigv4": "from ..stores.protocol import Record\n",
        "cycle": "def f():\n    raise ValueError('the role lacks dynamodb:BatchGetItem')\n",
    }
    modules = {}
    for module, text in planted.items():
        path = tmp_path / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[module] = path
    found = floor_violations(modules)
    assert [line.split(":")[0] for line in found] == ["rule 1", "rule 2", "rule 3", "rule 4"], found


CONSTRUCTORS = re.compile(r"\b(DynamoDBStore|ValkeyStore|make_store|make_transport|from_environment)\(")


def test_backends_are_built_only_by_the_opener_and_their_checks():
    built = [f"{module}: {m.group(0)}" for module, path in _modules().items()
             if not _under(module, "stores") and not _under(module, "cli.checks")
             for m in CONSTRUCTORS.finditer(path.read_text())]
    assert built == []
