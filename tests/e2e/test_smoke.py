"""The layer on every Python found: the wrapper swaps the handler, a repeat replays, results survive storage."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import INTERCEPTOR, Environments, Executions, get_record, marker, record_id


def test_wrapper_swaps_handler_and_leaves_pythonpath(python_version: str, environments: Environments,
                                                     shared_table: str) -> None:
    env = environments.shared(python_version, shared_table)
    answer = env.invoke({"marker": marker(), "action": "info"})
    assert answer.status == 200, answer.body
    info = answer.json()
    assert info["python"] == python_version
    assert info["handler"] == INTERCEPTOR
    assert info["original_handler"] == "app.handler"
    assert info["pythonpath"] is None  # the wrapper contract: no PYTHONPATH changes


def test_same_event_twice_runs_once(python_version: str, environments: Environments, shared_table: str,
                                    executions: Executions, ddb_client: Any) -> None:
    env = environments.shared(python_version, shared_table)
    event = {"marker": marker(), "action": "random"}
    first, second = env.invoke(event), env.invoke(event)
    assert first.status == second.status == 200
    assert first.error_type is None, first.body
    assert second.body == first.body  # byte for byte: the random id and the timestamp are replayed
    assert executions.count(event["marker"]) == 1
    record = get_record(ddb_client, shared_table, record_id(event))
    assert record is not None and record["status"] == {"S": "COMPLETED"}


@pytest.mark.parametrize("kind", ["none", "empty_dict", "empty_list", "zero", "empty_str", "false", "decimal",
                                  "bytes", "unicode", "non_finite", "huge_int", "deep", "enum_keys",
                                  "bytes_keys", "asdict_object", "nan_top"])
def test_result_replays_identically(python_version: str, environments: Environments, shared_table: str,
                                    executions: Executions, kind: str) -> None:
    env = environments.shared(python_version, shared_table)
    event = {"marker": marker(), "action": "result", "result": kind}
    first, second = env.invoke(event), env.invoke(event)
    assert first.error_type is None, first.body
    assert (second.status, second.body) == (first.status, first.body)
    assert executions.count(event["marker"]) == 1
    if kind == "bytes":
        assert first.body == b"\x00\xff\xfe raw bytes \x80\n"
    elif kind == "non_finite":  # the runtime writes NaN and the infinities as bare words; so must the replay
        assert second.body == b'{"nan": NaN, "inf": Infinity, "-inf": -Infinity, "none": null}'
    elif kind == "huge_int":
        assert json.loads(second.body) == {"n": 2**70 + 1, "neg": -(2**65)}
    elif kind == "decimal":  # the runtime writes Decimals as exact JSON numbers; so must the replay
        assert b"12345678901234567890.000000001" in second.body
        assert json.loads(second.body)["price"] == 19.99
    elif kind == "deep":  # the runtime sends 600 levels fine; the replay must too
        assert second.body.count(b"[") == 300 and second.body.count(b'{"d": ') == 300
    elif kind in ("enum_keys", "bytes_keys", "asdict_object", "nan_top"):
        assert second.body == {"enum_keys": b'{"red": "blue", "plain": ["red"]}', "bytes_keys": b'{"k": 1}',
                               "asdict_object": b'{"row": {"a": 1, "b": [{"x": 1, "y": 2}]}}',
                               "nan_top": b"NaN"}[kind]
    else:
        expected = {"none": None, "empty_dict": {}, "empty_list": [], "zero": 0, "empty_str": "", "false": False,
                    "unicode": {"text": "caf\u00e9 \u2603 \U0001f600"}}[kind]
        assert json.loads(second.body) == expected


def test_a_durable_executions_invocations_all_run(python_version: str, environments: Environments,
                                                  shared_table: str, executions: Executions, ddb_client: Any) -> None:
    # The envelope of a durable execution of this function (idempotency-e2e): every invocation runs, nothing is
    # stored, whatever the key settings (this environment keys whole events by `marker`).
    env = environments.shared(python_version, shared_table, {"IDEMPOTENCY_KEY_JMESPATH": "marker"})
    arn = ("arn:aws:lambda:us-east-1:123456789012:function:idempotency-e2e:$LATEST/durable-execution/"
           "order-42/4f1c2a9e")
    event = {"marker": marker(), "action": "random", "DurableExecutionArn": arn,
             "InitialExecutionState": {"Operations": []}}
    answers = [env.invoke({**event, "CheckpointToken": token}) for token in ("t-1", "t-2", "t-2")]
    assert [answer.status for answer in answers] == [200] * 3 and answers[0].error_type is None, answers[0].body
    assert len({answer.body for answer in answers}) == 3  # each ran: a fresh random id each time
    assert executions.count(event["marker"]) == 3
    assert get_record(ddb_client, shared_table, record_id(event["marker"])) is None  # the key it would have had
