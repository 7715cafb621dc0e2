"""Kafka batches, from Amazon MSK (`aws:kafka`) and self-managed Kafka (`SelfManagedKafka`).

Lambda sends a `records` object mapping "<topic>-<partition>" to that partition's records in offset order. A
record's delivery identity is its cluster, topic, partition and offset: a retried batch brings the same offsets
back. Kafka orders records within a partition only, so each partition is an ordering group of its own: a record
that cannot run stops its partition, and Lambda resumes each reported partition from the offset the response
names (see `sources.batch`).
"""

from __future__ import annotations

from ..errors import IdempotencyKeyError
from .records import Batch, Source

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

# Where each source's event names its cluster, part of a record's default key (offsets repeat across clusters).
_CLUSTER = {"aws:kafka": "eventSourceArn", "SelfManagedKafka": "bootstrapServers"}


def _whole(value: Any, bits: int) -> bool:
    """A non-negative Kafka int32 (partition) or int64 (offset): Lambda could not resume from anything else."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** (bits - 1)


def _malformed(problem: str) -> IdempotencyKeyError:
    return IdempotencyKeyError(f"the Kafka batch is malformed: {problem}; the handler did not run")


def parse(event: dict[str, Any]) -> Batch:
    """The batch of a Kafka event; IdempotencyKeyError when it is not one Lambda could have sent."""
    lists = event.get("records")
    if not isinstance(lists, dict):
        raise _malformed("records is not an object of \"<topic>-<partition>\" lists")
    records: list[Any] = []
    identifiers: list[str] = []
    groups: list[str] = []
    for position, (name, partition_records) in enumerate(lists.items()):
        if not isinstance(partition_records, list):
            raise _malformed(f"the value of records' entry {position} is not a list")
        for index, record in enumerate(partition_records):
            where = f"record {index} of records' entry {position}"
            if not isinstance(record, dict):
                raise _malformed(f"{where} is not an object")
            topic, partition, offset = record.get("topic"), record.get("partition"), record.get("offset")
            if not isinstance(topic, str) or not topic:
                raise _malformed(f"{where} has no topic (a non-empty string)")
            if not _whole(partition, 32):
                raise _malformed(f"{where} has no partition (a non-negative 32-bit integer)")
            if not _whole(offset, 64):
                raise _malformed(f"{where} has no offset (a non-negative 64-bit integer)")
            if name != f"{topic}-{partition}":
                raise _malformed(f"{where} has a topic and partition other than its entry's name")
            records.append(record)
            identifiers.append(f"{name}@{offset}")
            groups.append(name)
    cluster = event.get(_CLUSTER[event["eventSource"]])
    if event["eventSource"] == "SelfManagedKafka" and isinstance(cluster, str):
        # The same brokers listed in another order or case (host names are case-insensitive), as a mapping
        # recreated may list them, are the same cluster.
        cluster = ",".join(sorted({server.strip().lower() for server in cluster.split(",") if server.strip()}))
    return Batch(KAFKA, records, identifiers, True, groups, cluster)


def identity(batch: Batch, index: int) -> list[Any]:
    """Record `index`'s default key: its cluster, topic, partition and offset."""
    if not isinstance(batch.cluster, str) or not batch.cluster:
        raise IdempotencyKeyError(
            f"record {index} of the Kafka batch has no cluster (the event's eventSourceArn from Amazon MSK, "
            "bootstrapServers from self-managed Kafka: a non-empty string), part of its default key; set "
            "IDEMPOTENCY_KEY_JMESPATH to key its records another way"
        )
    record = batch.records[index]
    return [batch.cluster, record["topic"], record["partition"], record["offset"]]


# Its default key is `identity` above: the cluster comes from the event, not the record.
KAFKA = Source("Kafka", (), identity, True, True, "kafka", "records")
