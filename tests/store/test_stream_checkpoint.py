"""Kinesis and DynamoDB Streams: the handler's failures read as Lambda reads them, a checkpoint (issue 20).

Lambda retries a shard from the earliest record a partial batch response names, and every record after it.
AWS's documented stream handler processes records in order and, at its first failure, returns that record's
sequence number and stops: the records after it never ran. Under IDEMPOTENCY_STREAM_FAILURES=checkpoint (the
default) none of them may be completed, or the redelivery from the checkpoint drops them as done: lost.

`Shard` plays Lambda's event source mapping over one shard, on the real store (DynamoDB Local). Executions are
counted by the handlers' own side effects (lists of what they processed).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.cycle import Cycle
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import batch
from tests.store.test_batch import deliver, failed_ids, identifier, in_progress_elsewhere, payload
from tests.store.test_correctness import EXAMPLES
from tests.support import events
from tests.support.batches import BatchRunner

SOURCES = ["kinesis", "dynamodb"]
ORDER_KEY = "json_parse(base64_decode(kinesis.data)).order"  # Kinesis records keyed by the order they carry


def shard_records(source: str, marks: list[str], orders: list[str] | None = None) -> list[dict[str, Any]]:
    """One shard's records in order (increasing sequence numbers), each carrying its marker."""
    if source == "kinesis":
        stream = f"s-{uuid.uuid4().hex[:8]}"  # a stream of its own: eventIDs never meet another test's
        return [events.kinesis_record({"id": mark, **({"order": orders[i]} if orders else {})}, stream=stream)
                for i, mark in enumerate(marks)]
    return [events.dynamodb_record(mark) for mark in marks]


def marker(record: dict[str, Any], by_order: bool = False) -> str:
    body = payload(record)
    return body["order"] if by_order else body["id"]


class StopAtFirstFailure:
    """AWS's documented stream handler: records in order; at the first failure, return its sequence number and
    stop. A record listed in `fails` fails that many times before it succeeds; `raise_next` raises at once."""

    def __init__(self, fails: dict[str, int] | None = None, by_order: bool = False) -> None:
        self.fails = dict(fails or {})
        self.by_order = by_order
        self.done: list[str] = []  # the side effect: each record processed
        self.raise_next = 0  # calls left that raise before touching any record

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        if self.raise_next:
            self.raise_next -= 1
            raise RuntimeError("the handler failed")
        for record in event["Records"]:
            mark = marker(record, self.by_order)
            if self.fails.get(mark, 0) > 0:
                self.fails[mark] -= 1
                return {"batchItemFailures": [{"itemIdentifier": identifier(record)}]}
            self.done.append(mark)
        return {"batchItemFailures": []}


class ReportEveryFailure(StopAtFirstFailure):
    """A handler that goes on after a failure and reports exactly the records that failed."""

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        if self.raise_next:
            self.raise_next -= 1
            raise RuntimeError("the handler failed")
        failures = []
        for record in event["Records"]:
            mark = marker(record, self.by_order)
            if self.fails.get(mark, 0) > 0:
                self.fails[mark] -= 1
                failures.append({"itemIdentifier": identifier(record)})
            else:
                self.done.append(mark)
        return {"batchItemFailures": failures}


def key_of(run: BatchRunner, record: dict[str, Any]) -> str:
    parsed = batch.parse(events.stream_event([record]), False)
    assert parsed is not None
    key = batch.record_key(run.keys, parsed, 0)
    assert key is not None
    return key


def runner(store, handler, mode: str, expression: str | None = None) -> BatchRunner:
    return BatchRunner(Cycle(store, ttl_seconds=3600), KeyDeriver("fn", expression), False, handler, mode)


