"""Batches from SQS, Kinesis, DynamoDB Streams, Kafka and Amazon MQ: each record runs once, with a partial batch
response where the source has one.

A redelivered batch is a new mix of records with new receipt handles, so no key of the whole event can
work: every record gets its own key (its delivery identity, or the key expression applied to it). All keys
are claimed before the handler runs, concurrently; the handler is called once with the records we claimed;
its answer (`batchItemFailures`) decides which records are completed and which are released to run again:
for SQS the records it names; for a stream (Kinesis, DynamoDB Streams) and each Kafka partition, by default, the
earliest one it names and every record after it, since Lambda retries the shard (the partition) from there.
Records keep no result: a completed record only means "done".

Each record has an ordering group: a shard or an SQS FIFO queue is one group (the whole batch), a Kafka batch has
one per topic-partition, SQS standard queues and Amazon MQ none. A record that cannot run stops its group only.
Kafka and Amazon MQ events are parsed by their own modules (`sources.kafka`, `sources.mq`), imported only for them.
"""

from __future__ import annotations

import logging
from collections import namedtuple
from collections.abc import Callable, Iterable

from .. import codec
from ..config import BATCH_RESPONSES, STREAM_FAILURES
from ..cycle import Cycle
from ..dynamodb import Deadline
from ..errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyBatchIncompleteError,
    IdempotencyKeyError,
    IdempotencyPayloadMismatchError,
)
from ..keys import BROKER_SOURCES, KeyDeriver, is_empty
from ..log import fields
from ..store import Record
from .redelivery import shows_redelivery

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

logger = logging.getLogger("idempotency_layer")

# At most this many requests in flight for one batch: the transport's pool keeps this many connections.
MAX_IN_FLIGHT = 10


class Source(namedtuple("Source", ("name", "identifier", "identity", "ordered", "checkpoint", "response", "container"),
                        defaults=("string", "Records"))):
    # name: str
    # identifier: tuple[str, ...]  # where the record's itemIdentifier is, for batchItemFailures
    # identity: the fields that name one delivery, stable across redeliveries (the default key), a tuple of names;
    # or, for a source whose delivery identity is more than fields of the record (Kafka's cluster from the event,
    # RabbitMQ's content), its function (batch, index) -> the value to key by
    # identity: tuple[str, ...] | Callable[[Batch, int], Any]
    # ordered: bool  # records are applied in order (a shard), so nothing may run after one that cannot run now
    # Lambda reads batchItemFailures as a checkpoint: it retries from the earliest record reported, every record
    # after it included, whether reported or not (a stream); else per record (SQS, FIFO included)
    # checkpoint: bool
    # response: str  # the partial batch response: "string" itemIdentifiers, "kafka" {partition, offset} objects, or
    # "none" (Amazon MQ: the invocation fails for the broker to redeliver the batch)
    # container: str  # the event's field holding the records (a list, or an object of lists by group)
    __slots__ = ()


SOURCES = {
    "aws:sqs": Source("SQS", ("messageId",), ("messageId",), False, False),
    # Kinesis sequence numbers are unique within a stream, and shard ids repeat across streams: key by both.
    "aws:kinesis": Source("Kinesis", ("kinesis", "sequenceNumber"), ("eventSourceARN", "eventID"), True, True),
    "aws:dynamodb": Source("DynamoDB Streams", ("dynamodb", "SequenceNumber"), ("eventID",), True, True),
}


