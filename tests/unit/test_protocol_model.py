"""The layer, explored exhaustively in memory (tools/model.py): the real executor, cycle and store over DynamoDB's
semantics, every interleaving of two or three invocations of a whole event or a batch (SQS, FIFO, duplicate keys,
Kinesis, Kafka), with refused requests, lost replies, requests landing after their caller gave up, handler failures,
crashes, deadlines, clock jumps and skew, waits, the in-progress floor, TTL expiry, local caches and purges. Each
search's history count is deterministic, so a change that shrinks the search shows here; and each invariant is
shown to fail on a layer broken the way it guards against. Durable executions (IDEMPOTENCY_DURABLE=execution)
too: an execution's claim held across its invocations, its envelope replayed to a later invocation and to another
execution of the same input, completions and releases that do not land."""

from __future__ import annotations

import contextlib

import pytest

from idempotency_layer import cycle, executor, keeping, precheck
from idempotency_layer.cycle import CLAIM_MARGIN_MS, Claimed, Found
from idempotency_layer.errors import IdempotencyAlreadyInProgressError, IdempotencyPersistenceLayerError
from idempotency_layer.sources import batch, durable
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.support.memory_dynamodb import MemoryDynamoDB
from tools.model import CI, Bounds, Violation, explore, search, walk

pytestmark = pytest.mark.slow

EXPECTED = {
    "two copies, a fault, a crash": 3532,
    "a clock 0.9 s ahead (inside the margin)": 3524,
    "three copies, two environments, local caches": 4418,
    "purges across environments' caches": 5600,
    "cache and TTL expiry, skewed clocks": 4084,
    "a late copy after TTL expiry": 674,
    "a request landing after its caller gave up": 8826,
    "waits and their polls": 9036,
    "the in-progress floor": 438,
    "backoffs near the deadline": 1502,
    "sqs batches, one record": 2944,
    "kinesis batches, one record": 2944,
    "kafka batches, one record": 2944,
    # random walks: distinct histories of 1500
    "sqs batches": 1018,
    "fifo batches": 1031,
    "dup batches": 469,
    "kinesis batches": 888,
    "kafka batches": 1149,
    # durable executions
    "durable: one execution's invocations, a fault, a crash, an outage": 1671,
    "durable: one execution's request landing late, an outage": 1569,
    "durable: two executions of one input, a crash, a clock jump": 5780,
    "durable: two executions of one input, a fault, an outage": 2832,
    "durable: two executions, the lease's end, skewed clocks": 1206,
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
    monkeypatch.setattr(keeping.Keeper, "decode", lambda self, key, result, results=None, deadline=None: "stale")
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
        cache = self.keeper.cache
        entry = None if cache is None else cache.get(key, self.clock())
        return None if entry is None else entry[0]

    monkeypatch.setattr(cycle.Cycle, "cached", cached)
    with pytest.raises(Violation, match="purged before it last read the table"):
        explore(Bounds(invocations=2, faults=0, crashes=0, advances=0, environments=1, cache=True, purges=1))


def test_the_search_finds_a_claim_that_may_have_landed_and_is_never_withdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle.Cycle, "_withdraw", lambda self, inv, key, owner: None)
    with pytest.raises(Violation, match="left its claim behind"):
        explore(Bounds(invocations=1, faults=1, crashes=0, advances=0))


def test_the_search_finds_a_pre_check_that_takes_a_live_claim_for_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precheck, "COMPLETED", "INPROGRESS")
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
    monkeypatch.setattr(precheck, "COMPLETED", "INPROGRESS")
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


# --- durable executions: each invariant fails on a layer broken the way it guards against -------------------------

def _durable(**bounds) -> Bounds:
    return Bounds(kind="durable", **{"faults": 0, "crashes": 0, "advances": 0, **bounds})


