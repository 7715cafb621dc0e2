"""Whether a batch shows that Lambda delivered it before: what IDEMPOTENCY_BATCH_PRECHECK=auto goes by."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any


def shows_redelivery(records: list[Any]) -> bool:
    """True when any record carries a sign of an earlier delivery: an SQS message's
    `attributes.ApproximateReceiveCount` above 1 (SQS counts every receive of the message, see
    https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html), or an Amazon MQ
    message's `redelivered` flag (the broker's JMSRedelivered, RabbitMQ's redelivered). Streams and Kafka carry no
    such sign: IDEMPOTENCY_BATCH_PRECHECK=always pre-checks their every batch. A count that is not a whole number,
    or a flag that is not `true`, is no sign (the claims judge such a batch, as any other)."""
    for record in records:
        if isinstance(record, dict) and record.get("redelivered") is True:
            return True
        attributes = record.get("attributes") if isinstance(record, dict) else None
        count = attributes.get("ApproximateReceiveCount") if isinstance(attributes, dict) else None
        if isinstance(count, str) and count.isascii() and count.isdigit() and int(count) > 1:
            return True
    return False
