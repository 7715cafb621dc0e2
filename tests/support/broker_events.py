"""Kafka and Amazon MQ events shaped as Lambda's event source mappings send them.

The structures follow AWS's sample events: Amazon MSK (`aws:kafka`, with `eventSourceArn` and `bootstrapServers`)
and self-managed Kafka (`SelfManagedKafka`, `bootstrapServers` only), a `records` object mapping
"<topic>-<partition>" to records with base64 `key` and `value`; Amazon MQ for ActiveMQ (`aws:mq`, a `messages`
list keyed by `messageID`) and for RabbitMQ (`aws:rmq`, `rmqMessagesByQueue` mapping "<queue>::<vhost>" to
messages with `basicProperties`, `redelivered` and base64 `data`). A redelivery is the same records again: Kafka
offsets stay; an ActiveMQ message keeps its messageID; a RabbitMQ message comes back with `redelivered` true.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from tests.support.events import ACCOUNT, REGION

CLUSTER_ARN = f"arn:aws:kafka:{REGION}:{ACCOUNT}:cluster/orders/a1b2c3d4-5678-90ab-cdef-11111EXAMPLE-1"
BOOTSTRAP = ("b-1.orders.abc123.c2.kafka.us-east-1.amazonaws.com:9092,"
             "b-2.orders.abc123.c2.kafka.us-east-1.amazonaws.com:9092")


def b64json(payload: Any) -> str:
    return base64.b64encode(json.dumps(payload).encode()).decode()


def kafka_record(topic: str, partition: int, offset: int, payload: Any, key: str | None = "k") -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp": 1545084650987 + offset,
        "timestampType": "CREATE_TIME",
        "key": None if key is None else base64.b64encode(key.encode()).decode(),
        "value": b64json(payload),
        "headers": [{"headerKey": [104, 101, 97, 100, 101, 114, 86, 97, 108, 117, 101]}],
    }


def kafka_event(records: list[dict[str, Any]], self_managed: bool = False, cluster: str = CLUSTER_ARN
                ) -> dict[str, Any]:
    """One delivery of `records`, grouped by "<topic>-<partition>" in their order of first appearance."""
    lists: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        lists.setdefault(f"{record['topic']}-{record['partition']}", []).append(dict(record))
    if self_managed:
        return {"eventSource": "SelfManagedKafka", "bootstrapServers": BOOTSTRAP, "records": lists}
    return {"eventSource": "aws:kafka", "eventSourceArn": cluster, "bootstrapServers": BOOTSTRAP, "records": lists}


def kafka_payload(record: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(record["value"]))


def activemq_message(payload: Any, message_id: str | None = None) -> dict[str, Any]:
    return {
        "messageID": message_id or f"ID:b-9bcfa592-423a-4942-879d-eb284b418fc8-1.mq.{REGION}.amazonaws.com-37557-"
                                   f"{uuid.uuid4().int % 10**13}-4:1:1:1:1",
        "messageType": "jms/text-message",
        "deliveryMode": 1,
        "replyTo": None,
        "type": None,
        "expiration": "60000",
        "priority": 1,
        "correlationId": "myJMSCoID",
        "redelivered": False,
        "destination": {"physicalName": "testQueue"},
        "data": b64json(payload),
        "timestamp": 1598827811958,
        "brokerInTime": 1598827811958,
        "brokerOutTime": 1598827811959,
        "properties": {"index": "1", "doAlarm": "false"},
    }


def activemq_event(messages: list[dict[str, Any]], redelivered: bool = False) -> dict[str, Any]:
    return {
        "eventSource": "aws:mq",
        "eventSourceArn": f"arn:aws:mq:{REGION}:{ACCOUNT}:broker:orders:b-9bcfa592-423a-4942-879d-eb284b418fc8",
        "messages": [{**message, "redelivered": redelivered} for message in messages],
    }


def rabbitmq_message(payload: Any, message_id: str | None = None) -> dict[str, Any]:
    return {
        "basicProperties": {
            "contentType": "text/plain",
            "contentEncoding": None,
            "headers": {"header1": {"bytes": [118, 97, 108, 117, 101, 49]}, "numberInHeader": 10},
            "deliveryMode": 1,
            "priority": 34,
            "correlationId": None,
            "replyTo": None,
            "expiration": "60000",
            "messageId": message_id,
            "timestamp": "Jan 1, 1970, 12:33:41 AM",
            "type": None,
            "userId": "AIDACKCEVSQ6C2EXAMPLE",
            "appId": None,
            "clusterId": None,
            "bodySize": 80,
        },
        "redelivered": False,
        "data": b64json(payload),
    }


def rabbitmq_event(queues: dict[str, list[dict[str, Any]]], redelivered: bool = False) -> dict[str, Any]:
    """`queues` maps "<queue>::<vhost>" to its messages; a redelivery flips `redelivered` on each."""
    return {
        "eventSource": "aws:rmq",
        "eventSourceArn": f"arn:aws:mq:{REGION}:{ACCOUNT}:broker:pizzaBroker:b-9bcfa592-423a-4942-879d-eb284b418fc8",
        "rmqMessagesByQueue": {name: [{**message, "redelivered": redelivered} for message in messages]
                               for name, messages in queues.items()},
    }


def mq_payload(message: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(message["data"]))
