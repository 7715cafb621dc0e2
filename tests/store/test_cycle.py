"""The cycle (claim -> invoke -> complete or release, replay) against DynamoDB Local.

Executions are counted by the handlers' own side effect (a list the test reads); DynamoDB requests are
counted on the wire by a proxy in front of DynamoDB Local.
"""

import base64
import json
import os
import time
from decimal import Decimal

import pytest

from idempotency_layer import codec
from idempotency_layer.cycle import CLAIM_MARGIN_MS, Cycle
from idempotency_layer.errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyClaimConflictError,
    IdempotencyResultTooLargeError,
    IdempotencyResultUndeliverableError,
)
from idempotency_layer.invocation import Invocation
from idempotency_layer.results import Undeliverable, ValueResults
from idempotency_layer.stores.protocol import COMPLETED

KEY = "fn#k1"
LONG = 60_000


class Handler:
    """A handler whose executions the test counts itself."""

    def __init__(self, result=None, error=None):
        self.calls = []
        self.result = result
        self.error = error

    def __call__(self):
        self.calls.append(time.time())
        if self.error is not None:
            raise self.error
        return self.result


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


def test_first_run_executes_and_the_second_replays(store):
    cycle = Cycle(store, ttl_seconds=3600)
    handler = Handler({"order": "o-1", "n": 1})
    first = cycle.run(Invocation(LONG), KEY, handler)
    second = cycle.run(Invocation(LONG), KEY, handler)
    assert len(handler.calls) == 1
    assert first.value == second.value == {"order": "o-1", "n": 1}
    assert (first.replayed, second.replayed) == (False, True)


@pytest.mark.parametrize("result", [None, {}, [], 0, "", False, Decimal("0.10"), b"", b"\x01\x02"])
def test_falsy_and_typed_results_replay_as_themselves(store, result):
    cycle = Cycle(store, ttl_seconds=3600)
    handler = Handler(result)
    cycle.run(Invocation(LONG), KEY, handler)
    replay = cycle.run(Invocation(LONG), KEY, handler)
    assert len(handler.calls) == 1
    assert replay.replayed
    assert replay.value == result and type(replay.value) is type(result)


def test_handler_error_releases_and_the_retry_runs_again(store, ddb_client, table_name):
    cycle = Cycle(store, ttl_seconds=3600)
    failing = Handler(error=RuntimeError("card declined"))
    with pytest.raises(RuntimeError, match="card declined") as caught:
        cycle.run(Invocation(LONG), KEY, failing)
    assert caught.value is failing.error
    assert ddb_client.get_item(TableName=table_name, Key={"id": {"S": KEY}}, ConsistentRead=True).get("Item") is None
    retry = Handler("ok")
    assert cycle.run(Invocation(LONG), KEY, retry).value == "ok"
    assert len(failing.calls) == 1 and len(retry.calls) == 1


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3)])
def test_base_exceptions_release_too(store, error):
    cycle = Cycle(store, ttl_seconds=3600)
    with pytest.raises(type(error)):
        cycle.run(Invocation(LONG), KEY, Handler(error=error))
    assert store.get(KEY) is None


def test_live_claim_of_another_invocation_is_in_progress(store):
    now = time.time()
    assert store.claim(KEY, "other", now, int(now * 1000) + 30_000, int(now) + 3600) is None
    handler = Handler("x")
    with pytest.raises(IdempotencyAlreadyInProgressError) as caught:
        Cycle(store, ttl_seconds=3600).run(Invocation(LONG), KEY, handler)
    assert KEY in str(caught.value) and "expires at" in str(caught.value)
    assert handler.calls == []


def test_claim_lasts_the_remaining_time_plus_the_skew_margin(store):
    clock = Clock()
    cycle = Cycle(store, ttl_seconds=3600, clock=clock)
    seen = []
    claimed_at_ms = int(clock.now * 1000)

    def nested():
        # With no time left, our claim lasts only the margin; just before it ends it is still ours, just after
        # it another invocation may take it.
        assert store.get(KEY).in_progress_until == claimed_at_ms + CLAIM_MARGIN_MS
        clock.now += CLAIM_MARGIN_MS / 1000 - 0.002
        seen.append(store.claim(KEY, "early", clock.now, int(clock.now * 1000) + 1000, int(clock.now) + 3600))
        clock.now += 0.004
        seen.append(store.claim(KEY, "other", clock.now, int(clock.now * 1000) + 1000, int(clock.now) + 3600))
        return "late"

    assert cycle.run(Invocation(0), KEY, nested).value == "late"
    assert seen[0] is not None and seen[0].owner != "early"
    assert seen[1] is None
    record = store.get(KEY)
    assert record.owner == "other" and record.status != COMPLETED  # our completion did not overwrite theirs


