"""Batches from SQS, Kinesis, DynamoDB Streams, Kafka and Amazon MQ: each record runs once, with a partial batch
response where the source has one.

A redelivered batch is a new mix of records with new receipt handles, so no key of the whole event can
work: every record gets its own key (its delivery identity, or the key expression applied to it). This module plans
a batch (`plan`: a unit per record) and holds the rules the executor settles it by: which records the handler's
answer sends back (`handler_failures`, `settle`: for SQS the records it names; for a stream (Kinesis, DynamoDB
Streams) and each Kafka partition, by default, the earliest one it names and every record after it, since Lambda
retries the shard (the partition) from there), and the answer the source gets (`respond`). Records keep no result:
a completed record only means "done".

Each record has an ordering group: a shard or an SQS FIFO queue is one group (the whole batch), a Kafka batch has
one per topic-partition, SQS standard queues and Amazon MQ none. A record that cannot run stops its group only.
Kafka and Amazon MQ events are parsed by their own modules (`sources.kafka`, `sources.mq`), imported only for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..errors import IdempotencyBatchIncompleteError, IdempotencyKeyError
from ..keys import KeyDeriver, is_empty
from ..plan import BATCH, MISMATCH, NO_FINGERPRINT, NO_KEY, REQUIRED, Note, Plan, Unit
from .records import Batch, parse_records

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

WARNING = logging.WARNING
_KAFKA, _MQ = ("aws:kafka", "SelfManagedKafka"), ("aws:mq", "aws:rmq")


def parse(event: Any, required: bool) -> Batch | None:
    """The batch `event` is, or None when it is not one (then `required` makes that an error). An event whose own
    `eventSource` is Kafka's or Amazon MQ's is parsed by their modules; else `batches.parse_records`."""
    if isinstance(event, dict) and event.get("eventSource") in _KAFKA:
        from . import kafka  # only functions fed Kafka pay for its import

        return kafka.parse(event)
    if isinstance(event, dict) and event.get("eventSource") in _MQ:
        from . import mq

        return mq.parse(event)
    return parse_records(event, required)


def record_key(keys: KeyDeriver, batch: Batch, index: int) -> str | None:
    """The stored key of record `index` (None: the key expression selected nothing from it); raises
    IdempotencyKeyError for a record without one."""
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


def _whole_event_expression(keys: KeyDeriver, batch: Batch, event: dict[str, Any]) -> IdempotencyKeyError | None:
    """An expression that selects nothing from any record but something from the whole event was written
    for the whole event (`Records[0].messageId`): running the records unguarded would run them twice."""
    try:
        whole = keys.select(event)
    except IdempotencyKeyError:
        return None
    if is_empty(whole):
        return None
    return IdempotencyKeyError(
        f"IDEMPOTENCY_KEY_JMESPATH={keys.expression!r} selects nothing from any record of this "
        f"{batch.source.name} batch but selects a value from the whole event: under IDEMPOTENCY_SCOPE=auto "
        "or record it is applied to each record (write it for one record, e.g. json_parse(body).orderId), "
        "or set IDEMPOTENCY_SCOPE=event to key the whole event; the handler did not run"
    )


def plan(settings: Any, keys: KeyDeriver, batch: Batch, event: dict[str, Any]) -> Plan:
    """A unit per record of `batch`: its key (its delivery identity, or the key expression's), its payload
    fingerprint, its ordering group, and why it cannot run when it cannot; the notes the log gets, in order."""
    count = len(batch.records)
    found: list[str | None] = [None] * count
    refused: dict[int, str] = {}
    why: dict[int, str] = {}
    notes: list[Note] = []
    nothing: list[int] = []  # records the expression selected nothing from
    for index in range(count):
        try:
            found[index] = record_key(keys, batch, index)
        except IdempotencyKeyError as error:
            notes.append(Note(WARNING, f"record {index} of the batch has no usable key, reported as failed: {error}"))
            refused[index], why[index] = NO_KEY, str(error)
            continue
        if found[index] is None:
            nothing.append(index)
    if nothing and len(nothing) == count:
        refusal = _whole_event_expression(keys, batch, event)
        if refusal is not None:
            return Plan(BATCH, (), batch=batch, refusal=refusal, notes=tuple(notes))
    if batch.source.content_keys and keys.expression is None:
        from .mq import has_message_id

        if any(not has_message_id(record) for record in batch.records):
            notes.append(Note(WARNING, "RabbitMQ messages without basicProperties.messageId are keyed by their data "
                                       "and basicProperties: two equal messages are one; set messageId when "
                                       "publishing, or IDEMPOTENCY_KEY_JMESPATH", once="rabbitmq_content_keys"))
    for index in nothing:
        if settings.require_key:
            notes.append(Note(WARNING, f"IDEMPOTENCY_KEY_JMESPATH={keys.expression!r} selected nothing from record "
                                       f"{index} and IDEMPOTENCY_REQUIRE_KEY is true; reported as failed"))
            refused[index] = REQUIRED
        else:
            notes.append(Note(WARNING, f"IDEMPOTENCY_KEY_JMESPATH={keys.expression!r} selected nothing from record "
                                       f"{index}; running it without idempotency", outcome="passed_through"))
    prints: list[str | None] = [None] * count  # payload fingerprints, with IDEMPOTENCY_PAYLOAD_JMESPATH
    if keys.payload is not None:
        for index in range(count):
            if found[index] is not None and index not in refused:
                try:
                    prints[index] = keys.fingerprint(batch.records[index])
                except IdempotencyKeyError as error:
                    notes.append(Note(WARNING, f"record {index} of the batch has no usable fingerprint, reported as "
                                               f"failed: {error}", found[index]))
                    refused[index], why[index] = NO_FINGERPRINT, str(error)
    # One claim per distinct key, at its first record; later copies share that record's outcome.
    first: dict[str, int] = {}
    for index, key in enumerate(found):
        if key is None or index in refused:
            continue
        if key not in first:
            first[key] = index
        elif prints[index] != prints[first[key]]:
            notes.append(Note(WARNING, f"record {index} has the key of record {first[key]} with another payload; "
                                       "reported as failed", key, "mismatch"))
            refused[index] = MISMATCH
    units = tuple(
        Unit(key, prints[index], index, batch.group(index), refused.get(index),
             None if key is None or first.get(key, index) == index else first[key], why.get(index))
        for index, key in enumerate(found))
    return Plan(BATCH, units, batch=batch, notes=tuple(notes))


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


def invalid_answer(batch: Batch) -> str:
    """What the log says of a handler's answer that is not a valid partial batch response."""
    shape = ('{"partition": <a partition of the batch>, "offset": <an offset of it, an integer>}'
             if batch.source.response == "kafka" else "<an identifier of a record of the batch>")
    return ("the handler's batchItemFailures is not a valid partial batch response (a list of "
            f'{{"itemIdentifier": {shape}}}), which fails the whole batch; released every record it was given')


def settle(plan: Plan, passed: list[int], copies: list[int], stopped: list[int], reported: set[str],
           checkpoint: bool) -> tuple[set[str | None], list[int], str | None]:
    """Which records must come back after the handler answered `reported` (its batchItemFailures): (the keys of
    the passed records to release rather than complete, every index to report, a line for the log or None).

    `stopped`: the records that could not run (reported already). Under a stream's checkpoint (`checkpoint` and a
    source that has one), Lambda retries the shard (a Kafka partition) from the earliest record named, in the batch
    it sent (one dropped as done included), or from where the layer stopped: nothing there or after it may complete,
    as the handler may not have run it. Records before it ran (the handler went on past them), and Lambda does not
    retry them for this answer. All from the checkpoint on are reported, so the answer names each released one."""
    batch = plan.batch
    count = len(batch.records)
    keys = [unit.key for unit in plan.units]
    failed = list(stopped)
    note = None
    if checkpoint and batch.source.checkpoint:
        checkpoints: dict[Any, int] = {}  # the earliest index to come back, per group
        for index in [index for index in range(count) if batch.identifiers[index] in reported] + stopped:
            group = batch.group(index)
            checkpoints[group] = min(checkpoints.get(group, count), index)
        after = {index for index in range(count)
                 if batch.group(index) in checkpoints and index >= checkpoints[batch.group(index)]}
        failed_keys = {keys[index] for index in passed if index in after}
        unnamed = sum(index in after and batch.identifiers[index] not in reported for index in passed)
        if unnamed:
            note = (f"checkpoint at record {min(checkpoints.values())} of the stream batch: {unnamed} record(s) after "
                    "it that the handler did not name released too (IDEMPOTENCY_STREAM_FAILURES=checkpoint)")
        failed.extend(after)
    else:
        failed_keys = {keys[index] for index in passed if batch.identifiers[index] in reported}
        # Every record the handler named comes back, a record dropped as done included: its answer is kept as it
        # gave it, and a done record is dropped again on redelivery.
        failed.extend(index for index in range(count) if batch.identifiers[index] in reported)
    # A later copy of a key that must come back comes back too, wherever it is: in another Kafka partition it is
    # that partition's resume point (the records after it there that ran stay done).
    failed.extend(index for index in copies if keys[index] in failed_keys)
    return failed_keys, failed, note


def respond(plan: Plan, value: Any, passed: bool, failed: list[int], fail_whole: bool) -> Any:
    """The answer to the source: the handler's `value` (`passed`: the handler ran), with the records in `failed`
    named in a partial batch response; or IdempotencyBatchIncompleteError when records must come back and the
    source cannot be told which (Amazon MQ; IDEMPOTENCY_BATCH_RESPONSE=fail)."""
    batch = plan.batch
    response = batch.source.response
    if not failed:
        return value if passed or response == "none" else {"batchItemFailures": []}
    if response == "none" or fail_whole:
        # What ran is completed (it replays as done); the rest comes back only if the whole batch does.
        why = "Amazon MQ has no partial batch response" if response == "none" else "IDEMPOTENCY_BATCH_RESPONSE=fail"
        raise IdempotencyBatchIncompleteError(
            f"{len(set(failed))} of the {len(batch.records)} records of the {batch.source.name} batch must come back "
            f"(failed, in progress elsewhere, stopped behind one, or without a usable key) and {why}: the invocation "
            "fails so that the whole batch is redelivered; the records that ran are completed and are dropped as done"
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


def incomplete(batch: Batch) -> IdempotencyBatchIncompleteError:
    """The error of a batch whose handler's answer is invalid, under IDEMPOTENCY_BATCH_RESPONSE=fail."""
    return IdempotencyBatchIncompleteError(
        f"the handler's answer to the {batch.source.name} batch is not a valid partial batch response "
        f"and IDEMPOTENCY_BATCH_RESPONSE=fail: all {len(batch.records)} records must come back; the invocation "
        "fails so that the whole batch is redelivered"
    )
