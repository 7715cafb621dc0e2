"""What a batch is, whatever its source: the `Source` of each family (its flags) and the parsed `Batch`; and the
batches that are a `Records` list (SQS, Kinesis, DynamoDB Streams). Kafka's and Amazon MQ's are parsed by their
own modules (`sources.kafka`, `sources.mq`), which build on these types."""

from __future__ import annotations

from collections import namedtuple

from ..errors import IdempotencyKeyError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NamedTuple


if TYPE_CHECKING:
    class _SourceFields(NamedTuple):
        name: str  # for people: log lines and errors
        identifier: tuple[str, ...]  # where the record's itemIdentifier is, for batchItemFailures
        # the fields that name one delivery, stable across redeliveries (the default key); or, for a source whose
        # delivery identity is more than fields of the record (Kafka's cluster from the event, RabbitMQ's content),
        # its function (batch, index) -> the value to key by
        identity: tuple[str, ...] | Callable[[Batch, int], Any]
        ordered: bool  # records are applied in order (a shard), so nothing may run after one that cannot run now
        # Lambda reads batchItemFailures as a checkpoint: it retries from the earliest record reported, every record
        # after it included, whether reported or not (a stream); else per record (SQS, FIFO included)
        checkpoint: bool
        # the partial batch response: "string" itemIdentifiers, "kafka" {partition, offset} objects, or "none"
        # (Amazon MQ: the invocation fails for the broker to redeliver the batch)
        response: str = "string"
        container: str = "Records"  # the event's field holding the records (a list, or an object of lists by group)
        fifo_arn: bool = False  # a queue whose ARN ends in .fifo is ordered (SQS FIFO)
        content_keys: bool = False  # records without an id are keyed by their content (RabbitMQ): said once
else:
    _SourceFields = namedtuple("Source", ("name", "identifier", "identity", "ordered", "checkpoint", "response",
                                          "container", "fifo_arn", "content_keys"),
                               defaults=("string", "Records", False, False))


class Source(_SourceFields):
    """One family of batches: how its records are identified, ordered and answered."""
    __slots__ = ()


SOURCES = {
    "aws:sqs": Source("SQS", ("messageId",), ("messageId",), False, False, fifo_arn=True),
    # Kinesis sequence numbers are unique within a stream, and shard ids repeat across streams: key by both.
    "aws:kinesis": Source("Kinesis", ("kinesis", "sequenceNumber"), ("eventSourceARN", "eventID"), True, True),
    "aws:dynamodb": Source("DynamoDB Streams", ("dynamodb", "SequenceNumber"), ("eventID",), True, True),
}


if TYPE_CHECKING:
    class _BatchFields(NamedTuple):
        source: Source
        records: list[Any]
        identifiers: list[str]
        # a shard, an SQS FIFO queue, a Kafka partition: processing stops at the first record that cannot run now
        # (within its group)
        ordered: bool
        # each record's group name in an object-of-lists container (Kafka's "<topic>-<partition>", RabbitMQ's
        # "<queue>::<vhost>"); None for a Records/messages list
        groups: list[str] | None = None
        cluster: str | None = None  # Kafka: the cluster, part of each record's default key
else:
    _BatchFields = namedtuple("Batch", ("source", "records", "identifiers", "ordered", "groups", "cluster"),
                           defaults=(None, None))


class Batch(_BatchFields):
    """A parsed batch: its source, its records and their identifiers, its ordering."""
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


def dig(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value


def parse_records(event: Any, required: bool) -> Batch | None:
    """The batch a `Records` list is, or None when it is not one (then `required` makes that an error).

    A batch is a `Records` list whose first record's `eventSource` is `aws:sqs`, `aws:kinesis` or `aws:dynamodb`;
    every record must then come from that source and carry its item identifier."""
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
        identifier = dig(record, source.identifier)
        if not isinstance(identifier, str) or not identifier:
            raise IdempotencyKeyError(
                f"record {index} of the {source.name} batch has no {'.'.join(source.identifier)} (a non-empty "
                "string), which its partial batch response needs; the handler did not run"
            )
        identifiers.append(identifier)
        arn = record.get("eventSourceARN")
        ordered = ordered or (source.fifo_arn and isinstance(arn, str) and arn.endswith(".fifo"))
    return Batch(source, records, identifiers, ordered)
