"""Amazon MQ batches: ActiveMQ (`aws:mq`, a `messages` list) and RabbitMQ (`aws:rmq`, `rmqMessagesByQueue`
mapping "<queue>::<vhost>" to messages).

Amazon MQ event source mappings have no partial batch response: when a message cannot run, the invocation fails
(after every message that could run ran and completed) and the broker redelivers the whole batch, whose done
messages are then dropped as done (see `executor`). Messages have no order the layer keeps.
"""

from __future__ import annotations

from ..errors import IdempotencyKeyError
from .records import Batch, Source

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

ACTIVEMQ = Source("ActiveMQ", ("messageID",), ("messageID",), False, False, "none", "messages")


def _malformed(source: str, problem: str) -> IdempotencyKeyError:
    return IdempotencyKeyError(f"the {source} batch is malformed: {problem}; the handler did not run")


def parse(event: dict[str, Any]) -> Batch:
    """The batch of an Amazon MQ event; IdempotencyKeyError when it is not one Lambda could have sent."""
    if event["eventSource"] == "aws:mq":
        messages = event.get("messages")
        if not isinstance(messages, list):
            raise _malformed("ActiveMQ", "messages is not a list")
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise _malformed("ActiveMQ", f"message {index} is not an object")
            identifier = message.get("messageID")
            if not isinstance(identifier, str) or not identifier:
                # ActiveMQ always sets one: without it there is no delivery identity to key by
                raise _malformed("ActiveMQ", f"message {index} has no messageID (a non-empty string)")
        return Batch(ACTIVEMQ, messages, [message["messageID"] for message in messages], False)
    queues = event.get("rmqMessagesByQueue")
    if not isinstance(queues, dict):
        raise _malformed("RabbitMQ", "rmqMessagesByQueue is not an object of \"<queue>::<vhost>\" lists")
    records: list[Any] = []
    identifiers: list[str] = []
    groups: list[str] = []
    for position, (name, messages) in enumerate(queues.items()):
        if not isinstance(messages, list):
            raise _malformed("RabbitMQ", f"the value of rmqMessagesByQueue's entry {position} is not a list")
        for index, message in enumerate(messages):
            where = f"message {index} of rmqMessagesByQueue's entry {position}"
            if not isinstance(message, dict):
                raise _malformed("RabbitMQ", f"{where} is not an object")
            if not isinstance(message.get("basicProperties"), dict):
                raise _malformed("RabbitMQ", f"{where} has no basicProperties (an object)")
            records.append(message)
            identifiers.append(f"{name}[{index}]")  # no partial batch response names it: for the operator CLI
            groups.append(name)
    return Batch(RABBITMQ, records, identifiers, False, groups)


def has_message_id(message: dict[str, Any]) -> bool:
    identifier = message["basicProperties"].get("messageId")
    return isinstance(identifier, str) and identifier != ""


# What the broker changes on a message's way back, so no part of a content key: every "x-" header (lowercase) (a quorum
# queue's x-delivery-count and x-acquired-count, dead lettering's x-death and x-first-death-*/x-last-death-*,
# a shovel's x-shovelled, a federation's x-received-from: RabbitMQ's annotations all take that prefix, see
# https://www.rabbitmq.com/docs/dlx and https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling),
# and `expiration`, which dead lettering removes (keeping it in x-death). A property or header the message
# lacks, is null or is an empty table is one state, since a broker may add a table where there was none.
_BROKER_PROPERTIES = ("expiration",)


def _publisher_headers(headers: Any) -> Any:
    if not isinstance(headers, dict):
        return headers
    # Case-sensitive, as AMQP's table keys are: the broker's are lowercase, and a publisher's X-Request-Id is its own.
    return {name: value for name, value in headers.items() if not (isinstance(name, str) and name.startswith("x-"))}


def identity(batch: Batch, index: int) -> Any:
    """A RabbitMQ message's default key: its basicProperties.messageId, else its data and the properties its
    publisher set (never `redelivered`, which a redelivery flips, nor what the broker adds or removes)."""
    message = batch.records[index]
    properties = message["basicProperties"]
    if has_message_id(message):
        return properties["messageId"]
    kept = {}
    for name, value in properties.items():
        if name == "headers":
            value = _publisher_headers(value)
        if value is None or value == {} or name in _BROKER_PROPERTIES:
            continue
        kept[name] = value
    return {"data": message.get("data"), "basicProperties": kept}


# Its default key is `identity` above: the messageId, else the content.
RABBITMQ = Source("RabbitMQ", (), identity, False, False, "none", "rmqMessagesByQueue", content_keys=True)
