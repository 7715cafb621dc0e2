"""Metrics and the key in the logs under the real runtime: the built layer under RIE + awslambdaric, its stdout
and stderr as the runtime writes them. Every EMF document found is checked against the specification's rules
(tests/support/emf.py); counts are checked against the apps' own executions file and the table's records."""

from __future__ import annotations

import json
import re
import threading
import uuid
from pathlib import Path
from typing import Any

from tests.e2e.conftest import FUNCTION, Executions, marker, record_id
from tests.support import emf
from tests.support.dynamodb_local import wait_for
from tests.support.events import json_message, sqs_event
from tests.support.http_events import v2

COUNTED = ("FirstExecutions", "Replays", "LocalCacheReplays", "InProgressConflicts", "PayloadMismatches",
           "PassThroughs", "Releases", "ResultsTooLarge", "StoreErrors")
OBSERVED = {"AWS_LAMBDA_LOG_FORMAT": "JSON", "AWS_LAMBDA_LOG_LEVEL": "INFO", "IDEMPOTENCY_METRICS": "emf"}


def counts(doc: dict[str, Any]) -> dict[str, int]:
    return {name: doc[name] for name in COUNTED if name in doc}


def json_lines(text: str) -> list[dict[str, Any]]:
    """The runtime's JSON log lines (not the EMF documents)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{") and '"_aws"' not in line:
            found.append(json.loads(line))
    return found


def summaries(text: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(text) if str(line.get("message", "")).startswith("idempotency: ")]


def stored_keys(ddb_client: Any, table: str) -> set[str]:
    return {item["id"]["S"] for item in ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]}


def test_whole_events_documents_and_json_lines(primary: str, make_env: Any, table: str, executions: Executions,
                                               ddb_client: Any) -> None:
    env = make_env(primary, table, OBSERVED)
    ran = {"marker": marker(), "action": "random"}
    failed = {"marker": marker(), "action": "raise"}
    first, again = env.invoke(ran), env.invoke(ran)
    assert first.error_type is None and again.body == first.body
    assert env.invoke(failed).error_type == "ValueError"
    assert executions.count(ran["marker"]) == 1 and executions.count(failed["marker"]) == 1
    assert stored_keys(ddb_client, table) == {record_id(ran)}  # the failed run was released

    logs = env.logs()
    docs = emf.documents(logs)
    assert [counts(doc) for doc in docs] == [{"FirstExecutions": 1}, {"Replays": 1},
                                             {"FirstExecutions": 1, "Releases": 1}]
    assert all((doc["FunctionName"], doc["Source"]) == (FUNCTION, "event") for doc in docs)
    assert [doc["idempotency_key"] for doc in docs] == [record_id(ran), record_id(ran), record_id(failed)]

    said = summaries(logs)
    assert [(line["idempotency_outcome"], line["idempotency_key"]) for line in said] == [
        ("first_run", record_id(ran)), ("replay", record_id(ran)), ("released", record_id(failed))]
    assert all(line["level"] == "INFO" and line["logger"] == "idempotency_layer" for line in said)
    assert len({line["requestId"] for line in said}) == 3  # through the runtime's handler: its request ids
    assert [doc["requestId"] for doc in docs] == [line["requestId"] for line in said]
    assert said[2]["message"].endswith("raised ValueError")
    print("EMF document:", json.dumps(docs[0]))  # for the docs: real output (pytest -s)
    print("INFO line:", json.dumps(said[0]))


def test_a_batch_document_and_line(primary: str, make_env: Any, table: str, executions: Executions) -> None:
    env = make_env(primary, table, OBSERVED, handler="consumer.handler")
    messages = [json_message({"marker": marker()}) for _ in range(3)]
    for _ in range(2):  # delivered, then redelivered
        answer = env.invoke(sqs_event(messages))
        assert answer.error_type is None, answer.body
    assert [executions.count(json.loads(m.body)["marker"]) for m in messages] == [1, 1, 1]
    logs = env.logs()
    docs = emf.documents(logs)
    assert [(doc["Source"], doc["Records"], counts(doc)) for doc in docs] == [
        ("batch", 3, {"FirstExecutions": 3}), ("batch", 3, {"Replays": 3})]
    said = summaries(logs)
    assert [line["idempotency_counts"] for line in said] == [{"FirstExecutions": 3}, {"Replays": 3}]
    assert said[0]["message"].startswith("idempotency: batch of 3 record(s): 3 first run(s);")
    print("batch EMF document:", json.dumps(docs[0]))
    print("batch INFO line:", json.dumps(said[0]))


def test_a_batch_record_in_progress_elsewhere_carries_its_own_key(
        primary: str, make_env: Any, table: str, executions: Executions, ddb_client: Any, tmp_path: Path) -> None:
    holder = make_env(primary, table, OBSERVED, handler="consumer.handler")
    other = make_env(primary, table, OBSERVED, handler="consumer.handler")
    release = tmp_path / "release"
    free, busy = json_message({"marker": marker()}), json_message({"marker": marker(), "release": str(release)})
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(holder.invoke(sqs_event([busy]))), daemon=True)
    thread.start()
    try:
        wait_for(lambda: record_id(busy.message_id) in stored_keys(ddb_client, table), 30, "the holder's claim")
        answer = other.invoke(sqs_event([free, busy]))
    finally:
        release.touch()
        thread.join(60)
    assert answer.json() == {"batchItemFailures": [{"itemIdentifier": busy.message_id}]}
    assert [executions.count(json.loads(m.body)["marker"]) for m in (free, busy)] == [1, 1]
    logs = other.logs()
    lines = json_lines(logs)
    conflict = [line for line in lines if "its record is reported as failed" in str(line.get("message"))]
    assert [(line["level"], line["idempotency_key"], line["idempotency_outcome"]) for line in conflict] == [
        ("INFO", record_id(busy.message_id), "in_progress")]
    (doc,) = emf.documents(logs)
    assert counts(doc) == {"FirstExecutions": 1, "InProgressConflicts": 1}
    (said,) = summaries(logs)
    assert said["idempotency_counts"] == {"FirstExecutions": 1, "InProgressConflicts": 1}
    assert said["requestId"] == conflict[0]["requestId"] == doc["requestId"]
    (held,) = emf.documents(holder.logs())
    assert counts(held) == {"FirstExecutions": 1}


def test_an_http_request_and_its_replay(primary: str, make_env: Any, table: str, executions: Executions,
                                        ddb_client: Any) -> None:
    env = make_env(primary, table, OBSERVED, handler="web.handler")
    mark = marker()
    request = v2("POST", "/orders", {"Idempotency-Key": uuid.uuid4().hex}, json.dumps({"marker": mark}))
    first, again = env.invoke(request), env.invoke(request)
    assert first.json()["statusCode"] == again.json()["statusCode"] == 201
    assert executions.count(mark) == 1
    (key,) = stored_keys(ddb_client, table)
    logs = env.logs()
    docs = emf.documents(logs)
    assert [(doc["Source"], counts(doc), doc["idempotency_key"]) for doc in docs] == [
        ("http", {"FirstExecutions": 1}, key), ("http", {"Replays": 1}, key)]
    said = summaries(logs)
    assert [(line["idempotency_outcome"], line["idempotency_key"]) for line in said] == [
        ("first_run", key), ("replay", key)]


def test_text_format_says_the_same_in_one_line_and_off_writes_no_document(
        primary: str, make_env: Any, table: str, executions: Executions) -> None:
    env = make_env(primary, table, {"IDEMPOTENCY_LOG_LEVEL": "INFO"})
    event = {"marker": marker(), "action": "random"}
    env.invoke(event)
    env.invoke(event)
    assert executions.count(event["marker"]) == 1
    logs = env.logs()
    assert emf.documents(logs) == []
    lines = [line for line in logs.splitlines() if "idempotency: event key" in line]
    key = record_id(event)
    assert len(lines) == 2, logs[-3000:]
    # The runtime's text format: level, time, request id, then the layer's message.
    assert re.fullmatch(rf"\[INFO\]\t\S+Z\t[0-9a-f-]{{36}}\tidempotency: event key {key}: first run: the handler "
                        r"ran and its result was stored; store \d+\.\d ms in 2 request\(s\)", lines[0]), lines[0]
    assert f"key {key}: replay of the stored result: the handler did not run" in lines[1]
    print("text line:", lines[0])
