"""The test infrastructure itself: DynamoDB Local answers, and RIE + bootstrap + awslambdaric run a handler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Executions, marker


def test_dynamodb_local_answers(ddb_client: Any, table: str) -> None:
    ddb_client.put_item(TableName=table, Item={"id": {"S": "k"}, "value": {"S": "round-trip"}})
    item = ddb_client.get_item(TableName=table, Key={"id": {"S": "k"}}, ConsistentRead=True)["Item"]
    assert item["value"] == {"S": "round-trip"}
    ttl = ddb_client.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at"


def test_bare_handler_runs(python_version: str, make_env: Any, shared_table: str, task_root: Path,
                           executions: Executions) -> None:
    """RIE + our bootstrap + awslambdaric run a plain handler (no layer) on this Python."""
    env = make_env(python_version, shared_table, wrapper=False)
    mark = marker()
    status, body, _ = env.invoke({"marker": mark, "action": "info"})
    assert status == 200, body
    info = json.loads(body)
    assert info["python"] == python_version == env.python_version
    assert info["handler"] == "app.handler"
    assert info["original_handler"] is None
    assert info["pythonpath"] is None
    assert info["cwd"] == str(task_root)
    assert info["sys_path"][0] == str(task_root)
    assert info["sys_path"][1].endswith(f"/python/lib/python{python_version}/site-packages")
    assert 0 < info["remaining_ms"] <= 30_000
    assert info["function_name"] == "idempotency-e2e"
    # No layer: the same event runs again.
    assert env.invoke({"marker": mark, "action": "info"}).status == 200
    assert executions.count(mark) == 2
    assert "START RequestId" in env.logs()