class Refusing(ValueResults):
    def encode(self, value):
        raise Undeliverable("Thing")


def test_a_result_that_cannot_be_sent_is_completed_and_copies_are_told_why(store):
    cycle = Cycle(store, ttl_seconds=3600, results=Refusing())
    handler = Handler({"when": object()})
    outcome = cycle.run(Invocation(LONG), KEY, handler)
    assert outcome.value is handler.result  # handed back: the runtime reports its own error for it
    assert store.get(KEY).result == codec.Encoded(codec.UNDELIVERABLE, "Thing")
    with pytest.raises(IdempotencyResultUndeliverableError, match=r"\(of type Thing: Runtime.MarshalError\)"):
        cycle.run(Invocation(LONG), KEY, handler)
    assert len(handler.calls) == 1


def test_too_large_result_runs_once_and_replays_raise(store):
    cycle = Cycle(store, ttl_seconds=3600)
    big = {"noise": base64.b64encode(os.urandom(450_000)).decode()}  # random: compresses to over 400 KB
    handler = Handler(big)
    assert cycle.run(Invocation(LONG), KEY, handler).value is big
    with pytest.raises(IdempotencyResultTooLargeError, match="too large to store"):
        cycle.run(Invocation(LONG), KEY, handler)
    assert len(handler.calls) == 1
    assert store.get(KEY).result.format == codec.TOO_LARGE


def test_one_megabyte_result_that_compresses_replays_equal(store):
    cycle = Cycle(store, ttl_seconds=3600)
    value = {"rows": [{"id": i, "sku": f"SKU-{i:07d}", "qty": i % 5} for i in range(25_000)]}
    assert len(codec.to_json(value)[1]) > 1_000_000
    handler = Handler(value)
    cycle.run(Invocation(LONG), KEY, handler)
    assert cycle.run(Invocation(LONG), KEY, handler).value == value
    assert len(handler.calls) == 1


def test_ttl_expiry_runs_again(store):
    clock = Clock()
    cycle = Cycle(store, ttl_seconds=5, clock=clock)
    handler = Handler("v")
    cycle.run(Invocation(1000), KEY, handler)
    clock.now += 4
    assert cycle.run(Invocation(1000), KEY, handler).replayed
    clock.now += 2
    assert not cycle.run(Invocation(1000), KEY, handler).replayed
    assert len(handler.calls) == 2


def test_claim_never_expires_before_its_invocation_deadline(store):
    clock = Clock()
    Cycle(store, ttl_seconds=1, clock=clock).claim(Invocation(10_000), KEY)
    record = store.get(KEY)
    assert record.expires_at >= int(clock.now) + 10
    clock.now += 5
    with pytest.raises(IdempotencyAlreadyInProgressError):
        Cycle(store, ttl_seconds=1, clock=clock).run(Invocation(1000), KEY, Handler())


def test_taken_over_claim_still_returns_our_result(store):
    clock = Clock()
    cycle = Cycle(store, ttl_seconds=3600, clock=clock)

    def slow():
        clock.now += 1 + CLAIM_MARGIN_MS / 1000 + 1  # past our 1 s claim and its margin: another takes over
        assert store.claim(KEY, "other", clock.now, int(clock.now * 1000) + 60_000, int(clock.now) + 3600) is None
        return "ours"

    assert cycle.run(Invocation(1000), KEY, slow).value == "ours"
    record = store.get(KEY)
    assert record.owner == "other" and record.status != COMPLETED


def test_clock_skew_is_retried_a_bounded_number_of_times(store):
    now = time.time()
    assert store.claim(KEY, "other", now, int(now * 1000) + 60_000, int(now) + 3600) is None
    readings = []

    def skewed():
        # Claims are sent with a time the record is live at; checks read a clock far ahead.
        readings.append(1)
        return now if len(readings) % 2 else now + 7200

    handler = Handler()
    with pytest.raises(IdempotencyClaimConflictError, match="3 times"):
        Cycle(store, ttl_seconds=3600, clock=skewed).run(Invocation(LONG), KEY, handler)
    assert handler.calls == []
    assert len(readings) == 6


