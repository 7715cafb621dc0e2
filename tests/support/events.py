"""Batch events shaped as Lambda's event source mappings send them.

The structures follow AWS's published sample events for SQS, SQS FIFO, Kinesis and DynamoDB Streams. A
message keeps its `messageId` across deliveries; every delivery gets a fresh `receiptHandle` and a higher
`ApproximateReceiveCount`, as SQS gives them.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import time
import uuid
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"
_sequence = itertools.count(int(time.time() * 1000) * 10**6)


class Message:
    """One SQS message as the queue holds it: its id and body stay, its deliveries change."""

    def __init__(self, body: str, group: str | None = None) -> None:
        self.message_id = str(uuid.uuid4())
        self.body = body
        self.group = group
        self.sent = int(time.time() * 1000)
        self.receives = 0
        self.sequence = str(next(_sequence))
        self.deduplication_id = hashlib.sha256(body.encode()).hexdigest()

    def deliver(self, arn: str) -> dict[str, Any]:
        self.receives += 1
        attributes = {
            "ApproximateReceiveCount": str(self.receives),
            "SentTimestamp": str(self.sent),
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": str(self.sent + 2),
        }
        if arn.endswith(".fifo"):
            attributes.update({
                "SequenceNumber": self.sequence,
                "MessageGroupId": self.group or "group-1",
                "MessageDeduplicationId": self.deduplication_id,
            })
        return {
            "messageId": self.message_id,
            "receiptHandle": base64.b64encode(uuid.uuid4().bytes * 4).decode(),
            "body": self.body,
            "attributes": attributes,
            "messageAttributes": {},
            "md5OfBody": hashlib.md5(self.body.encode()).hexdigest(),
            "eventSource": "aws:sqs",
            "eventSourceARN": arn,
            "awsRegion": REGION,
        }


def queue_arn(name: str = "orders", fifo: bool = False) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}{'.fifo' if fifo and not name.endswith('.fifo') else ''}"


def sqs_event(messages: list[Message], arn: str | None = None) -> dict[str, Any]:
    """One delivery of `messages` (a new receipt handle and receive count for each)."""
    arn = arn or queue_arn()
    return {"Records": [message.deliver(arn) for message in messages]}


def json_message(payload: Any, group: str | None = None) -> Message:
    return Message(json.dumps(payload), group)


def kinesis_record(payload: Any, shard: str = "shardId-000000000006", sequence: str | None = None,
                   stream: str = "orders") -> dict[str, Any]:
    sequence = sequence or str(next(_sequence))
    return {
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": "1",
            "sequenceNumber": sequence,
            "data": base64.b64encode(json.dumps(payload).encode()).decode(),
            "approximateArrivalTimestamp": round(time.time(), 3),
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": f"{shard}:{sequence}",
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": f"arn:aws:iam::{ACCOUNT}:role/lambda-role",
        "awsRegion": REGION,
        "eventSourceARN": f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{stream}",
    }


def dynamodb_record(marker: str, event_id: str | None = None, sequence: str | None = None) -> dict[str, Any]:
    sequence = sequence or str(next(_sequence))
    return {
        "eventID": event_id or uuid.uuid4().hex,
        "eventVersion": "1.1",
        "dynamodb": {
            "ApproximateCreationDateTime": int(time.time()),
            "Keys": {"Id": {"S": marker}},
            "NewImage": {"Id": {"S": marker}, "Message": {"S": "New item!"}},
            "SequenceNumber": sequence,
            "SizeBytes": 26,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
        "awsRegion": REGION,
        "eventName": "INSERT",
        "eventSourceARN": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/orders/stream/2026-12-01T00:00:00.000",
        "eventSource": "aws:dynamodb",
    }


def stream_event(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Records": records}
