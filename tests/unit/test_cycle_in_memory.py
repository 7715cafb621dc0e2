"""The cycle over the in-memory table (tests/support/memory_dynamodb.py: DynamoDB's semantics, checked against
DynamoDB Local by tests/store/test_protocol_model_on_dynamodb.py): every outcome of `run` and of its steps, with the
requests each makes and the record each leaves, in milliseconds. The same protocol on DynamoDB Local: tests/store."""

from __future__ import annotations

import os
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Claimed, Cycle, Found
from idempotency_layer.errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyClaimConflictError,
    IdempotencyKeyError,
    IdempotencyPayloadMismatchError,
    IdempotencyPersistenceLayerError,
    IdempotencyResultTooLargeError,
    IdempotencyResultUndeliverableError,
)
from idempotency_layer.invocation import Invocation
from idempotency_layer.metrics import Tally
from idempotency_layer.results import Undeliverable, ValueResults
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED, INPROGRESS
from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport

KEY = "fn#order-1"
LONG = 60_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class World:
    """A table in memory, its transport (which counts requests), a store on it, and the handler's runs."""

    def __init__(self) -> None:
        self.db = MemoryDynamoDB()
        self.transport = MemoryTransport(self.db)
        self.store = DynamoDBStore(self.transport, "t", Attributes(), key_prefix="fn")
        self.clock = Clock()
        self.runs: list[Any] = []

    def cycle(self, **options: Any) -> Cycle:
        return Cycle(self.store, ttl_seconds=options.pop("ttl_seconds", 3600), clock=self.clock,
                     sleep=lambda seconds: None, **options)

    def handler(self, value: Any = "placed", error: BaseException | None = None) -> Any:
        def invoke() -> Any:
            self.runs.append(value)
            if error is not None:
                raise error
            return value
        return invoke

    def requests(self) -> list[str]:
        found, self.transport.requests[:] = list(self.transport.requests), []
        return found

    def record(self, key: str = KEY) -> dict | None:
        return self.db.item(key)


@pytest.fixture
def world() -> World:
    return World()


def test_a_first_run_claims_runs_and_completes_and_a_copy_replays(world):
    cycle, tally = world.cycle(), Tally()
    outcome = cycle.run(Invocation(LONG, tally), KEY, world.handler({"n": 1}))
    assert outcome == ({"n": 1}, False) and world.requests() == ["PutItem", "UpdateItem"]
    assert world.record()["status"] == {"S": COMPLETED}
    again = cycle.run(Invocation(LONG, tally), KEY, world.handler({"n": 2}))
    assert again == ({"n": 1}, True) and world.requests() == ["PutItem"] and world.runs == [{"n": 1}]
    assert tally.counts == {"FirstExecutions": 1, "Replays": 1} and tally.store_requests == 3


@pytest.mark.parametrize("value", [None, 0, "", [], {}, False])
def test_falsy_results_replay_as_themselves(world, value):
    cycle = world.cycle()
    assert cycle.run(Invocation(LONG), KEY, world.handler(value)).value == value
    assert cycle.run(Invocation(LONG), KEY, world.handler("other")) == (value, True)


def test_a_handler_that_raises_releases_and_its_retry_runs(world):
    cycle = world.cycle()
    with pytest.raises(ValueError):
        cycle.run(Invocation(LONG), KEY, world.handler(error=ValueError("declined")))
    assert world.requests() == ["PutItem", "DeleteItem"] and world.record() is None
    assert cycle.run(Invocation(LONG), KEY, world.handler("placed")) == ("placed", False)


def test_a_value_keep_refuses_is_released_and_one_that_cannot_be_sent_completed(world):
    cycle = world.cycle()
    assert cycle.run(Invocation(LONG), KEY, world.handler({"statusCode": 503}), keep=lambda v: False).value
    assert world.record() is None

    class Refusing(ValueResults):
        def encode(self, value: Any) -> Any:
            raise Undeliverable("datetime")

    assert cycle.run(Invocation(LONG), KEY, world.handler("x"), results=Refusing()) == ("x", False)
    assert world.record()["result_format"] == {"S": codec.UNDELIVERABLE}
    with pytest.raises(IdempotencyResultUndeliverableError, match="of type datetime"):
        cycle.run(Invocation(LONG), KEY, world.handler("again"), results=Refusing())
    assert len(world.runs) == 2  # the released 503, then the one that cannot be sent: never a third