class Batch(namedtuple("Batch", ("source", "records", "identifiers", "ordered", "groups", "cluster"),
                       defaults=(None, None))):
    # source: Source
    # records: list[Any]
    # identifiers: list[str]
    # ordered: bool  # a shard, an SQS FIFO queue, a Kafka partition: processing stops at the first record that
    # cannot run now (within its group)
    # groups: list[str] | None  # each record's group name in an object-of-lists container (Kafka's
    # "<topic>-<partition>", RabbitMQ's "<queue>::<vhost>"); None for a Records/messages list
    # cluster: str | None  # Kafka: the cluster, part of each record's default key
    __slots__ = ()

    def group(self, index: int) -> Any:
        """The ordering group of record `index`: a record that cannot run stops the records after it in its group
        (None: no order, nothing stops)."""
        if not self.ordered:
            return None
        return self.groups[index] if self.groups is not None else ""

    def narrowed(self, event: dict[str, Any], indexes: list[int]) -> dict[str, Any]:
        """The event Lambda sent with only the records at `indexes`: the same event when none was dropped; groups
        left empty are dropped (Kafka's and RabbitMQ's)."""
        if len(indexes) == len(self.records):
            return event
        container = self.source.container
        if self.groups is None:
            return {**event, container: [self.records[index] for index in indexes]}
        lists: dict[str, list[Any]] = {}
        for index in indexes:
            lists.setdefault(self.groups[index], []).append(self.records[index])
        return {**event, container: {name: lists[name] for name in event[container] if name in lists}}


def _dig(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value


def parse(event: Any, required: bool) -> Batch | None:
    """The batch `event` is, or None when it is not one (then `required` makes that an error).

    A batch is a `Records` list whose first record's `eventSource` is `aws:sqs`, `aws:kinesis` or
    `aws:dynamodb`; every record must then come from that source and carry its item identifier. Or an event whose
    own `eventSource` is Kafka's or Amazon MQ's (`keys.BROKER_SOURCES`), which their modules parse.
    """
    if isinstance(event, dict) and event.get("eventSource") in BROKER_SOURCES:
        if event["eventSource"] in ("aws:kafka", "SelfManagedKafka"):
            from . import kafka  # only functions fed Kafka pay for its import

            return kafka.parse(event)
        from . import mq

        return mq.parse(event)
    records = event.get("Records") if isinstance(event, dict) else None
    origin = None
    if isinstance(records, list):
        for record in records:  # the first record that names a source we know; every record must match it
            named = record.get("eventSource") if isinstance(record, dict) else None
            if isinstance(named, str) and named in SOURCES:
                origin = named
                break
    source = SOURCES.get(origin) if origin is not None else None
    if source is None:
        if required:
            raise IdempotencyKeyError(
                "IDEMPOTENCY_SCOPE=record, but the event is not a batch from SQS, Kinesis, DynamoDB Streams, Kafka "
                "or Amazon MQ (a Records list whose eventSource is aws:sqs, aws:kinesis or aws:dynamodb, or an event "
                "whose eventSource is aws:kafka, SelfManagedKafka, aws:mq or aws:rmq); the handler did not run"
            )
        return None
    assert isinstance(records, list)
    identifiers = []
    ordered = source.ordered
    for index, record in enumerate(records):
        if not isinstance(record, dict) or record.get("eventSource") != origin:
            raise IdempotencyKeyError(
                f"record {index} of the {source.name} batch is not an {origin} record: a batch holds records of one "
                "source; the handler did not run"
            )
        identifier = _dig(record, source.identifier)
        if not isinstance(identifier, str) or not identifier:
            raise IdempotencyKeyError(
                f"record {index} of the {source.name} batch has no {'.'.join(source.identifier)} (a non-empty "
                "string), which its partial batch response needs; the handler did not run"
            )
        identifiers.append(identifier)
        arn = record.get("eventSourceARN")
        ordered = ordered or (source.name == "SQS" and isinstance(arn, str) and arn.endswith(".fifo"))
    return Batch(source, records, identifiers, ordered)


_INVALID = None  # what `handler_failures` returns for an answer Lambda would treat as a failed batch


def _kafka_identifier(identifier: Any) -> str | None:
    """A Kafka itemIdentifier, {"partition": "<topic>-<partition>", "offset": <int>}, as the batch's identifier."""
    if not isinstance(identifier, dict):
        return None
    partition, offset = identifier.get("partition"), identifier.get("offset")
    if not isinstance(partition, str) or not isinstance(offset, int) or isinstance(offset, bool):
        return None
    return f"{partition}@{offset}"


def handler_failures(value: Any, sent: Iterable[str], response: str = "string") -> set[str] | None:
    """The item identifiers the handler reported as failed; None when its answer is not a valid partial batch
    response (Lambda then treats the whole batch as failed). `sent` are the identifiers of the batch Lambda
    sent, which Lambda accepts, not only those of the records the handler was given. `response`: the source's
    shape (Source.response); a source without partial batch responses (Amazon MQ) reads none."""
    if response == "none" or not isinstance(value, dict) or value.get("batchItemFailures") is None:
        return set()
    items = value["batchItemFailures"]
    if not isinstance(items, list):
        return _INVALID
    known = set(sent)
    failed = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if response == "kafka":
            identifier = _kafka_identifier(identifier)
        if not isinstance(identifier, str) or identifier not in known:
            return _INVALID
        failed.add(identifier)
    return failed


def record_key(keys: KeyDeriver, batch: Batch, index: int) -> str | None:
    """The stored key of record `index` (None: the key expression selected nothing from it); raises
    IdempotencyKeyError for a record without one. Side-effect free: the operator CLI derives keys with it too."""
    record = batch.records[index]
    if keys.expression is not None:
        return keys.key(record)
    if callable(batch.source.identity):
        return keys.key_of(batch.source.identity(batch, index))
    identity = [record.get(name) for name in batch.source.identity]
    for name, value in zip(batch.source.identity, identity, strict=True):
        if not isinstance(value, str) or not value:
            raise IdempotencyKeyError(
                f"record {index} of the {batch.source.name} batch has no {name}, part of its default key; "
                "set IDEMPOTENCY_KEY_JMESPATH to key its records another way"
            )
    return keys.key_of(identity[0] if len(identity) == 1 else identity)


def refuse_a_whole_event_expression(keys: KeyDeriver, batch: Batch, event: dict[str, Any]) -> None:
    """An expression that selects nothing from any record but something from the whole event was written
    for the whole event (`Records[0].messageId`): running the records unguarded would run them twice."""
    try:
        whole = keys.select(event)
    except IdempotencyKeyError:
        return
    if not is_empty(whole):
        raise IdempotencyKeyError(
            f"IDEMPOTENCY_KEY_JMESPATH={keys.expression!r} selects nothing from any record of this "
            f"{batch.source.name} batch but selects a value from the whole event: under IDEMPOTENCY_SCOPE=auto "
            "or record it is applied to each record (write it for one record, e.g. json_parse(body).orderId), "
            "or set IDEMPOTENCY_SCOPE=event to key the whole event; the handler did not run"
        )


SKIPPED = object()  # _Executor.map's result for an item it never started, after a result that stops the rest


class _Executor:
    """Runs calls concurrently on a few threads kept for the life of the environment, created on first use."""

    def __init__(self) -> None:
        self._pool: Any = None

    def map(self, fn: Callable[[Any], Any], items: list[Any], stop: Callable[[Any], bool] | None = None) -> list[Any]:
        """`fn` of each item, in order; an exception is returned in its item's place, never raised. Once a result
        satisfies `stop`, items not yet started are not: `SKIPPED` is in their place."""
        stopped = False

        def call(item: Any) -> Any:
            nonlocal stopped
            if stopped:
                return SKIPPED
            try:
                result = fn(item)
            except Exception as error:
                result = error
            if stop is not None and stop(result):
                stopped = True
            return result

        if len(items) <= 1:
            return [call(item) for item in items]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor  # only functions fed batches pay for it

            self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="idempotency")
        return list(self._pool.map(call, items))