class Shard:
    """Lambda's event source mapping over one shard with ReportBatchItemFailures: a batch from the checkpoint;
    a partial batch response moves the checkpoint to the record with the lowest sequence number it names; a
    function error retries the batch, split in halves under BisectBatchOnFunctionError."""

    def __init__(self, run: BatchRunner, records: list[dict[str, Any]], bisect: bool = False) -> None:
        self.run, self.records, self.bisect = run, records, bisect
        self.position = 0  # the checkpoint: every record before it is done for Lambda

    def invoke(self, records: list[dict[str, Any]]) -> int:
        """Deliver `records`; how many of them, from the first, Lambda counts as done."""
        try:
            response = deliver(self.run, events.stream_event(records))
        except RuntimeError:
            if self.bisect and len(records) > 1:
                half = len(records) // 2
                done = self.invoke(records[:half])
                return done if done < half else half + self.invoke(records[half:])
            return 0
        reported = failed_ids(response)
        if not reported:
            return len(records)
        sent = [identifier(record) for record in records]
        return sent.index(min(reported, key=int))

    def step(self, size: int) -> None:
        self.position += self.invoke(self.records[self.position:self.position + size])


def marks_for(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]


@pytest.mark.parametrize("source", SOURCES)
def test_the_documented_stream_handler_loses_nothing_by_default_and_records_mode_completes_what_it_never_ran(
        store, source):
    for position in range(5):  # the failure at each position of a batch of five
        documented_handler_fails_at(store, source, position)


def documented_handler_fails_at(store, source: str, position: int) -> None:
    marks = marks_for(f"p{position}", 5)
    handler = StopAtFirstFailure({marks[position]: 1})
    shard = Shard(runner(store, handler, "checkpoint"), shard_records(source, marks))
    response = deliver(shard.run, events.stream_event(shard.records))
    # The checkpoint and every record after it are reported, so each released record is named.
    assert failed_ids(response) == [identifier(r) for r in shard.records[position:]]
    assert handler.done == marks[:position]
    assert all(store.get(key_of(shard.run, r)) is None for r in shard.records[position:])  # released
    assert all(store.get(key_of(shard.run, r)).status == "COMPLETED" for r in shard.records[:position])
    shard.position = position  # Lambda retries from the checkpoint
    shard.step(5)
    assert shard.position == 5
    deliver(shard.run, events.stream_event(shard.records))  # at least once: the whole batch again
    assert sorted(handler.done) == sorted(marks)  # each once: none lost, none twice

    # records: every record not reported completes, as for SQS; this handler's unreached ones are then lost.
    marks = marks_for(f"r{position}", 5)
    handler = StopAtFirstFailure({marks[position]: 1})
    shard = Shard(runner(store, handler, "records"), shard_records(source, marks))
    assert failed_ids(deliver(shard.run, events.stream_event(shard.records))) == [identifier(shard.records[position])]
    shard.position = position
    shard.step(5)
    assert handler.done == marks[:position] + marks[position:position + 1]


@pytest.mark.parametrize("source", SOURCES)
def test_a_handler_that_reports_every_failure_runs_each_record_once_in_records_mode_at_least_once_by_default(
        store, source):
    for mode, again in (("records", 0), ("checkpoint", 1)):
        marks = marks_for(mode, 5)
        handler = ReportEveryFailure({marks[1]: 1, marks[3]: 1})
        shard = Shard(runner(store, handler, mode), shard_records(source, marks))
        response = deliver(shard.run, events.stream_event(shard.records))
        if mode == "records":
            assert failed_ids(response) == [identifier(shard.records[i]) for i in (1, 3)]
        else:
            assert failed_ids(response) == [identifier(r) for r in shard.records[1:]]
        shard.position = 1
        shard.step(5)
        assert shard.position == 5
        # Nothing is lost either way; from the checkpoint on, the default runs what succeeded after it again.
        assert [handler.done.count(m) for m in marks] == [1, 1, 1 + again, 1, 1 + again]


@pytest.mark.parametrize("source", SOURCES)
def test_after_the_handler_raised_a_bisected_redelivery_runs_each_record_once(store, source):
    """BisectBatchOnFunctionError: the failed batch comes back in halves; a partial failure in the first half
    is a checkpoint within it, and Lambda goes on from there. Each mode with the handler it is for."""
    for mode, style in (("checkpoint", StopAtFirstFailure), ("records", ReportEveryFailure)):
        bisected_after_raising(store, source, mode, style)


