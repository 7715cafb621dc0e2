"""A redelivered batch answered in one request (issue 23 part 4): IDEMPOTENCY_BATCH_PRECHECK on DynamoDB Local.

Requests are counted on the wire by the counting proxy (or the denying one); executions by the consumer's own
list of the payload ids it processed, never by the layer's report.
"""

from __future__ import annotations

import copy
import json
import logging
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer import codec
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.metrics import Tally
from idempotency_layer.sources import batch
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.conftest import build_transport
from tests.store.test_batch import Consumer, deliver, failed_ids, messages
from tests.store.test_cli_commands import Denying
from tests.support import events
from tests.support.batches import BatchRunner

LONG = 60_000


def runner(store: Any, consumer: Consumer, precheck: str = "auto", expression: str | None = None,
           payload: str | None = None, prefix: str = "fn") -> BatchRunner:
    cycle = Cycle(store, ttl_seconds=3600, precheck=precheck)
    return BatchRunner(cycle, KeyDeriver(prefix, expression, payload), False, consumer)


def requests(proxy: Any) -> dict[str, int]:
    return proxy.snapshot()[0]


def test_a_fully_redelivered_sqs_batch_of_10_is_one_request_and_counts_as_replays(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(10, "full")
    deliver(run, events.sqs_event(batch_))
    run.tally = tally = Tally()
    proxy.reset()
    response = deliver(run, events.sqs_event(batch_))  # ApproximateReceiveCount 2 on every record
    assert requests(proxy) == {"BatchGetItem": 1}
    assert response == {"batchItemFailures": []}
    assert sorted(consumer.runs) == sorted(f"full-{i}" for i in range(10)) and len(consumer.events) == 1
    assert tally.counts == {"Replays": 10}
    assert tally.store_requests == 1 and tally.store_s > 0  # StoreTime includes the read


def test_a_new_batch_under_auto_is_not_prechecked(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    proxy.reset()
    assert deliver(run, events.sqs_event(messages(10, "new"))) is None  # ApproximateReceiveCount 1
    assert requests(proxy) == {"PutItem": 10, "UpdateItem": 10}
    assert len(consumer.runs) == 10


def test_a_half_done_redelivered_batch_is_one_read_and_two_requests_per_record_not_done(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(10, "half")
    deliver(run, events.sqs_event(batch_[:4]))
    proxy.reset()
    assert deliver(run, events.sqs_event(batch_)) is None
    assert requests(proxy) == {"BatchGetItem": 1, "PutItem": 6, "UpdateItem": 6}
    assert sorted(consumer.runs) == sorted(f"half-{i}" for i in range(10))
    assert [json.loads(r["body"])["id"] for r in consumer.events[-1]["Records"]] == [f"half-{i}" for i in range(4, 10)]


def test_always_precheks_a_new_batch_and_never_skips_a_redelivered_one(store, proxy):
    always, never = Consumer(), Consumer()
    first = runner(store, always, "always")
    proxy.reset()
    deliver(first, events.sqs_event(messages(10, "always")))
    assert requests(proxy) == {"BatchGetItem": 1, "PutItem": 10, "UpdateItem": 10}
    second = runner(store, never, "never")
    batch_ = messages(10, "never")
    deliver(second, events.sqs_event(batch_))
    proxy.reset()
    assert deliver(second, events.sqs_event(batch_)) == {"batchItemFailures": []}
    assert requests(proxy) == {"PutItem": 10}  # one failed conditional write per record, as before
    assert len(always.runs) == 10 and len(never.runs) == 10


def test_a_stream_has_no_redelivery_sign_so_only_always_prechecks_it(store, proxy):
    records = [events.kinesis_record({"id": f"k-{i}"}) for i in range(10)]
    consumer = Consumer()
    auto = runner(store, consumer)
    deliver(auto, events.stream_event(records))
    proxy.reset()
    deliver(auto, events.stream_event(records))
    assert requests(proxy) == {"PutItem": 10}
    proxy.reset()
    deliver(runner(store, consumer, "always"), events.stream_event(records))
    assert requests(proxy) == {"BatchGetItem": 1}
    assert sorted(consumer.runs) == sorted(f"k-{i}" for i in range(10))


def test_one_key_is_not_prechecked_its_claim_answers_in_one_request_too(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer, "always")
    batch_ = messages(1, "one")
    deliver(run, events.sqs_event(batch_))
    proxy.reset()
    deliver(run, events.sqs_event(batch_))
    assert requests(proxy) == {"PutItem": 1} and consumer.runs == ["one-0"]


def test_more_than_100_distinct_keys_take_one_read_per_100(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(250, "many")
    deliver(run, events.sqs_event(batch_))
    proxy.reset()
    assert deliver(run, events.sqs_event(batch_)) == {"batchItemFailures": []}
    assert requests(proxy) == {"BatchGetItem": 3}
    assert len(consumer.runs) == 250 and len(set(consumer.runs)) == 250


def test_a_sort_key_table_is_prechecked_too(transport, sort_key_table, proxy):
    store = DynamoDBStore(transport, sort_key_table, Attributes(key="pk", sort_key="sk"), "idempotency#fn",
                          key_prefix="fn")
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(5, "sk")
    deliver(run, events.sqs_event(batch_[:3]))
    proxy.reset()
    assert deliver(run, events.sqs_event(batch_)) is None
    assert requests(proxy) == {"BatchGetItem": 1, "PutItem": 2, "UpdateItem": 2}
    assert sorted(consumer.runs) == sorted(f"sk-{i}" for i in range(5))


class Rewriting:
    """Passes every call to `transport`; a BatchGetItem's answer goes through `rewrite` first when on."""

    def __init__(self, transport: Any, rewrite: Any) -> None:
        self.transport, self.rewrite, self.on, self.reads = transport, rewrite, True, 0

    def call(self, operation: str, params: dict[str, Any], deadline: Any = None) -> dict[str, Any]:
        answer = self.transport.call(operation, params, deadline)
        if operation == "BatchGetItem" and self.on:
            self.reads += 1
            return self.rewrite(copy.deepcopy(answer), params, self.reads)
        return answer


def _items(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return next(iter(answer["Responses"].values()))


def _status_not_ours(answer, params, reads):
    for item in _items(answer)[:2]:
        item["status"] = {"S": "DONE"}
    return answer


def _another_table(answer, params, reads):
    answer["Responses"] = {"someone-elses-table": _items(answer)}
    return answer


def _keys_not_asked(answer, params, reads):
    for item in _items(answer)[:2]:
        item["id"] = {"S": f"fn#{uuid.uuid4().hex}"}
    return answer


def _expiry_not_a_number(answer, params, reads):
    for item in _items(answer)[:2]:
        item["expires_at"] = {"S": "soon"}
    return answer


def _key_not_a_string(answer, params, reads):
    for item in _items(answer)[:2]:
        item["id"] = {"S": ["fn#order"]}
    return answer


@pytest.mark.parametrize("rewrite, claims", [(_status_not_ours, 2), (_another_table, 4), (_keys_not_asked, 2),
                                             (_expiry_not_a_number, 2), (_key_not_a_string, 2)])
def test_an_item_that_is_not_a_completed_record_asked_for_goes_to_the_claim_never_to_done(
        transport, table_name, proxy, rewrite, claims):
    rewriting = Rewriting(transport, rewrite)
    store = DynamoDBStore(rewriting, table_name, Attributes(), key_prefix="fn")
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(4, "foreign")
    rewriting.on = False
    deliver(run, events.sqs_event(batch_))
    rewriting.on = True
    proxy.reset()
    assert deliver(run, events.sqs_event(batch_)) == {"batchItemFailures": []}
    # The claims of the keys the read did not answer find the records done: nothing runs again.
    assert requests(proxy) == {"BatchGetItem": 1, "PutItem": claims}
    assert sorted(consumer.runs) == sorted(f"foreign-{i}" for i in range(4))


def _malformed(answer, params, reads):
    return {"Responses": "not an object"}


def _unprocessed_not_asked(answer, params, reads):
    (table, request), = params["RequestItems"].items()
    answer["UnprocessedKeys"] = {table: {**request, "Keys": [{"id": {"S": "fn#never-asked"}}]}}
    return answer


def _unprocessed_once(answer, params, reads):
    """The first read leaves its last two keys unprocessed, as a throttled table may."""
    if reads > 1:
        return answer
    (table, request), = params["RequestItems"].items()
    left = request["Keys"][-2:]
    names = {key["id"]["S"] for key in left}
    answer["Responses"][table] = [item for item in answer["Responses"][table] if item["id"]["S"] not in names]
    answer["UnprocessedKeys"] = {table: {**request, "Keys": left}}
    return answer


def test_unprocessed_keys_are_read_again(transport, table_name, proxy):
    store = DynamoDBStore(Rewriting(transport, _unprocessed_once), table_name, Attributes(), key_prefix="fn")
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(6, "left")
    deliver(run, events.sqs_event(batch_))
    proxy.reset()
    assert deliver(run, events.sqs_event(batch_)) == {"batchItemFailures": []}
    assert requests(proxy) == {"BatchGetItem": 2}
    assert len(consumer.runs) == 6


@pytest.mark.parametrize("rewrite", [_malformed, _unprocessed_not_asked])
def test_a_malformed_answer_falls_back_to_the_claims_with_a_warning(transport, table_name, proxy, caplog, rewrite):
    store = DynamoDBStore(Rewriting(transport, rewrite), table_name, Attributes(), key_prefix="fn")
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(3, "bad")
    deliver(run, events.sqs_event(batch_[:2]))
    proxy.reset()
    with caplog.at_level(logging.WARNING, "idempotency_layer"):
        assert deliver(run, events.sqs_event(batch_)) is None
    assert requests(proxy) == {"BatchGetItem": 1, "PutItem": 3, "UpdateItem": 1}
    assert sorted(consumer.runs) == ["bad-0", "bad-1", "bad-2"]
    warned = [r.getMessage() for r in caplog.records if "pre-checking" in r.getMessage()]
    assert len(warned) == 1 and "BatchGetItem" in warned[0] and "3 keys" in warned[0]
    assert "bad-" not in caplog.text  # no content in logs


@pytest.mark.parametrize("kind", ["lean", "boto3"])
def test_a_role_without_batchgetitem_keeps_working_and_warns_once(layer_env, table_name, monkeypatch, caplog,
                                                                   kind):
    with Denying(layer_env.endpoint, "BatchGetItem") as denying:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", denying.endpoint)
        store = DynamoDBStore(build_transport(kind, connect_timeout=2, read_timeout=5, max_attempts=2),
                              table_name, Attributes(), key_prefix="fn")
        consumer = Consumer()
        run = runner(store, consumer)
        batch_ = messages(4, "denied")
        deliver(run, events.sqs_event(batch_[:2]))
        with caplog.at_level(logging.WARNING, "idempotency_layer"):
            for delivery in range(3):  # redelivered three times
                denying.seen.clear()
                response = deliver(run, events.sqs_event(batch_))
                assert response in (None, {"batchItemFailures": []})
                reads = denying.seen.count("BatchGetItem")
                if delivery == 0:
                    assert reads == 1  # denied once (no retry of a permanent error) ...
                else:
                    assert reads == 0 and denying.seen.count("PutItem") == 4  # ... then never asked again
        assert sorted(consumer.runs) == sorted(f"denied-{i}" for i in range(4))
        warned = [r.getMessage() for r in caplog.records if "no longer pre-checked" in r.getMessage()]
        # The store names the grant it lacks (`read_grant`); the cycle's words name no backend.
        assert store.read_grant == f"dynamodb:BatchGetItem on table {store.table!r}"
        assert warned == [f"the function lacks {store.read_grant}: batches are no longer pre-checked in this "
                          "environment, "
                          "each record is claimed (grant it to answer a redelivered batch in one request)"]


def test_a_throttled_precheck_falls_back_to_the_claims(layer_env, table_name, monkeypatch, caplog):
    with Denying(layer_env.endpoint, "BatchGetItem", error=(400, "ThrottlingException")) as throttling:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", throttling.endpoint)
        store = DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=1),
                              table_name, Attributes(), key_prefix="fn")
        consumer = Consumer()
        run = runner(store, consumer)
        batch_ = messages(3, "throttled")
        deliver(run, events.sqs_event(batch_[:1]))
        for replays in (1, 3):  # twice: first one record done, then all three
            throttling.seen.clear()
            run.tally = tally = Tally()
            with caplog.at_level(logging.WARNING, "idempotency_layer"):
                assert deliver(run, events.sqs_event(batch_)) in (None, {"batchItemFailures": []})
            assert throttling.seen.count("BatchGetItem") == 1  # a passing failure: tried again next batch
            # the failed read is a store error; the done records are found by their claims instead
            assert tally.counts["StoreErrors"] == 1 and tally.counts["Replays"] == replays
        assert sorted(consumer.runs) == ["throttled-0", "throttled-1", "throttled-2"]
        assert "ThrottlingException" in caplog.text


# -- the pre-check never changes which records run --------------------------------------------------------------

STATES = ("absent", "completed", "in_progress", "expired", "expired_claim", "mismatched")


def _prepare(store: Any, keys: KeyDeriver, message: events.Message, state: str) -> None:
    """Leave the record of `message` in `state`, as earlier invocations would have."""
    record = json.loads(message.body)
    key = keys.key(record_of(message))
    now = time.time()
    if state == "absent":
        return
    if state in ("expired", "expired_claim"):
        past = Cycle(store, ttl_seconds=60, clock=lambda: now - 3600)
        owner = past.claim(Invocation(1_000), key, keys.fingerprint(record_of(message))).owner
        if state == "expired":
            past.complete(Invocation(LONG), key, owner, codec.Encoded(codec.DONE, None))
        return
    cycle = Cycle(store, ttl_seconds=3600)
    other = {**record, "amount": -1} if state == "mismatched" else record
    owner = cycle.claim(Invocation(LONG), key, keys.fingerprint({"body": json.dumps(other)})).owner
    if state in ("completed", "mismatched"):
        cycle.complete(Invocation(LONG), key, owner, codec.Encoded(codec.DONE, None))


def record_of(message: events.Message) -> dict[str, Any]:
    return {"messageId": message.message_id, "body": message.body}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(states=st.lists(st.sampled_from(STATES), min_size=2, max_size=8),
       fail=st.lists(st.booleans(), min_size=8, max_size=8), fifo=st.booleans())
def test_the_precheck_never_changes_which_records_run_only_the_request_count(store, proxy, states, fail, fifo):
    """Each record's prior state drawn at random: `never` and `always` hand the handler the same records and
    answer the same; `always` costs one read and no claim for each completed record (a mismatch included)."""
    tag = uuid.uuid4().hex[:8]
    batch_ = [events.json_message({"id": f"{tag}-{i}", "order": f"{tag}-{i}", **({"fail": True} if fail[i] else {})})
              for i in range(len(states))]
    arn = events.queue_arn("orders", fifo=fifo)
    outcomes = {}
    for mode in ("never", "always"):
        consumer = Consumer()
        run = runner(store, consumer, mode, "json_parse(body).order", "json_parse(body)", prefix=f"fn-{mode}")
        for message, state in zip(batch_, states, strict=True):
            _prepare(store, run.keys, message, state)
        event = events.sqs_event(batch_, arn)
        proxy.reset()
        response = run.run(batch.parse(event, False), event, None, LONG)
        outcomes[mode] = (consumer.runs, failed_ids(response), requests(proxy))
    (never_runs, never_failed, never_requests), (always_runs, always_failed, always_requests) = outcomes.values()
    assert always_runs == never_runs and always_failed == never_failed
    answered = sum(state in ("completed", "mismatched") for state in states)
    assert always_requests.pop("BatchGetItem") == 1
    never_requests["PutItem"] -= answered
    assert always_requests == {name: n for name, n in never_requests.items() if n}
