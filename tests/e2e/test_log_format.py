"""AWS_LAMBDA_LOG_FORMAT=JSON: the layer's own records reach the log as one JSON object a line, like the runtime's."""

from __future__ import annotations

import json
from typing import Any

from tests.e2e.conftest import Executions, marker, scan_count

WARNING = "selected nothing from the event"


def test_missing_key_warning_is_one_json_object_a_line(primary: str, make_env: Any, table: str,
                                                       executions: Executions, ddb_client: Any) -> None:
    env = make_env(primary, table, {"AWS_LAMBDA_LOG_FORMAT": "JSON", "IDEMPOTENCY_KEY_JMESPATH": "orderId"})
    event = {"marker": marker(), "action": "random"}  # no orderId: runs without idempotency, with a warning
    for _ in range(2):
        answer = env.invoke(event)
        assert answer.error_type is None, answer.body
    assert executions.count(event["marker"]) == 2
    assert scan_count(ddb_client, table) == 0

    # Every line carrying the warning must parse on its own: a plain-text or multi-line record would not.
    lines = [line for line in env.logs().splitlines() if WARNING in line]
    entries = [json.loads(line) for line in lines]
    assert len(entries) == 2, env.logs()[-3000:]
    for entry in entries:
        assert entry["level"] == "WARNING"
        assert entry["logger"] == "idempotency_layer"
        assert WARNING in entry["message"] and "'orderId'" in entry["message"]
        assert entry["requestId"]  # the runtime's formatter: the record went through its handler
    assert entries[0]["requestId"] != entries[1]["requestId"]


def test_botocore_debug_lines_of_the_layers_calls_never_reach_the_log(primary: str, make_env: Any, table: str,
                                                                       executions: Executions) -> None:
    """Issue 28: with AWS_LAMBDA_LOG_LEVEL=DEBUG and IDEMPOTENCY_TRANSPORT=boto3, botocore's own DEBUG lines put
    the stored result (the completion's request body, a replay's answer) in the function's log. The function's
    own boto3 calls keep theirs."""
    env = make_env(primary, table, {"AWS_LAMBDA_LOG_LEVEL": "DEBUG", "IDEMPOTENCY_TRANSPORT": "boto3",
                                    "IDEMPOTENCY_KEY_JMESPATH": "marker"})
    mark = marker()
    card = f"card-4111-{mark[:12]}"
    event = {"marker": mark, "action": "own_call", "card": card}
    first = env.invoke(event)
    assert first.error_type is None, first.body
    assert env.invoke(event).body == first.body  # a replay: the record, result and all, came back from the table
    assert executions.count(mark) == 1
    logs = env.logs()
    assert "botocore" in logs and f"own-call-{mark}" in logs  # DEBUG was on, and the function's call logged
    assert card not in logs