class Marshalling:
    """Stores the text and hands back ("text", ...) on both paths, as the runtime's results do."""

    def encode(self, value):
        text = json.dumps(value).encode()
        return ("text", text), codec.pack(codec.RESPONSE, text)

    def decode(self, encoded):
        return ("text", codec.unpack(encoded)[1])


def test_handed_back_form_is_the_same_on_both_paths(store):
    cycle = Cycle(store, ttl_seconds=3600, results=Marshalling())
    first = cycle.run(Invocation(LONG), KEY, Handler({"v": 1}))
    handler = Handler()
    again = cycle.run(Invocation(LONG), KEY, handler)
    assert first.value == again.value == ("text", b'{"v": 1}')
    assert (first.replayed, again.replayed) == (False, True)
    assert handler.calls == []


def test_local_cache_replays_after_one_read_and_never_outlives_the_record(store, proxy):
    clock = Clock()
    cycle = Cycle(store, ttl_seconds=10, cache_size=2, clock=clock)
    handler = Handler({"v": 1})
    cycle.run(Invocation(1000), KEY, handler)
    proxy.reset()
    assert cycle.run(Invocation(1000), KEY, handler) == ({"v": 1}, True)
    assert proxy.snapshot()[0] == {"GetItem": 1}  # the record is still the one cached: no claim, no result sent
    clock.now += 11
    assert cycle.run(Invocation(1000), KEY, handler).replayed is False
    assert len(handler.calls) == 2


def test_a_purge_reaches_a_warm_environments_cache(store, proxy):
    """Issue 28: an operator purged a key to have it run again; a warm environment replayed it from memory."""
    warm = Cycle(store, ttl_seconds=3600, cache_size=8)
    handler = Handler({"v": 1})
    assert warm.run(Invocation(LONG), KEY, handler).value == {"v": 1}
    record = store.get(KEY)
    assert store.purge(KEY, record.status, record.owner)  # what `idempotency-layer purge` does
    assert warm.run(Invocation(LONG), KEY, handler).replayed is False and len(handler.calls) == 2  # it runs again
    # Purged again and run by another environment with another result: the warm one replays that one, not its own.
    record = store.get(KEY)
    assert store.purge(KEY, record.status, record.owner)
    Cycle(store, ttl_seconds=3600).run(Invocation(LONG), KEY, Handler({"v": 2}))
    assert warm.run(Invocation(LONG), KEY, handler) == ({"v": 2}, True) and len(handler.calls) == 2
    assert warm.run(Invocation(LONG), KEY, handler) == ({"v": 2}, True)  # and from now on from its cache


def test_local_cache_evicts_least_recently_used(store, proxy):
    cycle = Cycle(store, ttl_seconds=3600, cache_size=2)
    for key in ("a", "b", "c"):
        cycle.run(Invocation(LONG), key, Handler(key))
    proxy.reset()
    assert cycle.run(Invocation(LONG), "c", Handler()).value == "c"
    assert cycle.run(Invocation(LONG), "b", Handler()).value == "b"
    assert proxy.snapshot()[0] == {"GetItem": 2}  # each confirmed by a read without the result
    assert cycle.run(Invocation(LONG), "a", Handler()).value == "a"  # evicted: replayed from the table
    assert proxy.snapshot()[0] == {"GetItem": 2, "PutItem": 1}


def test_requests_per_path(store, proxy):
    cycle = Cycle(store, ttl_seconds=3600)
    proxy.reset()
    cycle.run(Invocation(LONG), KEY, Handler("r"))
    assert proxy.snapshot()[0] == {"PutItem": 1, "UpdateItem": 1}  # first run: claim, complete
    proxy.reset()
    cycle.run(Invocation(LONG), KEY, Handler("r"))
    assert proxy.snapshot()[0] == {"PutItem": 1}  # replay: the failed claim carries the record
    proxy.reset()
    with pytest.raises(ValueError):
        cycle.run(Invocation(LONG), "fn#other", Handler(error=ValueError()))
    assert proxy.snapshot()[0] == {"PutItem": 1, "DeleteItem": 1}  # error: claim, release