class Runner:
    """Runs one handler call for a batch, each record's key claimed, completed or released by the cycle."""

    def __init__(self, cycle: Cycle, keys: KeyDeriver, require_key: bool, handler: Callable[[Any, Any], Any],
                 stream_failures: str = "checkpoint", batch_response: str = "partial") -> None:
        if stream_failures not in STREAM_FAILURES:
            raise ValueError(f"stream_failures must be one of {', '.join(STREAM_FAILURES)}")
        if batch_response not in BATCH_RESPONSES:
            raise ValueError(f"batch_response must be one of {', '.join(BATCH_RESPONSES)}")
        # fail: the mapping does not honour partial batch responses, so a record that must come back fails the
        # whole invocation (after what ran completed) instead of being reported and lost
        self.fail_whole = batch_response == "fail"
        self._said_content_keys = False  # RabbitMQ messages keyed by content: said once per environment
        self.cycle = cycle
        self.keys = keys
        self.require_key = require_key
        self.handler = handler
        # checkpoint: a stream handler that stops at its first failure and reports it (AWS's pattern) must not
        # have the records after it completed: it never ran them, and Lambda brings them back
        self.checkpoint = stream_failures == "checkpoint"
        self._executor = _Executor()

    def _key(self, batch: Batch, index: int) -> str | None:
        return record_key(self.keys, batch, index)

    def run(self, batch: Batch, event: dict[str, Any], context: Any, remaining_ms: int) -> Any:
        count = len(batch.records)
        tally = self.cycle.tally
        if tally is not None:
            tally.kind, tally.records = "batch", count
        self.cycle.check()
        deadline = Deadline.after(remaining_ms / 1000)  # the invocation's, for completion and release
        keys: list[str | None] = [None] * count
        blocked: set[int] = set()  # records that cannot run now: the layer reports them as failures
        nothing: list[int] = []  # records the expression selected nothing from
        for index in range(count):
            try:
                keys[index] = self._key(batch, index)
            except IdempotencyKeyError as error:
                logger.warning("record %d of the batch has no usable key, reported as failed: %s", index, error,
                               extra=fields(None))
                blocked.add(index)
                continue
            if keys[index] is None:
                nothing.append(index)
        if nothing and len(nothing) == count:
            self._refuse_a_whole_event_expression(batch, event)
        if batch.source.name == "RabbitMQ" and self.keys.expression is None and not self._said_content_keys:
            from . import mq

            if any(not mq.has_message_id(record) for record in batch.records):
                self._said_content_keys = True
                logger.warning("RabbitMQ messages without basicProperties.messageId are keyed by their data and "
                               "basicProperties: two equal messages are one; set messageId when publishing, or "
                               "IDEMPOTENCY_KEY_JMESPATH", extra=fields(None))
        for index in nothing:
            if self.require_key:
                logger.warning(
                    "IDEMPOTENCY_KEY_JMESPATH=%r selected nothing from record %d and IDEMPOTENCY_REQUIRE_KEY is true; "
                    "reported as failed", self.keys.expression, index, extra=fields(None),
                )
                blocked.add(index)
            else:
                logger.warning(
                    "IDEMPOTENCY_KEY_JMESPATH=%r selected nothing from record %d; running it without idempotency",
                    self.keys.expression, index, extra=fields(None, "passed_through"),
                )

        prints: list[str | None] = [None] * count  # payload fingerprints, with IDEMPOTENCY_PAYLOAD_JMESPATH
        if self.keys.payload is not None:
            for index in range(count):
                if keys[index] is not None and index not in blocked:
                    try:
                        prints[index] = self.keys.fingerprint(batch.records[index])
                    except IdempotencyKeyError as error:
                        logger.warning("record %d of the batch has no usable fingerprint, reported as failed: %s",
                                       index, error, extra=fields(keys[index]))
                        blocked.add(index)

        # One claim per distinct key, at its first record; later copies share that record's outcome.
        first: dict[str, int] = {}
        mismatches = replays = in_progress = 0  # distinct keys, for the invocation's tally
        for index, key in enumerate(keys):
            if key is None or index in blocked:
                continue
            if key not in first:
                first[key] = index
            elif prints[index] != prints[first[key]]:
                logger.warning("record %d has the key of record %d with another payload; reported as failed",
                               index, first[key], extra=fields(key, "mismatch"))
                blocked.add(index)
                mismatches += 1
        # A completed record is done, whatever ran it: a whole event with the same key did this operation too.
        done: set[str] = set()
        busy: set[str] = set()  # in progress elsewhere, or used before with another payload
        to_claim = list(first)
        # A redelivered batch's done records, read in one request: only the rest is claimed. A key this
        # environment completed (its local cache) is a sign of redelivery too; it is read like the others, so a
        # purged record runs again.
        redelivered = shows_redelivery(batch.records) or self.cycle.holds_any(to_claim)
        found = self.cycle.precheck({key: prints[first[key]] for key in to_claim}, remaining_ms, redelivered)
        to_claim = [key for key in to_claim if key not in found]
        owners: dict[str, str] = {}
        failure: Exception | None = None
        # A claim the table failed fails the batch: the claims not started yet are not sent (each carries the
        # invocation's deadline, and 10 at a time the rest would hold the batch past it).
        claims = self._executor.map(
            lambda key: self.cycle.claim(key, remaining_ms, prints[first[key]], deadline), to_claim,
            stop=lambda claimed: isinstance(claimed, Exception) and not isinstance(
                claimed, (IdempotencyAlreadyInProgressError, IdempotencyPayloadMismatchError)),
        )
        for key, claimed in [*found.items(), *zip(to_claim, claims, strict=True)]:
            if isinstance(claimed, str):
                owners[key] = claimed
            elif isinstance(claimed, Record):
                done.add(key)
                replays += 1
            elif isinstance(claimed, IdempotencyAlreadyInProgressError):
                logger.info("%s; its record is reported as failed", claimed, extra=fields(key, "in_progress"))
                busy.add(key)
                in_progress += 1
            elif isinstance(claimed, IdempotencyPayloadMismatchError):
                logger.warning("%s; its record is reported as failed", claimed, extra=fields(key, "mismatch"))
                busy.add(key)
                mismatches += 1
            elif claimed is not SKIPPED:
                failure = failure or claimed
        if failure is not None:
            # The table failed us (or the settings did) before any record ran: the whole batch comes back.
            self._release(list(owners.items()), deadline)
            raise failure

        # Walk the records in order: each is passed to the handler, dropped as done, or reported as failed.
        passed: list[int] = []
        failed: list[int] = []
        copies: list[int] = []  # later records of a passed key: they share its outcome
        stopped: set[Any] = set()  # ordering groups stopped at a record that cannot run now
        for index, key in enumerate(keys):
            group = batch.group(index)
            if group in stopped or index in blocked or key in busy:
                failed.append(index)
                if group is not None:  # nothing after a record that cannot run now may run in its group
                    stopped.add(group)
            elif key is None:
                passed.append(index)
            elif key in done:
                continue
            elif first[key] == index:
                passed.append(index)
            else:
                copies.append(index)
        passed_keys = {keys[index] for index in passed} - {None}
        unused = [(key, owner) for key, owner in owners.items() if key not in passed_keys]
        self._release(unused, deadline)  # FIFO: claims of records after the stop
        owned = [(key, owners[key]) for key in passed_keys]  # type: ignore[index]
        if tally is not None:  # per distinct key; a key's later records in the batch share its first's outcome
            tally.add_many(FirstExecutions=len(owned), PassThroughs=sum(keys[index] is None for index in passed),
                           Replays=replays, InProgressConflicts=in_progress,
                           PayloadMismatches=mismatches)

        value: Any = None
        if passed:
            try:
                value = self.handler(batch.narrowed(event, passed), context)
            except BaseException:
                self._release(owned, deadline)
                raise
            reported = handler_failures(value, batch.identifiers, batch.source.response)
            if reported is _INVALID:
                logger.error(
                    "the handler's batchItemFailures is not a valid partial batch response (a list of "
                    "{\"itemIdentifier\": %s}), which fails the whole batch; released every record it was given",
                    "{\"partition\": <a partition of the batch>, \"offset\": <an offset of it, an integer>}"
                    if batch.source.response == "kafka" else "<an identifier of a record of the batch>",
                    extra=fields(None, "released"),
                )
                self._release(owned, deadline)
                if self.fail_whole:  # a mapping that ignores the answer would count the batch as done
                    raise IdempotencyBatchIncompleteError(
                        f"the handler's answer to the {batch.source.name} batch is not a valid partial batch response "
                        f"and IDEMPOTENCY_BATCH_RESPONSE=fail: all {count} records must come back; the invocation "
                        "fails so that the whole batch is redelivered"
                    )
                return value
            if self.checkpoint and batch.source.checkpoint:
                # Lambda retries the shard (a Kafka partition) from the earliest record named, in the batch it sent
                # (one we dropped as done included), or from where we stopped: nothing there or after it may
                # complete, as the handler may not have run it. Records before it ran (the handler went on past
                # them), and Lambda does not retry them for this answer. All from the checkpoint on are reported,
                # so the answer names each released one.
                checkpoints: dict[Any, int] = {}  # the earliest index to come back, per group
                for index in [index for index in range(count) if batch.identifiers[index] in reported] + failed:
                    group = batch.group(index)
                    checkpoints[group] = min(checkpoints.get(group, count), index)
                after = {index for index in range(count)
                         if batch.group(index) in checkpoints and index >= checkpoints[batch.group(index)]}
                failed_keys = {keys[index] for index in passed if index in after}
                unnamed = sum(index in after and batch.identifiers[index] not in reported for index in passed)
                if unnamed:
                    logger.info("checkpoint at record %d of the stream batch: %d record(s) after it that the handler "
                                "did not name released too (IDEMPOTENCY_STREAM_FAILURES=checkpoint)",
                                min(checkpoints.values()), unnamed, extra=fields(None, "released"))
                failed.extend(after)
            else:
                failed_keys = {keys[index] for index in passed if batch.identifiers[index] in reported}
                # Every record the handler named comes back, a record we had dropped as done included: its
                # answer is kept as it gave it, and a done record is dropped again on redelivery.
                failed.extend(index for index in range(count) if batch.identifiers[index] in reported)
            # A later copy of a key that must come back comes back too, wherever it is: in another Kafka partition
            # it is that partition's resume point (the records after it there that ran stay done).
            failed.extend(index for index in copies if keys[index] in failed_keys)
            self._complete([(key, owner) for key, owner in owned if key not in failed_keys], deadline)
            self._release([(key, owner) for key, owner in owned if key in failed_keys], deadline)
        response = batch.source.response
        if not failed:
            return value if passed or response == "none" else {"batchItemFailures": []}
        if response == "none" or self.fail_whole:
            # What ran is completed (it replays as done); the rest comes back only if the whole batch does.
            why = ("Amazon MQ has no partial batch response" if response == "none"
                   else "IDEMPOTENCY_BATCH_RESPONSE=fail")
            raise IdempotencyBatchIncompleteError(
                f"{len(set(failed))} of the {count} records of the {batch.source.name} batch must come back (failed, "
                f"in progress elsewhere, stopped behind one, or without a usable key) and {why}: the invocation fails "
                "so that the whole batch is redelivered; the records that ran are completed and are dropped as done"
            )
        if response == "kafka":
            # AWS's Kafka partial batch response: one {"partition": "<topic>-<partition>", "offset": <int>} per
            # partition, the offset Lambda resumes it from, as documented in "Configuring error handling controls
            # for Kafka event sources": https://docs.aws.amazon.com/lambda/latest/dg/kafka-retry-configurations.html
            first_offsets: dict[str, int] = {}
            for index in sorted(set(failed)):
                name, offset = batch.groups[index], batch.records[index]["offset"]
                first_offsets[name] = min(first_offsets.get(name, offset), offset)
            items: list[Any] = [{"itemIdentifier": {"partition": name, "offset": offset}}
                                for name, offset in first_offsets.items()]
        else:
            # One entry per identifier: a message delivered twice in one batch is reported once.
            identifiers = dict.fromkeys(batch.identifiers[index] for index in sorted(set(failed)))
            items = [{"itemIdentifier": identifier} for identifier in identifiers]
        return {**value, "batchItemFailures": items} if isinstance(value, dict) else {"batchItemFailures": items}

    def _refuse_a_whole_event_expression(self, batch: Batch, event: dict[str, Any]) -> None:
        refuse_a_whole_event_expression(self.keys, batch, event)

    def _complete(self, claims: list[tuple[str, str]], deadline: Deadline) -> None:
        done = codec.Encoded(codec.DONE, None)
        self._executor.map(
            lambda claim: self.cycle.complete(claim[0], claim[1], done, deadline), claims
        )

    def _release(self, claims: list[tuple[str, str]], deadline: Deadline) -> None:
        self._executor.map(lambda claim: self.cycle.release(*claim, deadline), claims)
