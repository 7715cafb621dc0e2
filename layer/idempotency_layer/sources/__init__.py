"""Event sources: which family an event belongs to, and its plan (`plan`).

    plan(config, keys, event)
      a durable execution's invocation of this function      -> DURABLE, passed through  (sources.durable)
                                   (IDEMPOTENCY_DURABLE=execution) -> EXECUTION, one unit: its input's key
      an API Gateway, Function URL or ALB request             -> HTTP, one unit            (sources.http)
      an SQS, Kinesis, DynamoDB Streams, Kafka, Amazon MQ batch -> BATCH, a unit per record (sources.batch)
      anything else                                           -> EVENT, one unit           (here)

Each family's module is imported with the first event of its kind, so a function that only gets whole events imports
none of them. Planning is side-effect free: the operator CLI plans events too.
"""

from __future__ import annotations

import logging

from ..errors import IdempotencyKeyError
from ..plan import DURABLE, EVENT, EXECUTION, NO_KEY, REQUIRED, Note, Plan, Unit
from .durable import is_durable

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

    from ..keys import KeyDeriver

# Batches that are not a Records list: Kafka's (Amazon MSK, self-managed) and Amazon MQ's (ActiveMQ, RabbitMQ).
BROKER_SOURCES = ("aws:kafka", "SelfManagedKafka", "aws:mq", "aws:rmq")


def plan(settings: Any, keys: KeyDeriver, event: Any) -> Plan:
    """What the layer does with `event` under `settings` (a `config.Config`). Raises IdempotencyKeyError for an
    event no source may take: a malformed batch, or no batch under IDEMPOTENCY_SCOPE=record."""
    if is_durable(event, settings.function_name, settings.region):  # whatever the scope and key settings
        return execution(settings, keys, event) if settings.durable_executions else Plan(DURABLE)
    if (settings.http and settings.scope != "record" and isinstance(event, dict)
            and isinstance(event.get("requestContext"), dict)):
        from . import http  # only functions behind an HTTP source pay for its import

        request = http.parse(event)
        if request is not None:
            return http.plan(settings, keys, request, event)
    if settings.scope != "event" and (settings.scope != "auto" or (
            isinstance(event, dict) and (isinstance(event.get("Records"), list)
                                         or event.get("eventSource") in BROKER_SOURCES))):
        # (not a batch under `auto`: the batch module is not even imported for it)
        from . import batch  # a function that is never sent a batch never pays for its import

        found = batch.parse(event, required=settings.scope == "record")
        if found is not None:
            return batch.plan(settings, keys, found, event)
    return whole(settings, keys, event)


def execution(settings: Any, keys: KeyDeriver, event: dict[str, Any]) -> Plan:
    """A durable execution's invocation under IDEMPOTENCY_DURABLE=execution: one unit, keyed by the execution's
    input as a whole event is keyed, owned by the execution (its ARN). An input that cannot be read refuses it."""
    from .durable import execution_input

    try:
        arn, given = execution_input(event)
    except IdempotencyKeyError as error:
        return Plan(EXECUTION, (Unit(None, refused=NO_KEY),), refusal=error, execution=event["DurableExecutionArn"])
    return whole(settings, keys, given, "the execution's input")._replace(kind=EXECUTION, execution=arn)


def whole(settings: Any, keys: KeyDeriver, event: Any, what: str = "the event") -> Plan:
    """An event served whole: one key (the key expression's, or the whole event's), taken before the handler runs
    so a handler that mutates its event cannot move it; none runs unguarded, or is refused under
    IDEMPOTENCY_REQUIRE_KEY."""
    try:
        key = keys.key(event)
        if key is None:
            expression = settings.key_jmespath or "@"
            if settings.require_key:
                return Plan(EVENT, (Unit(None, refused=REQUIRED),), refusal=IdempotencyKeyError(
                    f"IDEMPOTENCY_KEY_JMESPATH={expression!r} selected nothing from {what} "
                    "and IDEMPOTENCY_REQUIRE_KEY is true, so the handler did not run"))
            note = Note(logging.WARNING, f"IDEMPOTENCY_KEY_JMESPATH={expression!r} selected nothing from {what}; "
                                         "running without idempotency", None, "passed_through")
            return Plan(EVENT, (Unit(None),), notes=(note,))
        return Plan(EVENT, (Unit(key, keys.fingerprint(event)),))
    except IdempotencyKeyError as error:
        return Plan(EVENT, (Unit(None),), refusal=error)