def test_a_result_too_large_completes_and_copies_are_told_why(world):
    cycle = world.cycle()
    big = os.urandom(codec.ITEM_LIMIT).hex()  # incompressible: over the item limit however it is stored
    assert cycle.run(Invocation(LONG), KEY, world.handler(big)).value == big
    assert world.record()["result_format"] == {"S": codec.TOO_LARGE}
    with pytest.raises(IdempotencyResultTooLargeError):
        cycle.run(Invocation(LONG), KEY, world.handler("again"))
    assert len(world.runs) == 1


def test_a_live_claim_is_in_progress_and_another_payload_a_mismatch(world):
    holder = world.cycle()
    assert isinstance(holder.claim(Invocation(LONG), KEY, "a.tag"), Claimed)
    with pytest.raises(IdempotencyAlreadyInProgressError, match="its claim expires at"):
        world.cycle().run(Invocation(LONG), KEY, world.handler(), "a.tag")
    with pytest.raises(IdempotencyPayloadMismatchError):
        world.cycle().run(Invocation(LONG), KEY, world.handler(), "b.tag")
    assert world.runs == []


def test_a_claim_past_its_deadline_and_margin_is_taken_over_and_the_late_completion_is_refused(world):
    first = world.cycle()
    claimed = first.claim(Invocation(1_000), KEY)
    assert isinstance(claimed, Claimed)
    world.clock.now += 2.1  # the 1 s invocation and the 1 s margin are over
    assert world.cycle().run(Invocation(LONG), KEY, world.handler("second")) == ("second", False)
    first.complete(Invocation(LONG), KEY, claimed.owner, codec.encode("first"))  # refused: not ours any more
    assert world.record()["owner"] != {"S": claimed.owner}


def test_a_table_that_sees_live_what_this_clock_sees_expired_is_a_claim_conflict(world):
    class Stale(DynamoDBStore):
        def claim(self, key, owner, now, in_progress_until, expires_at, fingerprint=None, deadline=None):
            from idempotency_layer.stores.protocol import Record

            return Record(key, INPROGRESS, int(now) - 10, int(now * 1000) - 10_000, "other", None)

    cycle = Cycle(Stale(world.transport, "t", Attributes(), key_prefix="fn"), ttl_seconds=60, clock=world.clock)
    with pytest.raises(IdempotencyClaimConflictError):
        cycle.run(Invocation(LONG), KEY, world.handler())


def test_a_batch_records_completion_is_done_and_a_whole_event_with_its_key_cannot_replay(world):
    cycle = world.cycle()
    claimed = cycle.claim(Invocation(LONG), KEY)
    cycle.complete(Invocation(LONG), KEY, claimed.owner, codec.Encoded(codec.DONE, None))
    assert isinstance(cycle.claim(Invocation(LONG), KEY), Found)
    with pytest.raises(IdempotencyKeyError, match="completed as a batch record"):
        cycle.run(Invocation(LONG), KEY, world.handler())


def test_the_local_cache_replays_after_one_read_and_a_purge_reaches_it(world):
    warm, tally = world.cycle(cache_size=4), Tally()
    warm.run(Invocation(LONG), KEY, world.handler({"v": 1}))
    world.requests()
    assert warm.run(Invocation(LONG, tally), KEY, world.handler()) == ({"v": 1}, True)
    assert world.requests() == ["GetItem"] and tally.counts == {"LocalCacheReplays": 1}
    record = world.store.get(KEY)
    assert world.store.purge(KEY, record.status, record.owner)
    assert warm.run(Invocation(LONG), KEY, world.handler({"v": 2})) == ({"v": 2}, False)