def bisected_after_raising(store, source: str, mode: str, style: type[StopAtFirstFailure]) -> None:
    marks = marks_for("bisect", 6)
    handler = style({marks[1]: 1})
    handler.raise_next = 1
    shard = Shard(runner(store, handler, mode), shard_records(source, marks), bisect=True)
    with pytest.raises(RuntimeError):
        deliver(shard.run, events.stream_event(shard.records))
    assert handler.done == [] and all(store.get(key_of(shard.run, r)) is None for r in shard.records)
    handler.raise_next = 1
    shard.step(6)  # raises: halves [0:3] then, as it stops at record 1, no more
    assert shard.position == 1
    if mode == "checkpoint":
        assert handler.done == marks[:1]
        assert store.get(key_of(shard.run, shard.records[2])) is None  # never ran: not completed
    else:
        assert handler.done == [marks[0], marks[2]]  # it went on past the failure: record 2 is done
    shard.step(6)
    assert shard.position == 6
    assert sorted(handler.done) == sorted(marks)


def test_a_record_the_handler_names_that_was_done_already_is_the_checkpoint(store):
    marks = marks_for("named-done", 4)
    records = shard_records("kinesis", marks)
    run = runner(store, StopAtFirstFailure(), "checkpoint")
    deliver(run, events.stream_event(records[1:2]))  # record 1 is done
    given: list[str] = []

    def handler(event: dict[str, Any], context: Any) -> Any:
        given.extend(marker(r) for r in event["Records"])
        return {"batchItemFailures": [{"itemIdentifier": identifier(records[1])}]}  # not a record it was given

    run = runner(store, handler, "checkpoint")
    response = deliver(run, events.stream_event(records))
    assert given == [marks[0], marks[2], marks[3]]
    # Lambda retries from record 1, in the batch it sent: records 2 and 3 come back, so they must run again.
    assert failed_ids(response) == [identifier(r) for r in records[1:]]
    assert store.get(key_of(run, records[0])).status == "COMPLETED"
    assert store.get(key_of(run, records[1])).status == "COMPLETED"
    assert store.get(key_of(run, records[2])) is None and store.get(key_of(run, records[3])) is None


def test_the_layers_own_stop_and_the_handlers_report_the_earlier_one_is_the_checkpoint(store):
    marks = marks_for("stop", 5)
    records = shard_records("dynamodb", marks)
    handler = StopAtFirstFailure({marks[1]: 1})
    run = runner(store, handler, "checkpoint")
    in_progress_elsewhere(store, key_of(run, records[3]))
    response = deliver(run, events.stream_event(records))
    assert failed_ids(response) == [identifier(r) for r in records[1:]]
    assert handler.done == marks[:1]
    assert store.get(key_of(run, records[2])) is None  # the handler stopped before it: released
    # An answer Lambda cannot read fails the whole batch: every record is released, whatever the mode.
    run.handler = lambda event, context: {"batchItemFailures": [{"itemIdentifier": "not-in-the-batch"}]}
    deliver(run, events.stream_event(records[1:3]))
    assert store.get(key_of(run, records[1])) is None and store.get(key_of(run, records[2])) is None


@pytest.mark.parametrize("failing", [0, 1])
def test_a_key_twice_in_a_shard_batch_runs_once_and_its_copy_follows_the_checkpoint(store, failing):
    orders = ["A", "B", "A", "C"]
    tag = uuid.uuid4().hex[:6]
    orders = [f"{order}-{tag}" for order in orders]
    records = shard_records("kinesis", marks_for("dup", 4), orders)
    handler = StopAtFirstFailure({orders[failing]: 1}, by_order=True)
    shard = Shard(runner(store, handler, "checkpoint", ORDER_KEY), records)
    response = deliver(shard.run, events.stream_event(records))
    assert failed_ids(response) == [identifier(r) for r in records[failing:]]
    assert handler.done == orders[:failing]
    shard.position = failing
    shard.step(4)
    assert shard.position == 4
    assert sorted(handler.done) == sorted(set(orders))  # A, B and C once each; A's copy never ran on its own


