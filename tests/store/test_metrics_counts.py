"""IDEMPOTENCY_METRICS=emf against DynamoDB Local: one document per invocation on stdout, every line checked
against the EMF specification's rules (tests/support/emf.py), and its counts against what the test did, counted
by the handler's own side effect (its runs) and the table's records, never by the layer's word."""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.cycle import Claimed
from idempotency_layer.errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyPayloadMismatchError,
    IdempotencyPersistenceLayerError,
    IdempotencyResultTooLargeError,
)
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from tests.support import emf
from tests.support.events import json_message, sqs_event
from tests.support.fault_proxy import INTERNAL, THROTTLE, FaultProxy
from tests.support.http_events import v2
from tests.support.inprocess import Context, Function

FUNCTION = "shop"
# Each example is a few invocations against DynamoDB Local: half the suite's usual count, a longer run a variable away
EXAMPLES = max(10, int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60")) // 2)
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
COUNTED = ("FirstExecutions", "Replays", "LocalCacheReplays", "InProgressConflicts", "Waits", "WaitsReplayed",
           "WaitsClaimed", "WaitsTimedOut", "PayloadMismatches", "PassThroughs", "Releases", "ReleaseFailures",
           "CompletionRetries", "CompletionFailures", "ResultsTooLarge", "StoreErrors")


@pytest.fixture
def build(tmp_path, monkeypatch, layer_env, proxy, table):
    """Functions built from settings (IDEMPOTENCY_METRICS=emf, keyed by orderId unless told otherwise)."""
    monkeypatch.delitem(sys.modules, "awslambdaric.lambda_runtime_marshaller", raising=False)
    (tmp_path / "shop_app.py").write_text("def handler(event, context):\n    return event\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    base = {"IDEMPOTENCY_ORIGINAL_HANDLER": "shop_app.handler", "IDEMPOTENCY_TABLE": table,
            "IDEMPOTENCY_KEY_JMESPATH": "orderId", "IDEMPOTENCY_METRICS": "emf"}
    for name, value in base.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("idempotency_layer.interceptor", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")

    def make(**settings: str) -> Function:
        for name in ("IDEMPOTENCY_KEY_JMESPATH", "IDEMPOTENCY_PAYLOAD_JMESPATH", "IDEMPOTENCY_LOCAL_CACHE_SIZE",
                     "IDEMPOTENCY_WAIT_SECONDS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in {**base, **settings}.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        return Function(interceptor)

    yield make
    sys.modules.pop("idempotency_layer.interceptor", None)


def documents(capsys: Any, expected: int) -> list[dict[str, Any]]:
    """The documents written since the last call: every stdout line must be one, valid, of this function."""
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    docs = [emf.check(line) for line in lines]
    assert len(docs) == expected, lines
    for doc in docs:
        assert doc["FunctionName"] == FUNCTION and doc["Invocations"] == 1
        assert doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Idempotency"
    return docs


def counts(doc: dict[str, Any]) -> dict[str, int]:
    return {name: doc[name] for name in COUNTED if name in doc}


def scan(ddb_client: Any, table: str) -> list[dict[str, Any]]:
    return ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]


def test_a_first_run_and_its_replay(build, capsys, ddb_client, table):
    function = build()
    order = {"orderId": uuid.uuid4().hex}
    assert function(order) == {"ok": True}
    assert function(order) == {"ok": True}
    first, again = documents(capsys, 2)
    assert len(function.runs) == 1
    assert [item["status"]["S"] for item in scan(ddb_client, table)] == ["COMPLETED"]
    assert counts(first) == {"FirstExecutions": 1} and counts(again) == {"Replays": 1}
    assert first["Source"] == again["Source"] == "event"
    assert first["StoreTime"] > 0 and again["StoreTime"] > 0
    assert first["idempotency_key"] == again["idempotency_key"] == scan(ddb_client, table)[0]["id"]["S"]


def test_a_local_cache_replay_makes_one_read(build, capsys, proxy):
    function = build(IDEMPOTENCY_LOCAL_CACHE_SIZE="8")
    order = {"orderId": uuid.uuid4().hex}
    function(order)
    proxy.reset()
    function(order)
    assert proxy.snapshot()[0] == {"GetItem": 1}  # the record confirmed, its result from memory
    _, again = documents(capsys, 2)
    assert len(function.runs) == 1
    assert counts(again) == {"LocalCacheReplays": 1} and again["StoreTime"] > 0


def _blocking(function: Function) -> tuple[threading.Event, threading.Event]:
    started, release = threading.Event(), threading.Event()

    def slow(event: Any, context: Any) -> Any:
        started.set()
        assert release.wait(20)
        return {"slow": True}

    function.user = slow
    return started, release


def test_an_in_progress_conflict(build, capsys):
    # Two environments (two builds): one invocation at a time each, as Lambda runs them.
    first, second = build(), build()
    started, release = _blocking(first)
    order = {"orderId": uuid.uuid4().hex}
    runner = threading.Thread(target=first, args=(order,))
    runner.start()
    try:
        assert started.wait(20)
        with pytest.raises(IdempotencyAlreadyInProgressError):
            second(order)
    finally:
        release.set()
        runner.join(20)
    conflict, done = documents(capsys, 2)
    assert counts(conflict) == {"InProgressConflicts": 1}
    assert counts(done) == {"FirstExecutions": 1}
    assert len(first.runs) == 1 and len(second.runs) == 0


def test_a_wait_that_replays(build, capsys):
    first, second = build(), build(IDEMPOTENCY_WAIT_SECONDS="15")
    started, release = _blocking(first)
    order = {"orderId": uuid.uuid4().hex}
    answers: list[Any] = []
    runner = threading.Thread(target=first, args=(order,))
    runner.start()
    assert started.wait(20)
    waiter = threading.Thread(target=lambda: answers.append(second(order)))
    waiter.start()
    time.sleep(0.4)  # the second copy is waiting on the live claim
    release.set()
    runner.join(20)
    waiter.join(20)
    assert answers == [{"slow": True}]
    docs = documents(capsys, 2)
    done, waited = sorted(docs, key=lambda doc: "Waits" in doc)
    assert counts(done) == {"FirstExecutions": 1}
    assert counts(waited) == {"Waits": 1, "WaitsReplayed": 1, "Replays": 1}
    assert len(first.runs) == 1 and len(second.runs) == 0


def test_a_payload_mismatch(build, capsys):
    function = build(IDEMPOTENCY_PAYLOAD_JMESPATH="amount")
    order = uuid.uuid4().hex
    function({"orderId": order, "amount": 10})
    with pytest.raises(IdempotencyPayloadMismatchError):
        function({"orderId": order, "amount": 99})
    _, refused = documents(capsys, 2)
    assert counts(refused) == {"PayloadMismatches": 1}
    assert len(function.runs) == 1


def test_a_handler_error_releases_and_is_reraised_unchanged(build, capsys, ddb_client, table):
    function = build()
    declined = ValueError("declined")

    def fail(event: Any, context: Any) -> Any:
        raise declined

    function.user = fail
    order = {"orderId": uuid.uuid4().hex}
    with pytest.raises(ValueError) as caught:
        function(order)
    assert caught.value is declined
    assert scan(ddb_client, table) == []  # released: a retry runs again
    function.user = lambda event, context: "second time"
    assert function(order) == "second time"
    failed, retried = documents(capsys, 2)
    assert counts(failed) == {"FirstExecutions": 1, "Releases": 1}
    assert counts(retried) == {"FirstExecutions": 1}
    assert len(function.runs) == 2


def test_a_result_too_large(build, capsys):
    function = build()
    big = os.urandom(500_000).hex()  # over an item's 400 KB, compressed too
    function.user = lambda event, context: big
    order = {"orderId": uuid.uuid4().hex}
    assert function(order) == big
    with pytest.raises(IdempotencyResultTooLargeError):
        function(order)
    first, again = documents(capsys, 2)
    assert counts(first) == {"FirstExecutions": 1, "ResultsTooLarge": 1}
    assert counts(again) == {"Replays": 1}
    assert len(function.runs) == 1


def test_a_pass_through(build, capsys, ddb_client, table, proxy):
    function = build()
    proxy.reset()
    function({"noOrder": 1})
    function({"noOrder": 1})
    docs = documents(capsys, 2)
    assert [counts(doc) for doc in docs] == [{"PassThroughs": 1}] * 2
    assert "StoreTime" not in docs[0] and "idempotency_key" not in docs[0]
    assert len(function.runs) == 2 and scan(ddb_client, table) == [] and proxy.total() == 0


def test_a_batch_with_mixed_outcomes(build, capsys, ddb_client, table):
    function = build(IDEMPOTENCY_KEY_JMESPATH=None)  # SQS records keyed by messageId
    other = build(IDEMPOTENCY_KEY_JMESPATH=None)
    done, busy, new, failing = (json_message({"n": n}) for n in range(4))
    function(sqs_event([done]))  # done before: its redelivery is a replay
    keys = KeyDeriver(FUNCTION, None)
    live = other.handler.cycle.claim(Invocation(30_000), keys.key_of(busy.message_id))  # live elsewhere
    assert isinstance(live, Claimed)
    capsys.readouterr()
    function.runs.clear()

    def handler(event: Any, context: Any) -> Any:
        failed = [r["messageId"] for r in event["Records"] if r["messageId"] == failing.message_id]
        return {"batchItemFailures": [{"itemIdentifier": i} for i in failed]}

    function.user = handler
    answer = function(sqs_event([done, busy, new, failing, new]))  # `new` twice: one claim, one outcome
    assert sorted(item["itemIdentifier"] for item in answer["batchItemFailures"]) == sorted(
        [busy.message_id, failing.message_id])
    (doc,) = documents(capsys, 1)
    given = [r["messageId"] for r in function.runs[0]["Records"]]
    assert sorted(given) == sorted([new.message_id, failing.message_id])  # the handler ran these two
    assert (doc["Source"], doc["Records"]) == ("batch", 5)
    assert counts(doc) == {"FirstExecutions": 2, "Replays": 1, "InProgressConflicts": 1, "Releases": 1}
    statuses = sorted(item["status"]["S"] for item in scan(ddb_client, table))
    assert statuses == ["COMPLETED", "COMPLETED", "INPROGRESS"]  # done, new; busy's live claim


def test_an_http_request_and_its_replay(build, capsys):
    function = build(IDEMPOTENCY_KEY_JMESPATH=None)
    function.user = lambda event, context: {"statusCode": 201, "body": "created"}
    key = uuid.uuid4().hex
    first = function(v2("POST", "/orders", {"Idempotency-Key": key}, '{"item": 1}'))
    again = function(v2("POST", "/orders", {"Idempotency-Key": key}, '{"item": 1}'))
    assert first["statusCode"] == again["statusCode"] == 201
    assert again["headers"]["Idempotent-Replayed"] == "true"
    docs = documents(capsys, 2)
    assert [doc["Source"] for doc in docs] == ["http", "http"]
    assert [counts(doc) for doc in docs] == [{"FirstExecutions": 1}, {"Replays": 1}]
    assert len(function.runs) == 1


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_store_error_still_writes_the_document(build, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("IDEMPOTENCY_MAX_ATTEMPTS", "1")
    function = build()
    capsys.readouterr()
    with pytest.raises(IdempotencyPersistenceLayerError):
        function({"orderId": uuid.uuid4().hex})
    (doc,) = documents(capsys, 1)
    assert doc["StoreErrors"] >= 1 and "FirstExecutions" not in doc
    assert doc["StoreTime"] >= 0
    assert function.runs == []


class ShortContext(Context):
    def get_remaining_time_in_millis(self) -> int:
        return 1_500


@pytest.fixture
def faults(dynamodb, monkeypatch):
    """A fault proxy in front of DynamoDB Local, for functions built after this fixture; one attempt a request."""
    upstream = urlparse(dynamodb.endpoint)
    with FaultProxy(upstream.hostname or "127.0.0.1", upstream.port or 0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
        monkeypatch.setenv("IDEMPOTENCY_MAX_ATTEMPTS", "1")
        yield proxy


def test_completion_retries_and_a_completion_that_fails(build, faults, capsys, ddb_client, table):
    function = build()
    capsys.readouterr()
    faults.script("UpdateItem", THROTTLE, THROTTLE)  # the completion: refused twice, then it lands
    order = {"orderId": uuid.uuid4().hex}
    function(order)
    assert [item["status"]["S"] for item in scan(ddb_client, table)] == ["COMPLETED"]
    faults.script("UpdateItem", *[INTERNAL] * 50)  # refused until the invocation's time is spent
    function.handler({"orderId": uuid.uuid4().hex}, ShortContext())
    retried, failed = documents(capsys, 2)
    assert counts(retried) == {"FirstExecutions": 1, "CompletionRetries": 2, "StoreErrors": 2}
    assert counts(failed)["CompletionFailures"] == 1 and counts(failed)["FirstExecutions"] == 1
    attempts = faults.operations()["UpdateItem"][INTERNAL]
    assert counts(failed)["CompletionRetries"] == attempts - 1 and counts(failed)["StoreErrors"] == attempts
    assert len(function.runs) == 2


_steps = st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=8)


@PROPERTY
@given(steps=_steps, cache=st.booleans())
def test_summed_counts_match_the_runs(build, capsys, steps, cache):
    """Random sequences of copies of a few events, some failing: the documents' sums equal what ran."""
    function = build(IDEMPOTENCY_LOCAL_CACHE_SIZE="8" if cache else "0")
    capsys.readouterr()
    orders = [uuid.uuid4().hex for _ in range(3)]
    done = [False] * 3  # the model: which orders completed
    expected = {"runs": 0, "replays": 0, "releases": 0}
    for which, fail in steps:
        if done[which]:
            expected["replays"] += 1
        else:
            expected["runs"] += 1
            expected["releases"] += fail
            done[which] = not fail

        def user(event: Any, context: Any, fail: bool = fail) -> Any:
            if fail:
                raise RuntimeError("no")
            return {"done": event["orderId"]}

        function.user = user
        with contextlib.suppress(RuntimeError):
            function({"orderId": orders[which]})
    docs = documents(capsys, len(steps))
    total = {name: sum(doc.get(name, 0) for doc in docs) for name in COUNTED}
    assert len(function.runs) == expected["runs"]  # the side effect agrees with the model
    assert total["FirstExecutions"] == len(function.runs)
    assert total["Releases"] == expected["releases"]
    assert total["Replays"] + total["LocalCacheReplays"] == expected["replays"]
    assert total["LocalCacheReplays"] == (expected["replays"] if cache else 0)
    assert total["StoreErrors"] == total["InProgressConflicts"] == total["PayloadMismatches"] == 0


_batches = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.sets(st.integers(0, 3))),
                    min_size=1, max_size=5)


@PROPERTY
@given(batches=_batches)
def test_summed_batch_counts_match_the_records_that_ran(build, capsys, batches):
    """Random SQS batches over four messages (repeats within a batch included), the handler failing some: each
    batch's document counts what a model of the records predicts, and FirstExecutions what the handler ran."""
    function = build(IDEMPOTENCY_KEY_JMESPATH=None)
    capsys.readouterr()
    messages = [json_message({"n": n}) for n in range(4)]
    done: set[int] = set()
    ran: list[str] = []
    for picks, failing in batches:
        failing_ids = {messages[n].message_id for n in failing}

        def handler(event: Any, context: Any, failing_ids: set[str] = failing_ids) -> Any:
            ids = [record["messageId"] for record in event["Records"]]
            ran.extend(ids)
            return {"batchItemFailures": [{"itemIdentifier": i} for i in ids if i in failing_ids]}

        function.user = handler
        expected = {"FirstExecutions": 0, "Replays": 0, "Releases": 0}
        for n in dict.fromkeys(picks):  # each distinct message once, at its first record
            if n in done:
                expected["Replays"] += 1
            else:
                expected["FirstExecutions"] += 1
                if n in failing:
                    expected["Releases"] += 1
                else:
                    done.add(n)
        before = len(ran)
        function(sqs_event([messages[n] for n in picks]))
        (doc,) = documents(capsys, 1)
        assert doc["Records"] == len(picks)
        assert {name: doc.get(name, 0) for name in expected} == expected
        assert counts(doc).keys() <= set(expected)
        assert len(ran) - before == doc.get("FirstExecutions", 0)  # the handler's own record of what it ran


def test_a_release_that_fails_is_not_counted_as_a_release(build, faults, capsys, ddb_client, table):
    function = build()
    capsys.readouterr()

    def fail(event: Any, context: Any) -> Any:
        raise ValueError("declined")

    function.user = fail
    faults.script("DeleteItem", INTERNAL)  # the release is refused: the claim stays
    with pytest.raises(ValueError):
        function({"orderId": uuid.uuid4().hex})
    (doc,) = documents(capsys, 1)
    assert counts(doc) == {"FirstExecutions": 1, "ReleaseFailures": 1, "StoreErrors": 1}
    assert [item["status"]["S"] for item in scan(ddb_client, table)] == ["INPROGRESS"]
    assert len(function.runs) == 1
