"""Payload fingerprints (IDEMPOTENCY_PAYLOAD_JMESPATH), the in-progress floor (IDEMPOTENCY_IN_PROGRESS_SECONDS)
and waiting for an in-flight copy (IDEMPOTENCY_WAIT_SECONDS), through the cycle and the real store on
DynamoDB Local. Executions are counted by the handlers' own side effect; requests on the wire by the proxy.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from idempotency_layer.cycle import Claimed, Cycle
from idempotency_layer.errors import IdempotencyAlreadyInProgressError, IdempotencyPayloadMismatchError
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import batch
from tests.support import events
from tests.support.batches import BatchRunner

KEY = "fn#order-1"
LONG = 60_000
KEYS = KeyDeriver("fn", "orderId", "[orderId, amount]")


class Handler:
    def __init__(self, result: Any = None, error: BaseException | None = None,
                 gate: threading.Event | None = None) -> None:
        self.calls: list[float] = []
        self.result, self.error, self.gate = result, error, gate
        self.started = threading.Event()

    def __call__(self) -> Any:
        self.calls.append(time.time())
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.error is not None:
            raise self.error
        return self.result


def test_a_fingerprint_is_stored_and_a_copy_with_another_payload_is_refused(store, ddb_client, table_name):
    cycle = Cycle(store, ttl_seconds=3600)
    handler = Handler({"ok": 1})
    order = {"orderId": "o-1", "amount": 10}
    assert cycle.run(Invocation(LONG), KEYS.key(order), handler, KEYS.fingerprint(order)).value == {"ok": 1}
    item = ddb_client.get_item(TableName=table_name, Key={"id": {"S": KEYS.key(order)}}, ConsistentRead=True)["Item"]
    assert item["payload_hash"]["S"] == KEYS.fingerprint(order) and len(item["payload_hash"]["S"]) == 64 + 1 + 16
    changed = {"orderId": "o-1", "amount": "S3CRET-AMOUNT"}
    assert KEYS.key(changed) == KEYS.key(order) and KEYS.fingerprint(changed) != KEYS.fingerprint(order)
    with pytest.raises(IdempotencyPayloadMismatchError, match="was used before with another payload") as caught:
        cycle.run(Invocation(LONG), KEYS.key(changed), handler, KEYS.fingerprint(changed))
    assert "S3CRET" not in str(caught.value)  # names the key, never the payload
    same = {"orderId": "o-1", "amount": 10, "note": "not in the fingerprint"}
    assert cycle.run(Invocation(LONG), KEYS.key(same), handler, KEYS.fingerprint(same)).replayed
    assert len(handler.calls) == 1


def test_a_copy_with_another_payload_is_refused_while_the_first_is_in_progress(store):
    cycle = Cycle(store, ttl_seconds=3600)
    assert isinstance(cycle.claim(Invocation(LONG), KEY, "a" * 64), Claimed)
    with pytest.raises(IdempotencyPayloadMismatchError):
        cycle.run(Invocation(LONG), KEY, Handler(), "b" * 64)
    with pytest.raises(IdempotencyAlreadyInProgressError):
        cycle.run(Invocation(LONG), KEY, Handler(), "a" * 64)


def test_the_local_cache_checks_the_fingerprint_before_replaying(store, proxy):
    cycle = Cycle(store, ttl_seconds=3600, cache_size=10)
    handler = Handler("v")
    cycle.run(Invocation(LONG), KEY, handler, "a" * 64)
    proxy.reset()
    with pytest.raises(IdempotencyPayloadMismatchError):
        cycle.run(Invocation(LONG), KEY, handler, "b" * 64)
    assert cycle.run(Invocation(LONG), KEY, handler, "a" * 64).replayed
    # Both answered from the cache, each after one read that confirms the record (it carries no result); the
    # fingerprint compared is the record's own.
    assert proxy.snapshot()[0] == {"GetItem": 2}
    # A record replayed from the table enters the cache, after the check.
    other = Cycle(store, ttl_seconds=3600, cache_size=10)
    with pytest.raises(IdempotencyPayloadMismatchError):
        other.run(Invocation(LONG), KEY, handler, "b" * 64)
    assert other.cached(Invocation(LONG), KEY) is None  # a refused copy put nothing in the cache
    assert other.run(Invocation(LONG), KEY, handler, "a" * 64).replayed
    with pytest.raises(IdempotencyPayloadMismatchError):
        other.cached(Invocation(LONG), KEY, "b" * 64)
    assert len(handler.calls) == 1


def test_a_record_without_a_fingerprint_replays_to_any_payload(store):
    Cycle(store, ttl_seconds=3600).run(Invocation(LONG), KEY, Handler("first"))  # before the setting was turned on
    handler = Handler("second")
    assert Cycle(store, ttl_seconds=3600).run(Invocation(LONG), KEY, handler, "a" * 64).value == "first"
    assert handler.calls == []


def test_a_record_fingerprinted_by_another_expression_is_not_compared(store):
    before = KeyDeriver("fn", "orderId", "p")
    after = KeyDeriver("fn", "orderId", "q")
    event = {"orderId": "o-1", "p": 1, "q": 2}
    handler = Handler("first")
    Cycle(store, ttl_seconds=3600).run(Invocation(LONG), before.key(event), handler, before.fingerprint(event))
    # The same event under the changed setting: a retry, not another payload.
    again = Cycle(store, ttl_seconds=3600).run(Invocation(LONG), after.key(event), handler, after.fingerprint(event))
    assert again.replayed
    assert len(handler.calls) == 1


def test_batch_records_with_another_payload_are_reported(store):
    keys = KeyDeriver("fn", "json_parse(body).order", "json_parse(body).amount")
    runs: list[str] = []

    def consumer(event, context):
        runs.extend(json.loads(r["body"])["tag"] for r in event["Records"])

    run = BatchRunner(Cycle(store, ttl_seconds=3600), keys, False, consumer)
    first = events.json_message({"order": "A", "amount": 1, "tag": "a1"})
    twin = events.json_message({"order": "A", "amount": 2, "tag": "a2"})  # same key, another amount
    copy = events.json_message({"order": "A", "amount": 1, "tag": "a3"})  # same key, same amount
    event = events.sqs_event([first, twin, copy])
    response = run.run(batch.parse(event, False), event, None, LONG)
    assert response == {"batchItemFailures": [{"itemIdentifier": twin.message_id}]}
    assert runs == ["a1"]
    later = events.sqs_event([events.json_message({"order": "A", "amount": 3, "tag": "a4"})])
    response = run.run(batch.parse(later, False), later, None, LONG)
    assert response == {"batchItemFailures": [{"itemIdentifier": later["Records"][0]["messageId"]}]}
    assert runs == ["a1"]


def test_in_progress_seconds_keeps_a_claim_past_the_invocations_deadline(store):
    cycle = Cycle(store, ttl_seconds=3600, min_claim_ms=600_000)
    before = time.time()
    assert isinstance(cycle.claim(Invocation(1_000), KEY, None), Claimed)
    record = store.get(KEY)
    assert record.in_progress_until >= int(before * 1000) + 600_000
    assert record.expires_at >= int(before) + 3600
    time.sleep(1.2)  # the invocation's own deadline has passed; the floor has not
    with pytest.raises(IdempotencyAlreadyInProgressError):
        Cycle(store, ttl_seconds=3600).run(Invocation(LONG), KEY, Handler())
    # Never shorter than the invocation may run.
    floored = Cycle(store, ttl_seconds=3600, min_claim_ms=1_000)
    assert isinstance(floored.claim(Invocation(60_000), "fn#other", None), Claimed)
    assert store.get("fn#other").in_progress_until >= int(before * 1000) + 60_000


def _first_running(store, handler: Handler) -> threading.Thread:
    first = Cycle(store, ttl_seconds=3600)
    thread = threading.Thread(target=lambda: first.run(Invocation(LONG), KEY, handler), daemon=True)
    thread.start()
    assert handler.started.wait(30)
    return thread


def test_a_waiting_copy_replays_the_first_runs_result(store, proxy):
    gate = threading.Event()
    first = Handler({"n": 1}, gate=gate)
    thread = _first_running(store, first)
    threading.Timer(0.4, gate.set).start()
    proxy.reset()
    copy = Handler({"n": 2})
    outcome = Cycle(store, ttl_seconds=3600, wait_seconds=10).run(Invocation(LONG), KEY, copy)
    thread.join(30)
    assert outcome == (({"n": 1}), True)
    assert (len(first.calls), len(copy.calls)) == (1, 0)
    requests = proxy.snapshot()[0]
    # The claim that found it running, one consistent read per poll, the first's completion among them.
    assert requests.get("PutItem") == 1 and requests.get("GetItem", 0) >= 2
    assert set(requests) <= {"PutItem", "GetItem", "UpdateItem"}


def test_a_waiting_copy_runs_itself_when_the_first_run_fails(store):
    gate = threading.Event()
    first = Handler(error=ValueError("first failed"), gate=gate)
    raised: list[BaseException] = []

    def run_first() -> None:
        try:
            Cycle(store, ttl_seconds=3600).run(Invocation(LONG), KEY, first)
        except ValueError as error:
            raised.append(error)

    thread = threading.Thread(target=run_first, daemon=True)
    thread.start()
    assert first.started.wait(30)
    threading.Timer(0.3, gate.set).start()
    copy = Handler("mine")
    outcome = Cycle(store, ttl_seconds=3600, wait_seconds=10).run(Invocation(LONG), KEY, copy)
    thread.join(30)
    assert outcome == ("mine", False)
    assert (len(first.calls), len(copy.calls)) == (1, 1) and len(raised) == 1


def test_a_wait_that_runs_out_raises_in_progress_and_never_runs_the_handler(store):
    gate = threading.Event()
    thread = _first_running(store, Handler(gate=gate))
    try:
        copy = Handler()
        slept: list[float] = []

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

        started = time.monotonic()
        with pytest.raises(IdempotencyAlreadyInProgressError, match="after waiting"):
            Cycle(store, ttl_seconds=3600, wait_seconds=1.5, sleep=sleep).run(Invocation(LONG), KEY, copy)
        # It gives up only once the whole wait is spent, less at most one poll's time: a poll that would end past
        # the wait is not started (a poll here takes milliseconds; 0.1 s is room for a slow one).
        assert time.monotonic() - started >= 1.5 - 0.1
        assert len(slept) >= 3 and max(slept) <= 1.0  # polling all along, never more than 1 s apart
        # An invocation about to run out of time does not wait at all.
        with pytest.raises(IdempotencyAlreadyInProgressError):
            Cycle(store, ttl_seconds=3600, wait_seconds=10).run(Invocation(900), KEY, copy)
        assert copy.calls == []
    finally:
        gate.set()
        thread.join(30)


def test_a_waiting_copy_with_another_payload_is_refused(store):
    cycle = Cycle(store, ttl_seconds=3600)
    owner = cycle.claim(Invocation(LONG), KEY, "a" * 64).owner
    waiter = Cycle(store, ttl_seconds=3600, wait_seconds=5)
    with pytest.raises(IdempotencyPayloadMismatchError):
        waiter.run(Invocation(LONG), KEY, Handler(), "b" * 64)
    cycle.release(Invocation(LONG), KEY, owner)