def test_a_stream_handlers_answer_is_a_checkpoint_and_an_sqs_queues_per_message_fifo_included(store):
    """The same answer (the first failure only, then stop) on a FIFO queue is read per message, as Lambda reads
    it there: the messages not named are deleted by Lambda, so the layer completes them as before."""
    queue = [events.json_message({"id": mark}, group="g") for mark in marks_for("fifo", 3)]
    handler = StopAtFirstFailure({json.loads(queue[0].body)["id"]: 1})
    run = runner(store, handler, "checkpoint")
    response = deliver(run, events.sqs_event(queue, events.queue_arn("orders", fifo=True)))
    assert failed_ids(response) == [queue[0].message_id]
    assert all(store.get(run.keys.key_of(m.message_id)).status == "COMPLETED" for m in queue[1:])
    records = shard_records("kinesis", marks_for("shard", 3))
    handler.fails = {marker(records[0]): 1}
    run = runner(store, handler, "checkpoint")
    assert failed_ids(deliver(run, events.stream_event(records))) == [identifier(r) for r in records]
    assert all(store.get(key_of(run, r)) is None for r in records)


# -- property: any failures, function errors (bisected or not) and redeliveries drain a shard, none lost --

STYLES = {  # handler, mode, whether each record runs exactly once (else: at least once)
    "stop-at-first/checkpoint": (StopAtFirstFailure, "checkpoint", True),
    "report-every/records": (ReportEveryFailure, "records", True),
    "report-every/checkpoint": (ReportEveryFailure, "checkpoint", False),
}


@settings(max_examples=max(6, EXAMPLES // 5), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), source=st.sampled_from(SOURCES), length=st.integers(1, 8), batch_size=st.integers(1, 6),
       style=st.sampled_from(sorted(STYLES)), bisect=st.booleans())
def test_any_failures_and_redeliveries_drain_a_shard_with_no_record_lost(
        store, data, source, length, batch_size, style, bisect):
    cls, mode, exactly_once = STYLES[style]
    marks = marks_for(f"prop{time.time_ns()}", length)
    orders = None
    if source == "kinesis" and data.draw(st.booleans(), label="a key twice"):
        orders = [f"o{data.draw(st.integers(0, length - 1))}-{marks[0]}" for _ in marks]
    units = orders or marks
    handler = cls({unit: data.draw(st.integers(0, 2)) for unit in units}, by_order=orders is not None)
    shard = Shard(runner(store, handler, mode, ORDER_KEY if orders else None), shard_records(source, marks, orders),
                  bisect)
    raises = replays = 0
    for _ in range(100):
        if shard.position >= length:
            break
        if raises < 3 and data.draw(st.booleans(), label="raise"):
            raises += 1
            handler.raise_next = 1
        shard.step(data.draw(st.integers(1, batch_size), label="batch"))
        if replays < 3 and data.draw(st.booleans(), label="replay"):
            # At least once: an earlier stretch of the shard delivered again (its answer not acted on).
            replays += 1
            start = data.draw(st.integers(0, shard.position), label="from")
            stretch = shard.records[start:start + data.draw(st.integers(1, batch_size), label="size")]
            if stretch:
                handler.raise_next = 0
                deliver(shard.run, events.stream_event(stretch))
    assert shard.position == length
    handler.raise_next = 0
    deliver(shard.run, events.stream_event(shard.records))  # the whole shard again: nothing left to run
    counts = [handler.done.count(unit) for unit in dict.fromkeys(units)]
    assert all(count >= 1 for count in counts)  # none lost
    if exactly_once:
        assert counts == [1] * len(counts)
