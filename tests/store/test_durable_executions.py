"""IDEMPOTENCY_DURABLE=execution with AWS's durable execution SDK and its in-process runner
(`DurableFunctionTestRunner`) around the layer's assembled handler, on DynamoDB Local: a durable execution is one
unit of work, keyed by its input, owned by its ARN. The workflow (tests/e2e/apps/durable_orders.py) appends each
charge to a ledger file: the count of side effects. The same under the emulator with the built layer and the
runner's server: tests/e2e/test_durable_executions.py."""

from __future__ import annotations

import importlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_durable_execution_sdk_python_testing")  # Python 3.11+

from aws_durable_execution_sdk_python.execution import InvocationStatus
from aws_durable_execution_sdk_python_testing.runner import DurableFunctionTestRunner

from tests.support.durable import in_process, lambda_shaped_arns, sqs_input, unwrap

FUNCTION = "orders-workflow"
REGION = "us-east-1"
IN_PROGRESS = "The error type the layer answers a duplicate with"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    path.touch()
    monkeypatch.setenv("ORDERS_LEDGER", str(path))
    monkeypatch.setenv("ORDERS_WAIT_SECONDS", "1")
    return path


def charges(ledger: Path) -> list[str]:
    return [line.split()[0] for line in ledger.read_text().splitlines()]


@pytest.fixture
def layer(layer_env, table, monkeypatch, ledger):
    """`make(**settings)`: the layer's handler over the durable workflow, built from settings as at an init."""
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    base = {"IDEMPOTENCY_ORIGINAL_HANDLER": "durable_orders.handler", "IDEMPOTENCY_TABLE": table,
            "IDEMPOTENCY_DURABLE": "execution", "IDEMPOTENCY_IN_PROGRESS_SECONDS": "3600",
            "IDEMPOTENCY_KEY_JMESPATH": "Records[0].messageId"}
    for name, value in base.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "e2e" / "apps"))
    sys.modules.pop("idempotency_layer.interceptor", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")
    from idempotency_layer import config
    from tests.e2e.apps import durable_orders

    def make(**settings: str | None) -> Any:
        for name, value in {**base, **settings}.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        return in_process(interceptor.build(config.load(), unwrap(durable_orders.handler)))

    with lambda_shaped_arns(REGION):
        yield make
    sys.modules.pop("idempotency_layer.interceptor", None)


def start(runner: DurableFunctionTestRunner, order: str) -> str:
    return runner.run_async(input=sqs_input(order), execution_timeout=60, function_name=FUNCTION,
                            execution_name=f"run-{uuid.uuid4().hex[:12]}")


def finish(runner: DurableFunctionTestRunner, arn: str) -> Any:
    return runner.wait_for_result(execution_arn=arn, timeout=60)


def items(ddb_client: Any, table: str) -> list[dict[str, Any]]:
    return ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]


def test_two_executions_of_one_message_charge_once_and_both_succeed_with_its_result(layer, ledger, ddb_client,
                                                                                    table):
    handler = layer()
    with DurableFunctionTestRunner(handler=handler) as runner:
        first = finish(runner, start(runner, "order-1"))
        second = finish(runner, start(runner, "order-1"))
    assert first.status is InvocationStatus.SUCCEEDED and second.status is InvocationStatus.SUCCEEDED
    assert json.loads(first.result) == {"receipt": "charged order-1"}
    assert second.result == first.result  # the stored text, as the first execution ended with it
    assert charges(ledger) == ["order-1"]
    assert second.operations == [] or all(op.operation_type.value == "EXECUTION" for op in second.operations)
    (record,) = items(ddb_client, table)
    assert record["status"]["S"] == "COMPLETED"
    assert record["owner"]["S"].startswith(f"arn:aws:lambda:{REGION}:123456789012:function:{FUNCTION}:$LATEST/"
                                           "durable-execution/")


def test_the_owner_execution_is_invoked_again_after_its_wait_and_is_never_refused(layer, ledger, ddb_client, table,
                                                                                 caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="idempotency_layer"):
        handler = layer()  # (built with INFO on: each invocation's line is written)
        with DurableFunctionTestRunner(handler=handler, skip_time=False) as runner:
            result = finish(runner, start(runner, "order-2"))
    assert result.status is InvocationStatus.SUCCEEDED
    assert charges(ledger) == ["order-2"]
    outcomes = [r.idempotency_outcome for r in caplog.records if hasattr(r, "idempotency_outcome")]
    # the first invocation claims and suspends in the wait; the service invokes the execution again to finish it
    assert outcomes[0] == "execution_claimed" and outcomes[-1] == "execution_completed", outcomes


