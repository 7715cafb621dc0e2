"""The layer, explored exhaustively in memory (tools/model.py): the real executor, cycle and store over DynamoDB's
semantics, every interleaving of two or three invocations of a whole event or a batch (SQS, FIFO, duplicate keys,
Kinesis, Kafka), with refused requests, lost replies, requests landing after their caller gave up, handler failures,
crashes, deadlines, clock jumps and skew, waits, the in-progress floor, TTL expiry, local caches and purges. Each
search's history count is deterministic, so a change that shrinks the search shows here; and each invariant is
shown to fail on a layer broken the way it guards against."""

from __future__ import annotations

import pytest

from idempotency_layer import cycle
from idempotency_layer.cycle import CLAIM_MARGIN_MS
from idempotency_layer.sources import batch
from idempotency_layer.store import DynamoDBStore
from tests.support.memory_dynamodb import MemoryDynamoDB
from tools.model import CI, Bounds, Violation, explore, search, walk

pytestmark = pytest.mark.slow

EXPECTED = {
    "two copies, a fault, a crash": 3546,
    "a clock 0.9 s ahead (inside the margin)": 3520,
    "three copies, two environments, local caches": 4620,
    "purges across environments' caches": 5600,
    "cache and TTL expiry, skewed clocks": 4084,
    "a late copy after TTL expiry": 653,
    "a request landing after its caller gave up": 8888,
    "waits and their polls": 9036,
    "the in-progress floor": 442,
    "backoffs near the deadline": 1502,
    "sqs batches, one record": 2952,
    "kinesis batches, one record": 2952,
    "kafka batches, one record": 2952,
    # random walks: distinct histories of 1500
    "sqs batches": 1015,
    "fifo batches": 1021,
    "dup batches": 483,
    "kinesis batches": 891,
    "kafka batches": 1119,
}


def test_every_search_of_the_slice_has_its_count() -> None:
    assert set(EXPECTED) == set(CI)


@pytest.mark.parametrize("name", CI)
def test_no_history_breaks_an_invariant(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    bounds, walks = CI[name]
    count = search(bounds, walks)
    with capsys.disabled():
        print(f"\n  model check, {name}: {count} histories, no invariant broken")
    assert count == EXPECTED[name]


# --- each invariant fails on a layer broken the way it guards against ----------------------------------------------

def test_a_clock_ahead_by_more_than_the_margin_runs_the_handler_twice() -> None:
    # The documented bound, found by the search: past the margin, a copy takes over a live claim.
    skew = CLAIM_MARGIN_MS / 1000 + 0.01
    with pytest.raises(Violation, match="ran again"):
        explore(Bounds(invocations=2, faults=1, crashes=1, advances=2, skew_s=(0.0, skew)))


def _patched_store(monkeypatch: pytest.MonkeyPatch, change) -> None:
    original = DynamoDBStore.__init__

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        change(self)

    monkeypatch.setattr(DynamoDBStore, "__init__", init)


def test_the_search_finds_a_claim_that_ignores_live_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    def careless(store: DynamoDBStore) -> None:
        store._claim_condition = "attribute_not_exists(#k) OR #e < :now OR (#s = :inprogress AND #u > :now_ms)"

    _patched_store(monkeypatch, careless)
    with pytest.raises(Violation, match="ran again"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0))


def test_the_search_finds_a_completion_without_the_owner_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    original = DynamoDBStore._call

    def unfenced(self, operation, key, params, deadline=None):
        if operation == "UpdateItem":
            params = dict(params, ConditionExpression="attribute_exists(#s)")
        return original(self, operation, key, params, deadline)

    monkeypatch.setattr(DynamoDBStore, "_call", unfenced)
    with pytest.raises(Violation, match="not conditioned on the owner"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0))


def test_the_search_finds_a_claim_without_the_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("idempotency_layer.cycle.CLAIM_MARGIN_MS", 0)
    monkeypatch.setattr("tools.model.CLAIM_MARGIN_MS", 0)
    with pytest.raises(Violation, match="ran again"):
        explore(Bounds(invocations=2, faults=1, crashes=1, advances=2, skew_s=(0.0, 0.5)))


def test_the_search_finds_a_replay_of_something_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle.Cycle, "decode", lambda self, key, result, results=None, deadline=None: "stale")
    with pytest.raises(Violation, match="replayed 'stale'"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0))


