"""./build.sh demo's script runs clean on the built layer: it is the README's walkthrough, so it must work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.rie import ensure_layer

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_every_order_message_request_and_kafka_order_once() -> None:
    ensure_layer()
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "placed 1 time(s); call 2 replayed call 1" in out
    assert "failures reported: S-2, S-4; shipped so far 3" in out
    assert "the whole batch again: 5 message(s) in, failures reported: none; shipped so far 5" in out
    assert "shipments per order: S-1=1, S-2=1, S-3=1, S-4=1, S-5=1" in out
    assert "POST key-1 again (the client's retry): 201" in out and "idempotent-replayed: true" in out
    assert "POST key-2 while its first request runs: 409 Conflict; retry-after: 1" in out
    assert "POST key-1 with another order: 422" in out and "3 order(s) placed for 3 keys" in out
    assert "batch from orders-0 and orders-1: 5 record(s) in, partitions stopped: orders-0@16, orders-1@8" in out
    assert "every record again: 6 record(s) in, partitions stopped: none; charged so far 5" in out
    assert "charges per order: K-1=1, K-2=1, K-3=1, K-4=1, K-5=1" in out
    ok = ("demo: OK: every order placed once, every message shipped once, every request run once, every Kafka "
          "order charged once")
    assert out.rstrip().endswith(ok)
