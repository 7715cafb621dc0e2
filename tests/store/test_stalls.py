"""A stalled connection (a request read and never answered, or answered with one byte and then silence) costs
one read timeout, on every call kind and every transport, with or without a deadline: the stalled connection
is dropped, the next attempt takes a fresh one and lands. Before, the fast path's reads waited for all the
time a call with a deadline had left, so a completion stalled once held its invocation to the deadline and
left the record in progress, for a later copy to run the handler again (issue 20). On DynamoDB Local,
behind a proxy that stalls the scripted request and stamps when each one arrives."""

from __future__ import annotations

import sys
import time
from typing import Any
from urllib.parse import urlparse

import pytest

from idempotency_layer import codec
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb import Deadline
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED
from tests.conftest import TRANSPORTS, build_transport
from tests.store import test_metrics_counts as _metrics_tests
from tests.support.fault_proxy import FORWARDED, STALL, STALL_AFTER_BYTE, FaultProxy

build = _metrics_tests.build  # the fixture: functions built from settings (here: the interceptor imported)

READ_TIMEOUT = 0.5
# The next attempt follows the read timeout after at most the first retry's backoff (transient errors: up to
# 50 ms in standard mode) and the scheduling of a loaded machine.
SLACK = 0.75
LONG_DEADLINE_S = 20.0  # far more than the read timeout: the bug let a stalled read wait for all of it


@pytest.fixture
def stalling(dynamodb: Any) -> Any:
    upstream = urlparse(dynamodb.endpoint)
    with FaultProxy(upstream.hostname, upstream.port) as proxy:
        yield proxy


def _store(kind: str, proxy: FaultProxy, table: str, monkeypatch: pytest.MonkeyPatch) -> DynamoDBStore:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    transport = build_transport(kind, connect_timeout=2, read_timeout=READ_TIMEOUT, max_attempts=3)
    return DynamoDBStore(transport, table, Attributes(), key_prefix="fn")


def _claim(store: DynamoDBStore, key: str, owner: str) -> Any:
    now = time.time()
    return store.claim(key, owner, now, int(now * 1000) + 60_000, int(now) + 3600)


def _deadline() -> Deadline:
    return Deadline.after(LONG_DEADLINE_S)


# Each call kind the layer makes, as (operation on the wire, what to do first, the call, its expected answer).
def _claim_call(store: DynamoDBStore, key: str) -> Any:
    record = _claim(store, key, "me")
    return record is None or record.owner == "me"  # ours, or our own write that landed before its stall


def _complete_call(store: DynamoDBStore, key: str) -> Any:
    _claim(store, key, "me")
    return store.complete(key, "me", codec.Encoded(codec.JSON, '{"ok":true}'), int(time.time()) + 3600, _deadline())


def _release_call(store: DynamoDBStore, key: str) -> Any:  # the release after a handler raised
    _claim(store, key, "me")
    return store.release(key, "me", _deadline())


def _withdraw_call(store: DynamoDBStore, key: str) -> Any:  # a claim withdrawn: a release with no claim to see
    return store.release(key, "me", _deadline())


def _poll_call(store: DynamoDBStore, key: str) -> Any:  # a wait's poll: a consistent read with a deadline
    _claim(store, key, "me")
    return store.get(key, _deadline()).owner


def _check_call(store: DynamoDBStore, key: str) -> Any:  # the table check at init: no deadline
    store.verify()
    return store._unverified


CALLS = {
    "claim": ("PutItem", _claim_call, True),
    "complete": ("UpdateItem", _complete_call, True),
    "release": ("DeleteItem", _release_call, True),
    "withdraw": ("DeleteItem", _withdraw_call, True),
    "poll": ("GetItem", _poll_call, "me"),
    "init-check": ("GetItem", _check_call, None),  # None: checked, no reason left unverified
}


@pytest.mark.parametrize("stall", [STALL, STALL_AFTER_BYTE])
@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_stalled_attempt_costs_one_read_timeout_and_the_next_lands(
        kind: str, call: str, stall: str, stalling: FaultProxy, table_name: str, layer_env: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    operation, run, expected = CALLS[call]
    store = _store(kind, stalling, table_name, monkeypatch)
    key = f"fn#stall-{call}"
    store.verify()  # a kept-alive connection first, so the stall is on a connection the pool reuses
    stalling.script(operation, stall)
    seen = len(stalling.arrivals)
    assert run(store, key) == expected
    mine = [(at, treatment) for at, op, treatment in stalling.arrivals[seen:] if op == operation]
    assert [treatment for _, treatment in mine] == [stall, FORWARDED], mine
    gap = mine[1][0] - mine[0][0]
    # The figure the issue asks for: from the stall to the next attempt, one read timeout.
    assert READ_TIMEOUT - 0.05 <= gap <= READ_TIMEOUT + SLACK, f"{gap:.3f} s from the stall to the next attempt"


@pytest.mark.parametrize("stall", [STALL, STALL_AFTER_BYTE])
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_completion_after_a_stalled_attempt_lands_and_a_later_copy_replays(
        kind: str, stall: str, stalling: FaultProxy, table_name: str, layer_env: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(kind, stalling, table_name, monkeypatch)
    cycle = Cycle(store, ttl_seconds=3600)
    runs: list[int] = []
    store.verify()
    stalling.script("UpdateItem", stall)
    started = time.monotonic()
    first = cycle.run(Invocation(8_000), "fn#order-1", lambda: runs.append(1) or {"placed": True})
    took = time.monotonic() - started
    assert first == ({"placed": True}, False)
    assert store.get("fn#order-1").status == COMPLETED
    # Not held to the deadline (8 s less the return margin): one read timeout, then the write.
    assert took < 8.0 - 1.0, f"the completion took {took:.2f} s"
    again = cycle.run(Invocation(8_000), "fn#order-1", lambda: runs.append(1))
    assert again == ({"placed": True}, True) and runs == [1]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_table_that_stalls_at_init_costs_init_the_check_bound_not_every_attempt(
        kind: str, stalling: FaultProxy, table_name: str, layer_env: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, build: Any) -> None:
    # Attempts of a read timeout each held init 9 s of Lambda's 10 by default (the fourth hostile review's cold
    # start timed out); the check gives up at INIT_CHECK_S and the first claim checks again, within its deadline.
    from idempotency_layer import config as _config

    build()  # the interceptor module, imported under settings of its own
    interceptor = sys.modules["idempotency_layer.interceptor"]
    INIT_CHECK_S = interceptor.INIT_CHECK_S
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", stalling.endpoint)
    transport = build_transport(kind, connect_timeout=2, read_timeout=6, max_attempts=3)
    stalling.script("GetItem", STALL)
    settings = _config.load({"IDEMPOTENCY_TABLE": table_name, "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
                             "AWS_LAMBDA_FUNCTION_NAME": "fn", "IDEMPOTENCY_KEY_JMESPATH": "orderId"})
    runs: list[Any] = []
    started = time.monotonic()
    handler = interceptor.build(settings, lambda event, context: runs.append(event) or "placed", transport=transport)
    took = time.monotonic() - started
    assert took < INIT_CHECK_S + 1.5, f"init's table check took {took:.2f} s"  # unbounded: 6 s, then an answer
    assert "checked again before the first claim" in caplog.text

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 10_000

    assert handler({"orderId": "o-init"}, Context()) == "placed"
    assert handler({"orderId": "o-init"}, Context()) == "placed" and len(runs) == 1