def test_the_search_finds_an_answer_that_is_not_the_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotency_layer import codec

    monkeypatch.setattr("idempotency_layer.results.ValueResults.encode",
                        lambda self, value: ("other", codec.encode(value)))
    with pytest.raises(Violation, match="answered 'other'"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0))


def test_the_search_finds_a_claim_that_outlives_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("idempotency_layer.cycle.CLAIM_MARGIN_MS", 5_000)  # the model still expects 1 s
    with pytest.raises(Violation, match="outlives its invocation's deadline"):
        explore(Bounds(invocations=2, faults=0, crashes=1, advances=0))


def test_the_search_finds_a_cache_that_outlives_a_purge(monkeypatch: pytest.MonkeyPatch) -> None:
    # The local cache as it was before purges reached it: a replay from memory without reading the record.
    def cached(self, inv, key, fingerprint=None, owner=None):
        entry = None if self.cache is None else self.cache.get(key, self.clock())
        return None if entry is None else entry[0]

    monkeypatch.setattr(cycle.Cycle, "cached", cached)
    with pytest.raises(Violation, match="purged before it last read the table"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0, environments=1, cache=True, purges=1))


def test_the_search_finds_a_claim_that_may_have_landed_and_is_never_withdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle.Cycle, "_withdraw", lambda self, inv, key, owner: None)
    with pytest.raises(Violation, match="left its claim behind"):
        explore(Bounds(invocations=1, faults=1, crashes=0, advances=0))


def test_the_search_finds_a_pre_check_that_takes_a_live_claim_for_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle, "COMPLETED", "INPROGRESS")
    with pytest.raises(Violation, match="it is lost"):
        explore(Bounds(invocations=2, faults=0, crashes=1, advances=1, kind="sqs"))


def test_the_search_finds_a_record_its_handler_failed_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "handler_failures", lambda *args, **kwargs: set())
    with pytest.raises(Violation, match="completed a key whose handler raised or reported its record failed"):
        explore(Bounds(invocations=1, faults=1, crashes=0, advances=0, kind="sqs"))


def test_the_search_finds_a_fifo_group_that_goes_on_past_a_busy_record(monkeypatch: pytest.MonkeyPatch) -> None:
    parse = batch.parse
    monkeypatch.setattr(batch, "parse", lambda *args, **kwargs: parse(*args, **kwargs)._replace(ordered=False))
    with pytest.raises(Violation, match="of a FIFO group: a later one was dropped"):
        explore(Bounds(invocations=2, faults=0, crashes=1, advances=1, kind="fifo"))


def test_random_walks_find_what_the_search_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle, "COMPLETED", "INPROGRESS")
    with pytest.raises(Violation, match="it is lost"):
        walk(Bounds(invocations=2, faults=1, crashes=1, advances=1, kind="sqs"), 1500)


# --- the in-memory table's own semantics (checked against DynamoDB Local in tests/store) -------------------

def test_memory_table_refuses_unused_expression_names_like_dynamodb() -> None:
    db = MemoryDynamoDB()
    with pytest.raises(Exception, match="unused"):
        db.apply("DeleteItem", {"Key": {"id": {"S": "k"}}, "ConditionExpression": "#o = :me",
                                "ExpressionAttributeNames": {"#o": "owner", "#x": "x"},
                                "ExpressionAttributeValues": {":me": {"S": "a"}}})


def test_memory_table_compares_numbers_as_numbers_and_missing_as_false() -> None:
    db = MemoryDynamoDB()
    db.apply("PutItem", {"Item": {"id": {"S": "k"}, "n": {"N": "9"}}})
    condition = {"ExpressionAttributeNames": {"#n": "n", "#m": "m"}, "ExpressionAttributeValues": {":v": {"N": "10"}}}
    db.apply("PutItem", {"Item": {"id": {"S": "k"}, "n": {"N": "11"}}, "ConditionExpression": "#n < :v OR #m < :v",
                         **condition})
    with pytest.raises(Exception, match="conditional request failed") as failed:
        db.apply("PutItem", {"Item": {"id": {"S": "k"}}, "ConditionExpression": "#n < :v OR #m < :v",
                             "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **condition})
    assert failed.value.item == {"id": {"S": "k"}, "n": {"N": "11"}}
