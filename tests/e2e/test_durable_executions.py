"""IDEMPOTENCY_DURABLE=execution end to end: AWS's durable execution local runner (`dex-local-runner
start-server`, the durable service's stand-in) invokes a function written with AWS's durable execution SDK through
the Runtime Interface Emulator, with the built layer as its exec wrapper, on DynamoDB Local; the SDK's checkpoints
reach the runner through AWS_ENDPOINT_URL_LAMBDA. Executions get Lambda-shaped ARNs from the runner
(tests/support/durable.py). Each charge the workflow makes is a line in a ledger file: the count of side effects."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_durable_execution_sdk_python")  # Python 3.11+, as the runner

from tests.support.durable import LocalRunner, function_package, sqs_input
from tests.support.dynamodb_local import create_table

FUNCTION = "function"  # the one name the emulator serves invocations under


@pytest.fixture(scope="module")
def durable_task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The function's package as a user deploys it: the workflow and AWS's durable execution SDK beside it."""
    return function_package(tmp_path_factory.mktemp("durable-task"))


@contextmanager
def durable_function(environments: Any, ddb_client: Any, task_root: Path, tmp_path: Path, version: str
                     ) -> Iterator[tuple[LocalRunner, Path, str, Any]]:
    """(the runner, the ledger, the table, the environment): an emulated function on `version` with the layer under
    IDEMPOTENCY_DURABLE=execution and the runner invoking it; everything stopped when the block ends."""
    if tuple(map(int, version.split("."))) < (3, 11):
        pytest.skip("AWS's durable execution SDK needs Python 3.11+")
    table = create_table(ddb_client, f"idempotency-durable-{uuid.uuid4().hex[:8]}")
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    runner = LocalRunner(tmp_path / "runner.log")
    settings = {"IDEMPOTENCY_DURABLE": "execution", "IDEMPOTENCY_IN_PROGRESS_SECONDS": "3600",
                "IDEMPOTENCY_KEY_JMESPATH": "Records[0].messageId", "IDEMPOTENCY_LOG_LEVEL": "INFO",
                "ORDERS_LEDGER": str(ledger), "ORDERS_WAIT_SECONDS": "4",
                "AWS_ENDPOINT_URL_LAMBDA": runner.endpoint}  # where the SDK sends its checkpoints
    env = environments.new(version, table, settings, handler="durable_orders.handler", task_root=task_root,
                           function_name=FUNCTION)
    try:
        runner.start(f"http://127.0.0.1:{env.port}")
        yield runner, ledger, table, env
    finally:
        runner.stop()
        env.stop()
        ddb_client.delete_table(TableName=table)


@pytest.fixture
def durable(environments, ddb_client, durable_task_root, tmp_path, primary):
    with durable_function(environments, ddb_client, durable_task_root, tmp_path, primary) as made:
        yield made


def test_every_python_the_sdk_runs_on_charges_one_message_once(environments, ddb_client, durable_task_root,
                                                                tmp_path, python_version):
    with durable_function(environments, ddb_client, durable_task_root, tmp_path, python_version) as made:
        runner, ledger, _, _ = made
        message = sqs_input("order-py")
        first = runner.wait(runner.start_execution(FUNCTION, message))
        second = runner.wait(runner.start_execution(FUNCTION, message))
    assert first["Status"] == second["Status"] == "SUCCEEDED" and second["Result"] == first["Result"]
    assert charges(ledger) == ["order-py"]


def charges(ledger: Path) -> list[str]:
    return [line.split()[0] for line in ledger.read_text().splitlines()]


def items(ddb_client: Any, table: str) -> list[dict[str, Any]]:
    return ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]


def test_two_deliveries_of_one_message_run_the_workflow_once_and_both_succeed(durable, ddb_client):
    runner, ledger, table, _ = durable
    message = sqs_input("order-1")
    first = runner.wait(runner.start_execution(FUNCTION, message))
    second = runner.wait(runner.start_execution(FUNCTION, message))
    assert first["Status"] == "SUCCEEDED", first
    assert second["Status"] == "SUCCEEDED", second
    assert json.loads(first["Result"]) == {"receipt": "charged order-1"}
    assert second["Result"] == first["Result"]
    assert charges(ledger) == ["order-1"]
    (record,) = items(ddb_client, table)
    assert record["status"]["S"] == "COMPLETED"
    assert record["owner"]["S"] == first["DurableExecutionArn"]


def test_a_duplicate_during_the_wait_is_refused_and_one_after_the_end_replays(durable):
    runner, ledger, _, env = durable
    message = sqs_input("order-2")
    first = runner.start_execution(FUNCTION, message)
    # The first has charged and its invocation has ended, suspended in its wait (the emulator serves one
    # invocation at a time, as one execution environment does).
    deadline = time.monotonic() + 30
    while charges(ledger) != ["order-2"] or "INVOKE RTDONE" not in env.logs():
        assert time.monotonic() < deadline, runner.logs()[-3000:]
        time.sleep(0.05)
    refused = runner.wait(runner.start_execution(FUNCTION, message))
    done = runner.wait(first)
    later = runner.wait(runner.start_execution(FUNCTION, message))
    assert refused["Status"] == "FAILED", refused
    assert refused["Error"]["ErrorType"] == "idempotency_layer.errors.IdempotencyAlreadyInProgressError"
    assert done["Status"] == "SUCCEEDED" and later["Status"] == "SUCCEEDED"
    assert later["Result"] == done["Result"]
    assert charges(ledger) == ["order-2"]


def test_a_failed_execution_releases_its_key(durable, ddb_client):
    runner, ledger, table, _ = durable
    message = sqs_input("declined-3")
    failed = runner.wait(runner.start_execution(FUNCTION, message))
    assert failed["Status"] == "FAILED" and failed["Error"]["ErrorType"] == "ValueError", failed
    assert items(ddb_client, table) == []
    again = runner.wait(runner.start_execution(FUNCTION, message))
    assert again["Status"] == "FAILED"
    assert charges(ledger) == ["declined-3", "declined-3"]
