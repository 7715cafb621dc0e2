"""The bench's batch rows without DynamoDB: the Kafka batches it builds, its exactly-once check, and the report's
request-count targets for the Kafka rows (bench/worker.py, bench/report.py)."""

from __future__ import annotations

import base64
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench modules import each other by name

import bench_handler
import inprocess
import report
import worker
from common import KAFKA_PARTITIONS, SQS_BATCH

from idempotency_layer.sources import kafka


def _command(kind: str, delivery: str, ns: str, start: int = 0, n: int = 1) -> dict[str, Any]:
    return {"op": "run", "ns": ns, "size": "small", "keyed": True, "start": start, "n": n, "batch": kind,
            "delivery": delivery}


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=6))
def test_kafka_batches_are_msk_batches_over_two_partitions_and_come_back_the_same(indices: set[int]) -> None:
    ns = f"t{uuid.uuid4().hex[:8]}"
    seen: set[str] = set()
    for index in indices:
        records = worker._records(_command("kafka", "new", ns), index)
        event, orders = worker._deliver("kafka", records)
        assert event["eventSource"] == "aws:kafka" and sorted(event["records"]) == [f"orders-{ns}-0", f"orders-{ns}-1"]
        for found in event["records"].values():
            offsets = [r["offset"] for r in found]
            assert len(found) == SQS_BATCH // KAFKA_PARTITIONS
            assert offsets == list(range(offsets[0], offsets[0] + len(found)))  # consecutive within a partition
        batch = kafka.parse(event)  # what the layer reads: one identity a record, none shared across batches
        assert len(set(batch.identifiers)) == SQS_BATCH and seen.isdisjoint(batch.identifiers)
        seen.update(batch.identifiers)
        assert len(set(orders)) == SQS_BATCH
        assert worker._records(_command("kafka", "redelivery", ns), index) == records
    with pytest.raises(RuntimeError, match="delivered as new twice"):
        worker._records(_command("kafka", "new", ns), next(iter(indices)))


def _drop_last(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if "Records" in event:
        event["Records"] = event["Records"][:-1]
    else:
        last = [name for name, found in event["records"].items() if found][-1]
        event["records"][last] = event["records"][last][:-1]
    return bench_handler.consumer(event, context)


def _report_failure(event: dict[str, Any], context: Any) -> dict[str, Any]:
    bench_handler.consumer(event, context)
    return {"batchItemFailures": [{"itemIdentifier": "x"}]}


@pytest.mark.parametrize("kind", ["sqs", "kafka"])
def test_the_exactly_once_check_stops_the_bench_on_work_run_twice_lost_or_a_failure_reported(kind: str) -> None:
    ns = f"t{uuid.uuid4().hex[:8]}"
    new = worker.run_batch(bench_handler.consumer, _command(kind, "new", ns, n=2))
    assert "fatal" not in new and new["runs"] == 2 * SQS_BATCH and len(new["cpu"]) == 2
    # The consumer alone runs a redelivered batch again: its work ran twice.
    again = worker.run_batch(bench_handler.consumer, _command(kind, "redelivery", ns, n=1))
    assert f"{SQS_BATCH} records ran (expected 0)" in again["fatal"]
    lost = worker.run_batch(_drop_last, _command(kind, "new", ns, start=5))
    assert f"{SQS_BATCH - 1} records ran (expected {SQS_BATCH})" in lost["fatal"]
    failed = worker.run_batch(_report_failure, _command(kind, "new", ns, start=6))
    assert "expected no batchItemFailures" in failed["fatal"]


def test_the_consumer_processes_kafka_values() -> None:
    order = f"order-{uuid.uuid4().hex}"
    value = base64.b64encode(json.dumps({"orderId": order}).encode()).decode()
    answer = bench_handler.consumer({"records": {"t-0": [{"value": value}], "t-1": [{"value": value}]}}, None)
    assert answer == {"batchItemFailures": []} and bench_handler.EXECUTIONS[order] == 2


def _results(requests: dict[tuple[str, str], int]) -> dict[str, Any]:
    """Raw results for every path and system, each invocation `requests[(path, system)]` requests (default: the
    path's expected count), 1 ms of CPU and 2 ms of wall."""
    found: dict[str, dict[str, inprocess.Samples]] = {}
    for path in inprocess.PATHS:
        found[path.name] = {}
        for system in path.systems:
            row = next((r for r, (p, s) in report.VIEWS.items() if p == path.name and s == system), path.name)
            count = requests.get((path.name, system), report.EXPECTED_REQUESTS.get(row, 0))
            found[path.name][system] = inprocess.Samples(wall_ns=[2_000_000] * 4, cpu_ns=[1_000_000] * 4,
                                                         requests={"PutItem": 4 * count} if count else {})
    meta = {"date": "d", "cpu": "c", "cores": 2, "python": "3", "packages": {}, "iterations": 4, "warmup": 0,
            "sqs_batch": SQS_BATCH}
    return {"meta": meta, "inprocess": found}


def _verdicts(summary: dict[str, Any]) -> dict[str, str]:
    return {t["target"]: t["verdict"] for t in summary["targets"] if t["unit"] == "requests"}


def test_the_report_checks_each_kafka_rows_request_count() -> None:
    expected = {"kafka_new": 20, "kafka_dup": 10, "kafka_new_always": 21, "kafka_dup_always": 1}
    assert {k: report.EXPECTED_REQUESTS[k] for k in expected} == expected
    summary = report.summarise(_results({}))
    verdicts = _verdicts(summary)
    for row in expected:
        assert verdicts[f"requests per {report.PATH_LABELS[row]} = {expected[row]}"] == "PASS"
    # Each row is its layer system against the same Powertools figures, and no system is listed twice.
    assert summary["paths"]["kafka_dup_always"]["layer"] == "layer-kafka-always"
    assert set(summary["paths"]["kafka_dup"]["systems"]) == {"layer-kafka", "powertools-kafka"}
    table = report.render(summary).split("All systems")[1].split("Targets")[0]
    assert table.count("powertools-kafka") == 2 and table.count("layer-kafka-always") == 2
    # A redelivered batch under `always` that claimed each record misses its target.
    missed = _verdicts(report.summarise(_results({("kafka_dup", "layer-kafka-always"): 10})))
    assert missed[f"requests per {report.PATH_LABELS['kafka_dup_always']} = 1"] == "MISS"
    assert missed[f"requests per {report.PATH_LABELS['kafka_dup']} = 10"] == "PASS"