def test_a_wait_replays_what_completes_meanwhile_and_claims_what_is_released(world):
    holder = world.cycle()
    claimed = holder.claim(Invocation(LONG), KEY)
    polls = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 2:  # the first run completes while the copy waits
            holder.complete(Invocation(LONG), KEY, claimed.owner, codec.encode("first"))

    waiter = Cycle(world.store, ttl_seconds=3600, clock=world.clock, wait_seconds=5, sleep=sleep)
    tally = Tally()
    assert waiter.run(Invocation(LONG, tally), KEY, world.handler()) == ("first", True)
    assert tally.counts["Waits"] == 1 and tally.counts["WaitsReplayed"] == 1 and world.runs == []


def test_a_permanent_completion_failure_makes_the_environment_refuse_every_handler(world):
    class Denied(MemoryTransport):
        def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
            if operation == "UpdateItem":
                from idempotency_layer.stores.dynamodb import DynamoDBError

                raise DynamoDBError(operation, "AccessDeniedException", "no", status=400)
            return super().call(operation, params, deadline)

    cycle = Cycle(DynamoDBStore(Denied(world.db), "t", Attributes(),
                                key_prefix="fn"), ttl_seconds=60, clock=world.clock)
    assert cycle.run(Invocation(LONG), KEY, world.handler("done")).value == "done"
    assert cycle.environment.refusal is not None
    with pytest.raises(IdempotencyPersistenceLayerError, match="runs no more handlers"):
        cycle.run(Invocation(LONG), "fn#other", world.handler())
    assert world.runs == ["done"]


def test_the_precheck_reads_done_records_once_and_gives_up_for_good_on_a_denial(world, caplog):
    cycle = world.cycle()
    for key in ("fn#a", "fn#b"):
        claimed = cycle.claim(Invocation(LONG), key)
        cycle.complete(Invocation(LONG), key, claimed.owner, codec.Encoded(codec.DONE, None))
    world.requests()
    found = cycle.precheck(Invocation(LONG), {"fn#a": None, "fn#b": None, "fn#c": None}, redelivered=True)
    assert set(found) == {"fn#a", "fn#b"} and world.requests() == ["BatchGetItem"]
    assert cycle.precheck(Invocation(LONG), {"fn#a": None, "fn#b": None}, redelivered=False) == {}

    class Denied(MemoryTransport):
        def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
            from idempotency_layer.stores.dynamodb import DynamoDBError

            raise DynamoDBError(operation, "AccessDeniedException", "no", status=400)

    store = DynamoDBStore(Denied(world.db), "t", Attributes(), key_prefix="fn")
    denied = Cycle(store, ttl_seconds=60, precheck="always")
    assert denied.precheck(Invocation(LONG), {"fn#a": None, "fn#b": None}, redelivered=True) == {}
    assert denied.environment.precheck_denied
    # The grant is the store's to name (`read_grant`): the cycle names no backend.
    assert store.read_grant == "dynamodb:BatchGetItem on table 't'"
    caplog.clear()
    again = Cycle(store, ttl_seconds=60, precheck="always")
    assert again.precheck(Invocation(LONG), {"fn#a": None, "fn#b": None}, redelivered=True) == {}
    assert [r.getMessage() for r in caplog.records if "pre-checked" in r.getMessage()] == [
        "the function lacks dynamodb:BatchGetItem on table 't': batches are no longer pre-checked in this "
        "environment, each record is claimed (grant it to answer a redelivered batch in one request)"]



def test_a_result_too_large_is_cached_and_stored_without_what_it_carried() -> None:
    """codec.Oversized carries the packed result for the large-results bucket; with no bucket, neither the record
    nor the local cache keeps those bytes."""
    world = World()
    cycle = Cycle(world.store, ttl_seconds=3600, cache_size=4)
    cycle.run(Invocation(60_000), "fn#big", lambda: os.urandom(600 * 1024))
    (entry,) = cycle.keeper.cache._entries.values()
    assert not isinstance(entry[1], codec.Oversized) and entry[1] == codec.Encoded(codec.TOO_LARGE, None)
    assert world.store.get("fn#big").result == codec.Encoded(codec.TOO_LARGE, None)
