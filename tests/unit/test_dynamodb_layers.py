"""The DynamoDB client's shape, checked on its source: layers without a circle or an upward import, no
private botocore name, no HTTP framing of our own (issue 21's "done when")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "layer" / "idempotency_layer"
CLIENT = PACKAGE / "dynamodb"

# Each module's layer, as the package docstring draws them: a module imports only from lower layers.
LAYERS = {
    "errors": 0, "deadline": 0, "target": 0, "trust": 0,
    "environment": 1, "botocore_source": 1, "wire": 1, "sigv4": 1, "retry": 1,
    "connection": 2,
    "client": 3, "boto3_client": 3,
    "__init__": 4,
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of each import in `path`; level 0 is absolute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level and not node.module:  # from . import wire
            found.extend((node.level, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
        elif isinstance(node, ast.Import):
            found.extend((0, alias.name) for alias in node.names)
    return found


def test_every_module_has_a_layer():
    assert {p.stem for p in CLIENT.glob("*.py")} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_a_module_imports_only_from_layers_below_it_and_nothing_of_the_layer_above(module):
    for level, name in _imports(CLIENT / f"{module}.py"):
        assert level <= 1, f"{module} imports {'.' * level}{name}: the client depends on nothing of the layer's"
        assert not name.startswith("idempotency_layer"), f"{module} imports {name}"
        if level == 1:
            target = name.split(".")[0] or "__init__"
            assert LAYERS[target] < LAYERS[module], f"{module} (layer {LAYERS[module]}) imports {target}"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_private_botocore_name_is_used_anywhere_in_the_layer():
    private = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "botocore":
                parts = node.module.split(".") + [alias.name for alias in node.names]
                private += [f"{path.name}: {node.module}.{p}" for p in parts if p.startswith("_")]
            elif isinstance(node, ast.Import):
                private += [f"{path.name}: {a.name}" for a in node.names
                            if a.name.startswith("botocore") and any(p.startswith("_") for p in a.name.split("."))]
        private += [f"{path.name}: {m}" for m in re.findall(r"botocore(?:\.\w+)*\._\w+", path.read_text())]
    assert private == []


def test_the_greps_above_find_what_they_look_for(tmp_path):
    # The check cannot pass vacuously: the old botocore path's import is found.
    tree = ast.parse("from botocore.auth import SigV4Auth, _host_from_url\n")
    node = tree.body[0]
    assert isinstance(node, ast.ImportFrom) and any(a.name.startswith("_") for a in node.names)
    assert RAW_READ.search("data = self.sock.recv(65536)") and RAW_READ.search("n = sock.recv_into(buf)")


# Reading a socket directly means parsing HTTP ourselves; http.client reads it (connection.py may hand it a
# socket's file object, through which it reads).
RAW_READ = re.compile(r"\.recv(?:_into|from|msg)?\(")


def _framing_literals(text: str) -> list[bytes]:
    """Byte strings that only a hand-written HTTP reader or writer needs: line ends, status lines, chunk ends."""
    return [node.value for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes)
            and any(mark in node.value for mark in (b"\r\n", b"\n", b"HTTP/", b"0\r"))]


def test_no_raw_socket_reads_and_no_http_framing_of_our_own():
    for path in _sources():
        text = path.read_text()
        assert not RAW_READ.search(text), f"{path.name} reads a socket itself"
        assert _framing_literals(text) == [], f"{path.name} frames HTTP itself"
    assert "import http.client" in (CLIENT / "connection.py").read_text()


def test_the_framing_check_finds_the_old_reader():
    assert _framing_literals('if line in (b"\\r\\n", b"\\n"):\n    pass\n')