def test_the_search_finds_a_lease_of_the_invocation_not_the_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    # IDEMPOTENCY_IN_PROGRESS_SECONDS ignored: the claim ends with the invocation, and during the execution's wait
    # another execution of the same input takes the key and runs the step again.
    init = cycle.Cycle.__init__

    def short(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.min_claim_ms = 0

    monkeypatch.setattr(cycle.Cycle, "__init__", short)
    with pytest.raises(Violation, match=r"execution 1 ran the workflow's step .* after execution 0 ran it .*held"):
        explore(_durable(invocations=2, advances=1))


def test_the_search_finds_an_execution_that_takes_another_ones_claim_for_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    claim = cycle.Cycle.claim

    def mistaken(self, inv, key, fingerprint=None, remaining_ms=None, owner=None):
        try:
            return claim(self, inv, key, fingerprint, remaining_ms, owner)
        except IdempotencyAlreadyInProgressError:
            if owner is None:
                raise
            return Claimed(owner, True)

    monkeypatch.setattr(cycle.Cycle, "claim", mistaken)
    with pytest.raises(Violation, match="execution 1 ran its workflow without holding key"):
        explore(_durable(invocations=2))


def test_the_search_finds_a_workflow_run_on_a_lease_that_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    # A claim lasting the invocation only, and an owner that takes its own expired claim for held without claiming
    # it again: its next invocation runs on a lease any other execution could take.
    init = cycle.Cycle.__init__

    def short(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.min_claim_ms = 0

    monkeypatch.setattr(cycle.Cycle, "__init__", short)
    _patched_store(monkeypatch, lambda store: setattr(store, "_claim_condition", "attribute_not_exists(#k) OR "
                                                      "#e < :now OR (#s = :inprogress AND #u < :now_ms AND #u < :now)"))
    with pytest.raises(Violation, match=r"execution 0 ran its workflow after its lease on key .* ended"):
        explore(_durable(invocations=1, advances=1))


def test_the_search_finds_an_owner_refused_as_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    # The claim made with a token of its own invocation, not the execution's ARN: its next invocation is refused.
    take = cycle.Cycle.take
    monkeypatch.setattr(cycle.Cycle, "take", lambda self, inv, key, fingerprint=None, owner=None:
                        take(self, inv, key, fingerprint, None))
    with pytest.raises(Violation, match="refused as in progress, but no other execution held a live claim"):
        explore(_durable(invocations=1))


def _answers_though_the_write_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    settle = executor.Executor._settle

    def careless(self, *args, **kwargs) -> None:
        with contextlib.suppress(IdempotencyPersistenceLayerError):  # the answer passed on: the execution ends
            settle(self, *args, **kwargs)

    monkeypatch.setattr(executor.Executor, "_settle", careless)


def test_the_search_finds_a_success_answered_though_its_completion_did_not_land(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _answers_though_the_write_failed(monkeypatch)
    with pytest.raises(Violation, match="answered SUCCEEDED, but its completion had not landed"):
        explore(_durable(invocations=1, outages=1))


def test_the_search_finds_a_failure_answered_though_its_release_did_not_land(monkeypatch: pytest.MonkeyPatch) -> None:
    # A release that did not land taken for one that did: the execution's FAILED answer passed on, its lease left.
    release = cycle.Cycle.release
    monkeypatch.setattr(cycle.Cycle, "release", lambda self, inv, key, owner: release(self, inv, key, owner) or True)
    with pytest.raises(Violation, match="answered FAILED and left its lease behind"):
        explore(_durable(invocations=1, faults=1, outages=1))


def test_the_search_finds_an_answer_that_is_not_the_workflows(monkeypatch: pytest.MonkeyPatch) -> None:
    settle = executor.Executor._settle

    def altered(self, inv, key, owner, answer, results, *rest) -> None:
        settle(self, inv, key, owner, answer, results, *rest)
        if answer.get("Status") == durable.SUCCEEDED:
            answer["Result"] = '"other"'

    monkeypatch.setattr(executor.Executor, "_settle", altered)
    with pytest.raises(Violation, match=r"answered .*\"other\".*, its workflow answered"):
        explore(_durable(invocations=1))


def test_the_search_finds_an_owner_answered_its_own_result_without_running(monkeypatch: pytest.MonkeyPatch) -> None:
    # The owner's own completed record not taken for its own: invoked again after its completion landed unheard
    # (its environment died), the execution is answered from the record instead of running.
    claim = cycle.Cycle.claim

    def stranger(self, inv, key, fingerprint=None, remaining_ms=None, owner=None):
        claimed = claim(self, inv, key, fingerprint, remaining_ms, owner)
        if isinstance(claimed, Found) and claimed.record.owner == owner:
            return Found(claimed.record._replace(owner="someone else"))
        return claimed

    monkeypatch.setattr(cycle.Cycle, "claim", stranger)
    with pytest.raises(Violation, match="was answered its own execution's result without running"):
        explore(_durable(invocations=1, crashes=1))


def test_the_search_finds_a_duplicate_execution_replayed_something_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "_result_text", lambda key, value: '"stale"')
    with pytest.raises(Violation, match="replayed '\"stale\"', which no completion of its key stored"):
        explore(_durable(invocations=2))


def test_the_search_finds_a_duplicate_refused_in_a_shape_the_sdk_does_not_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable, "failed", lambda error: {
        "Status": durable.FAILED, "Error": {"ErrorMessage": str(error), "ErrorType": type(error).__name__}})
    with pytest.raises(Violation, match=r"a duplicate, answered FAILED with .*'IdempotencyAlreadyInProgressError'"):
        explore(_durable(invocations=2))


def test_the_search_finds_a_duplicate_replayed_in_a_shape_the_sdk_does_not_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable, "succeeded", lambda result: {"Status": durable.SUCCEEDED, "Result": result,
                                                              "Error": None})
    with pytest.raises(Violation, match="a duplicate, answered \\{'Status': 'SUCCEEDED'"):
        explore(_durable(invocations=2))


def test_the_search_finds_a_lease_that_outlives_the_execution_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("idempotency_layer.cycle.CLAIM_MARGIN_MS", 5_000)  # the model still expects 1 s
    with pytest.raises(Violation, match="lease outlives IDEMPOTENCY_IN_PROGRESS_SECONDS"):
        explore(_durable(invocations=1, crashes=1, attempts=1))  # an execution that ends without its answer
