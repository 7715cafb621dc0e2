"""A request re-sent after its first send got no answer is uncertain, whatever the re-send is answered (issue 28,
item 4). On DynamoDB Local behind the fault proxy: the first send reaches the table and lands, the proxy resets the
connection instead of answering, and the request goes again (the lean client's free re-send on a new connection,
or boto3's retry), where the proxy answers a throttle (or the table answers a failed condition, since the first
send already landed). The claim must be withdrawn, so the caller's own retry runs at once instead of getting
409 until the deadline; a purge whose answer was lost must say the record is gone."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import pytest

from idempotency_layer.cli.records import purge
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED
from tests.conftest import TRANSPORTS, build_transport
from tests.support.fault_proxy import DROP_REPLY, THROTTLE, FaultProxy

LONG = 60_000


@pytest.fixture
def faulty(dynamodb: Any) -> Any:
    upstream = urlparse(dynamodb.endpoint)
    with FaultProxy(upstream.hostname, upstream.port) as proxy:
        yield proxy


def _store(kind: str, proxy: FaultProxy, table: str, monkeypatch: pytest.MonkeyPatch,
           max_attempts: int) -> DynamoDBStore:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    transport = build_transport(kind, connect_timeout=2, read_timeout=2, max_attempts=max_attempts)
    store = DynamoDBStore(transport, table, Attributes(), key_prefix="fn")
    assert store.get("warm-up") is None  # a kept-alive connection, for the lean client's re-send
    return store


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_claim_re_sent_after_a_lost_answer_then_throttled_is_withdrawn(
        kind: str, faulty: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # lean: the reset is a dead kept-alive connection, re-sent once for free, and the re-send is throttled (its one
    # attempt). boto3: the reset is its first attempt, its second is throttled.
    store = _store(kind, faulty, table_name, monkeypatch, max_attempts=1 if kind.startswith("lean") else 2)
    cycle = Cycle(store, ttl_seconds=3600)
    faulty.script("PutItem", DROP_REPLY, THROTTLE)
    runs: list[int] = []
    with pytest.raises(IdempotencyPersistenceLayerError, match="ThrottlingException"):
        cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1))
    assert faulty.operations()["PutItem"] == {DROP_REPLY: 1, THROTTLE: 1}
    # The first send's claim landed, and was withdrawn: the caller's retry runs now, not after the deadline.
    assert runs == [] and store.get("fn#order-1") is None
    assert cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1) or "placed").value == "placed"
    assert runs == [1]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_purge_whose_answer_was_lost_says_the_record_is_gone(
        kind: str, faulty: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(kind, faulty, table_name, monkeypatch, max_attempts=1 if kind.startswith("lean") else 2)
    cycle = Cycle(store, ttl_seconds=3600)
    assert cycle.run(Invocation(LONG), "fn#order-2", lambda: "placed").value == "placed"
    assert store.get("fn#order-2").status == COMPLETED
    # The delete lands, its answer is lost; sent again, it fails its condition (nothing is there any more).
    faulty.script("DeleteItem", DROP_REPLY)
    done = purge(store, "fn#order-2", yes=True, force=False)
    assert faulty.operations()["DeleteItem"] == {DROP_REPLY: 1, "forwarded": 1}
    assert done["deleted"] is True and done["was"] == "completed"
    assert store.get("fn#order-2") is None


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_completion_re_sent_after_a_lost_answer_then_throttled_stays_a_completion(
        kind: str, faulty: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(kind, faulty, table_name, monkeypatch, max_attempts=1 if kind.startswith("lean") else 2)
    cycle = Cycle(store, ttl_seconds=3600)
    faulty.script("UpdateItem", DROP_REPLY, THROTTLE)
    runs: list[int] = []
    assert cycle.run(Invocation(LONG), "fn#order-3", lambda: runs.append(1) or "placed").value == "placed"
    # The first send completed the record; whatever the layer made of the throttled re-send, the copy replays.
    assert store.get("fn#order-3").status == COMPLETED
    assert cycle.run(Invocation(LONG), "fn#order-3", lambda: runs.append(1)).value == "placed" and runs == [1]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_release_re_sent_after_a_lost_answer_then_throttled_lets_the_retry_run(
        kind: str, faulty: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = _store(kind, faulty, table_name, monkeypatch, max_attempts=1 if kind.startswith("lean") else 2)
    cycle = Cycle(store, ttl_seconds=3600)
    faulty.script("DeleteItem", DROP_REPLY, THROTTLE)

    def fails() -> None:
        raise ValueError("declined")

    with pytest.raises(ValueError, match="declined"):
        cycle.run(Invocation(LONG), "fn#order-4", fails)
    assert store.get("fn#order-4") is None  # the first send released it
    assert "may have landed" in caplog.text  # the failed release does not claim the key stays blocked
    assert cycle.run(Invocation(LONG), "fn#order-4", lambda: "placed").value == "placed"
