"""The record protocol, explored exhaustively in memory (tools/model.py): the real cycle and store over
DynamoDB's semantics, every interleaving of two or three invocations of one key, with refused requests, lost
replies, SDK retries, handler failures, crashes, deadlines and clock jumps. Each bound's history count is
deterministic, so a change that shrinks the search shows here."""

from __future__ import annotations

import pytest

from idempotency_layer.cycle import CLAIM_MARGIN_MS
from idempotency_layer.store import DynamoDBStore
from tests.support.memory_dynamodb import MemoryDynamoDB
from tools.model import Bounds, Violation, explore

pytestmark = pytest.mark.slow

SEARCHES = {
    # two copies racing, one fault and one crash anywhere, two clock jumps
    "two copies": (Bounds(invocations=2, faults=1, crashes=1, advances=2), 4112),
    # the same, one environment's clock 0.9 s ahead: inside the claim margin
    "skew inside the margin": (Bounds(invocations=2, faults=1, crashes=1, advances=2, skew_s=(0.0, 0.9)), 4020),
    # three copies, two environments (the third copy reuses the first's, with its local cache), a crash
    "three copies, cache": (Bounds(invocations=3, faults=0, crashes=1, advances=1, environments=2, cache=True),
                            3516),
    # three copies in three environments, a crash anywhere
    "three copies, a crash": (Bounds(invocations=3, faults=0, crashes=1, advances=0), 7020),
    # three copies in three environments, a clock jump anywhere
    "three copies, a clock jump": (Bounds(invocations=3, faults=0, crashes=0, advances=1), 2562),
}


@pytest.mark.parametrize("name", SEARCHES)
def test_no_history_breaks_an_invariant(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    bounds, expected = SEARCHES[name]
    count, _ = explore(bounds)
    with capsys.disabled():
        print(f"\n  model check, {name}: {count} histories explored, no invariant broken")
    assert count == expected


def test_a_clock_ahead_by_more_than_the_margin_runs_the_handler_twice() -> None:
    # The documented bound, found by the search: past the margin, a copy takes over a live claim.
    skew = CLAIM_MARGIN_MS / 1000 + 0.01
    with pytest.raises(Violation, match="the handler ran twice"):
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
    with pytest.raises(Violation, match="ran twice"):
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
    with pytest.raises(Violation, match="ran twice"):
        explore(Bounds(invocations=2, faults=1, crashes=1, advances=2, skew_s=(0.0, 0.5)))


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


def test_the_search_finds_a_replay_of_something_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("idempotency_layer.cycle.Cycle._decode", lambda self, key, result, results=None: "stale")
    with pytest.raises(Violation, match="replayed 'stale'"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0))


def test_the_search_finds_an_answer_that_is_not_the_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotency_layer import codec

    def wrong(self, value):
        return "other", codec.encode(value)

    monkeypatch.setattr("idempotency_layer.cycle.ValueResults.encode", wrong)
    with pytest.raises(Violation, match="answered 'other'"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0))


def test_the_search_finds_a_claim_that_outlives_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("idempotency_layer.cycle.CLAIM_MARGIN_MS", 5_000)  # the model still expects 1 s
    with pytest.raises(Violation, match="outlives its invocation's deadline"):
        explore(Bounds(invocations=2, faults=0, crashes=1, advances=0))
