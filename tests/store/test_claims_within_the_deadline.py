"""Claims carry the invocation's deadline, and a batch's first store failure stops its claims not yet started
(issue 28, item 3): with a table that stops answering, a whole event and a batch of 60 each fail closed with the
store's error before the invocation's deadline, instead of running into the function's timeout (before, a batch's
claims went on 10 at a time after one had failed, each bounded by the client's timeouts only: 6 rounds of them).
On DynamoDB Local behind a proxy that reads every claim and never answers it."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.cycle import CLAIM_DEADLINE_MARGIN_MS, Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.executor import MAX_IN_FLIGHT
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import batch
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.conftest import TRANSPORTS, build_transport
from tests.support import events
from tests.support.batches import BatchRunner
from tests.support.fault_proxy import STALL, FaultProxy

READ_TIMEOUT = 20  # the client's bound on a stalled claim: far past the invocation's deadline
REMAINING_MS = 3_000
SLACK = 1.0  # the machine's scheduling, with the two cores shared


@pytest.fixture
def stalling(dynamodb: Any) -> Any:
    upstream = urlparse(dynamodb.endpoint)
    with FaultProxy(upstream.hostname, upstream.port) as proxy:
        yield proxy


def _cycle(kind: str, proxy: FaultProxy, table: str, monkeypatch: pytest.MonkeyPatch) -> Cycle:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    transport = build_transport(kind, connect_timeout=2, read_timeout=READ_TIMEOUT, max_attempts=1)
    return Cycle(DynamoDBStore(transport, table, Attributes(), key_prefix="fn"), ttl_seconds=3600)


def _puts(proxy: FaultProxy) -> int:
    return sum(1 for _, operation, _ in proxy.arrivals if operation == "PutItem")


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_claim_the_table_never_answers_fails_before_the_deadline(
        kind: str, stalling: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cycle = _cycle(kind, stalling, table_name, monkeypatch)
    stalling.script("PutItem", STALL)
    runs: list[int] = []
    started = time.monotonic()
    with pytest.raises(IdempotencyPersistenceLayerError):
        cycle.run(Invocation(REMAINING_MS), "fn#order-1", lambda: runs.append(1))
    took = time.monotonic() - started
    assert runs == [] and _puts(stalling) == 1
    # Bounded by the deadline less the claim's margin (2.5 s), not by the 20 s read timeout.
    assert took < (REMAINING_MS - CLAIM_DEADLINE_MARGIN_MS) / 1000 + SLACK, took


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_batch_whose_claims_the_table_never_answers_fails_closed_before_the_deadline(
        kind: str, stalling: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cycle = _cycle(kind, stalling, table_name, monkeypatch)
    stalling.script("PutItem", *[STALL] * 60)
    runs: list[Any] = []
    runner = BatchRunner(cycle, KeyDeriver("fn", None), False, lambda event, context: runs.append(event))
    event = events.sqs_event([events.Message(f'{{"id": "order-{i}"}}') for i in range(60)])
    started = time.monotonic()
    with pytest.raises(IdempotencyPersistenceLayerError):
        runner.run(batch.parse(event, False), event, None, REMAINING_MS)
    took = time.monotonic() - started
    assert runs == []
    # One round of concurrent claims failed; the other 50 were never sent.
    assert _puts(stalling) <= MAX_IN_FLIGHT, _puts(stalling)
    assert took < REMAINING_MS / 1000 + SLACK, took
