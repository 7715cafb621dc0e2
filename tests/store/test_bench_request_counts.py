"""The bench's batch rows on DynamoDB Local: each layer worker, fed new and then redelivered batches exactly as the
bench feeds them, sends the requests report.EXPECTED_REQUESTS states for its row, and every record's work runs
exactly once (the worker stops with `fatal` otherwise, which Worker.run raises)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench modules import each other by name

import inprocess
import report
from common import SQS_BATCH

from tests.support.dynamodb_local import create_table

BATCHES = 2


def _row(path: str, system: str) -> str:
    """The report row whose expected count applies to `system` on measured path `path`."""
    return next((row for row, (p, s) in report.VIEWS.items() if (p, s) == (path, system)), path)


@pytest.mark.parametrize("system", ["layer-sqs", "layer-kafka", "layer-kafka-always"])
def test_a_layer_workers_batches_cost_the_expected_requests(system, ddb_client, proxy, tmp_path):
    table = create_table(ddb_client, f"bench-counts-{system}")
    paths = [p for p in inprocess.PATHS if system in p.systems]
    assert [p.delivery for p in paths] == ["new", "redelivery"]
    with open(tmp_path / "worker.log", "ab") as log:
        worker = inprocess.Worker(system, table, proxy.endpoint, log)
        try:
            for path in paths:
                proxy.reset()
                answer = worker.run(path, 0, BATCHES)
                requests, _ = proxy.snapshot()
                expected = report.EXPECTED_REQUESTS[_row(path.name, system)]
                assert sum(requests.values()) == BATCHES * expected, (path.name, requests)
                assert answer["runs"] == (BATCHES * SQS_BATCH if path.delivery == "new" else 0)
        finally:
            worker.close()
    ddb_client.delete_table(TableName=table)