def test_a_duplicate_started_during_the_wait_fails_as_in_progress_then_one_started_after_replays(
        layer, ledger, ddb_client, table, monkeypatch):
    monkeypatch.setenv("ORDERS_WAIT_SECONDS", "3")
    handler = layer()
    with DurableFunctionTestRunner(handler=handler, skip_time=False) as runner:
        first = start(runner, "order-3")
        deadline = time.monotonic() + 30
        while charges(ledger) != ["order-3"]:  # the first is past its charge, suspended in its wait
            assert time.monotonic() < deadline, "the first execution never charged"
            time.sleep(0.05)
        refused = finish(runner, start(runner, "order-3"))
        done = finish(runner, first)
        later = finish(runner, start(runner, "order-3"))
    assert refused.status is InvocationStatus.FAILED
    assert refused.error.type == "idempotency_layer.errors.IdempotencyAlreadyInProgressError"
    assert "order-3" not in (refused.error.message or "")  # no input content in the error
    assert done.status is InvocationStatus.SUCCEEDED and later.status is InvocationStatus.SUCCEEDED
    assert later.result == done.result
    assert charges(ledger) == ["order-3"]


def test_a_failed_execution_releases_so_the_next_delivery_runs_again(layer, ledger, ddb_client, table):
    handler = layer()
    with DurableFunctionTestRunner(handler=handler) as runner:
        failed = finish(runner, start(runner, "declined-4"))
        assert items(ddb_client, table) == []
        again = finish(runner, start(runner, "declined-4"))
    assert failed.status is InvocationStatus.FAILED and failed.error.type == "ValueError"
    assert again.status is InvocationStatus.FAILED
    assert charges(ledger) == ["declined-4", "declined-4"]  # released each time: each delivery runs


def test_show_and_key_of_an_envelope_name_the_owner_execution(layer, ledger, ddb_client, table, layer_env,
                                                             tmp_path):
    import os
    import subprocess

    from tests.conftest import CREDENTIALS

    handler = layer()
    with DurableFunctionTestRunner(handler=handler) as runner:
        done = finish(runner, start(runner, "order-5"))
    assert done.status is InvocationStatus.SUCCEEDED
    (record,) = items(ddb_client, table)
    owner = record["owner"]["S"]

    def envelope_file(arn: str) -> str:
        operation = {"Id": arn.rsplit("/", 1)[-1], "Type": "EXECUTION", "Status": "STARTED",
                     "ExecutionDetails": {"InputPayload": sqs_input("order-5")}}
        path = tmp_path / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps({"DurableExecutionArn": arn, "CheckpointToken": "t",
                                    "InitialExecutionState": {"Operations": [operation]}}))
        return str(path)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDEMPOTENCY_", "AWS_"))}
    env.update(CREDENTIALS, AWS_ENDPOINT_URL_DYNAMODB=layer_env.endpoint, IDEMPOTENCY_TABLE=table,
               AWS_LAMBDA_FUNCTION_NAME=FUNCTION, AWS_REGION=REGION, IDEMPOTENCY_DURABLE="execution",
               IDEMPOTENCY_IN_PROGRESS_SECONDS="3600", IDEMPOTENCY_KEY_JMESPATH="Records[0].messageId",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "layer"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "idempotency_layer", *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    mine = cli("show", "--event", envelope_file(owner))
    assert mine.returncode == 0, mine.stderr
    assert f"owner:             {owner}" in mine.stdout and "this execution:    owns the key" in mine.stdout
    other = cli("show", "--event", envelope_file(owner.rsplit("/", 2)[0] + "/another-run/9e9e"))
    assert other.returncode == 0 and "does not own the key" in other.stdout
    keyed = cli("key", "--event", envelope_file(owner))
    assert keyed.returncode == 0 and f"execution: {owner}" in keyed.stdout
    assert keyed.stdout.strip().splitlines()[-1] == record["id"]["S"]


@pytest.mark.parametrize("kind", ["redis7", "valkey9"])
def test_on_the_valkey_store_two_executions_of_one_message_charge_once(layer, ledger, valkey_servers, kind):
    server = valkey_servers[kind]
    server.command("FLUSHALL")
    handler = layer(IDEMPOTENCY_TABLE=None, IDEMPOTENCY_STORE="valkey", IDEMPOTENCY_VALKEY_URL=server.url)
    with DurableFunctionTestRunner(handler=handler) as runner:
        first = finish(runner, start(runner, "order-7"))
        second = finish(runner, start(runner, "order-7"))
    assert first.status is InvocationStatus.SUCCEEDED and second.status is InvocationStatus.SUCCEEDED
    assert second.result == first.result and json.loads(first.result) == {"receipt": "charged order-7"}
    assert charges(ledger) == ["order-7"]
