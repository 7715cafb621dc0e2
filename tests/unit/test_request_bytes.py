"""Every byte the DynamoDB client writes, against what it wrote before issue 34's savings (tests/data/
request_bytes.json, written by that code with tests/support/request_bytes.py): the signer's plans, the cached
X-Amz-Date and the connection's changes must leave each request, with and without a session token, as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_writes_the_same_bytes_as_before_the_savings() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.support.request_bytes"], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "layer"), str(ROOT)])})
    written = json.loads(done.stdout)
    expected = json.loads((ROOT / "tests" / "data" / "request_bytes.json").read_text())
    assert [len(requests) for requests in written.values()] == [6, 6]
    for case, requests in expected.items():
        for number, request in enumerate(requests):
            assert written[case][number] == request, (case, number)
