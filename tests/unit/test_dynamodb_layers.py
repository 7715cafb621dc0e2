"""The DynamoDB client's shape, checked on its source: no private botocore name, no HTTP framing of our own (issue
21's "done when"); its layers are checked with the whole package's (tests/unit/test_layers.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layer" / "idempotency_layer"
CLIENT = PACKAGE / "stores" / "dynamodb"

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


# The Valkey store's RESP2 framing is its own by decision (stores/valkey/resp.py says why, with the figures): a
# different protocol, on its own socket. It holds nothing of HTTP's.
RESP = PACKAGE / "stores" / "valkey" / "resp.py"


def test_no_raw_socket_reads_and_no_http_framing_of_our_own():
    assert b"HTTP/" not in RESP.read_bytes() and "http" not in RESP.read_text().split('"""', 2)[2].lower()
    for path in _sources():
        if path == RESP:
            continue
        text = path.read_text()
        assert not RAW_READ.search(text), f"{path.name} reads a socket itself"
        assert _framing_literals(text) == [], f"{path.name} frames HTTP itself"
    assert "import http.client" in (CLIENT / "connection.py").read_text()


def test_the_framing_check_finds_the_old_reader():
    assert _framing_literals('if line in (b"\\r\\n", b"\\n"):\n    pass\n')
