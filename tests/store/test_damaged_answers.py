"""Answers that are not DynamoDB's (a 200 holding a proxy's page or nothing, an answer whose Content-Length is
short) are never read as a success and never quoted: on every transport a damaged answer to a claim fails
closed, the handler does not run again, and no error or log line carries the stored result the answer held
(issue 20's hostile round: boto3 read a 200 page as a claim taken and ran the handler twice, and a cut
ConditionalCheckFailed answer put the stored result into the error). On DynamoDB Local behind the fault
proxy, which forwards each request (so it is applied) and damages its answer."""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlparse

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED
from tests.conftest import TRANSPORTS, build_transport
from tests.support.fault_proxy import DAMAGED, EMPTY, NOT_JSON, SHORT_REFUSAL, FaultProxy

SECRET = "card-4111111111111111"
LONG = 60_000


@pytest.fixture
def damaging(dynamodb: Any) -> Any:
    upstream = urlparse(dynamodb.endpoint)
    with FaultProxy(upstream.hostname, upstream.port) as proxy:
        yield proxy


def _cycle(kind: str, proxy: FaultProxy, table: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Cycle, DynamoDBStore]:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    store = DynamoDBStore(build_transport(kind, connect_timeout=2, read_timeout=2, max_attempts=1), table,
                          Attributes(), key_prefix="fn")
    return Cycle(store, ttl_seconds=3600), store


@pytest.mark.parametrize("damage", DAMAGED)
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_damaged_answer_to_a_claim_fails_closed_and_quotes_nothing(
        kind: str, damage: str, damaging: FaultProxy, table_name: str, layer_env: Any,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cycle, store = _cycle(kind, damaging, table_name, monkeypatch)
    runs: list[int] = []
    first = cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1) or {"paid": SECRET})
    assert first.value == {"paid": SECRET}
    # The copy's claim reaches the table, which refuses it (the key is completed) and sends the record back;
    # the answer the layer gets is damaged.
    damaging.script("PutItem", damage)
    with caplog.at_level(logging.DEBUG, logger="idempotency_layer"), \
            pytest.raises(IdempotencyPersistenceLayerError) as refused:
        cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1))
    assert runs == [1]
    assert SECRET not in str(refused.value) and SECRET not in repr(refused.value.__cause__)
    assert SECRET not in caplog.text
    # Nothing was changed by it: the next copy replays.
    assert store.get("fn#order-1").status == COMPLETED
    assert cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1)).value == {"paid": SECRET} and runs == [1]


@pytest.mark.parametrize("damage", [NOT_JSON, EMPTY, SHORT_REFUSAL])
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_page_in_answer_to_a_first_claim_is_no_claim(
        kind: str, damage: str, damaging: FaultProxy, table_name: str, layer_env: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that landed though its answer was a page: the handler does not run on it, and the claim, which
    may be ours, is withdrawn, so a retry runs at once."""
    cycle, store = _cycle(kind, damaging, table_name, monkeypatch)
    damaging.script("PutItem", damage)
    runs: list[int] = []
    with pytest.raises(IdempotencyPersistenceLayerError, match=r"ResponseParserError|not DynamoDB's JSON"):
        cycle.run(Invocation(LONG), "fn#order-2", lambda: runs.append(1))
    assert runs == [] and store.get("fn#order-2") is None  # withdrawn
    assert cycle.run(Invocation(LONG), "fn#order-2", lambda: runs.append(1) or "placed").value == "placed"
    assert runs == [1]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_page_in_answer_to_the_table_check_leaves_the_table_unverified(
        kind: str, damaging: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, store = _cycle(kind, damaging, table_name, monkeypatch)
    damaging.script("GetItem", NOT_JSON)
    store.verify()
    assert store._unverified  # checked again before the first claim, which then runs on a verified table
    now = time.time()
    assert store.claim("fn#order-3", "me", now, int(now * 1000) + LONG, int(now) + 3600) is None
