"""Coming from Powertools: the records its `@idempotent` wrote, read by a first run (IDEMPOTENCY_POWERTOOLS_HANDLER).

A function moved from the decorator to the layer keeps Powertools' table. An event Powertools completed, or still
holds, has a record under Powertools' key, not ours; without this, its retry after the switch would run again.
With the setting, a first run of a whole event (once the layer holds its own claim) reads the record Powertools
would have written for the same event, as Powertools' `DynamoDBPersistenceLayer` lays it out by default:

    key          <AWS_LAMBDA_FUNCTION_NAME>.<module.function>#<MD5 of the selected data's sorted JSON>
    status       INPROGRESS | COMPLETED | EXPIRED
    expiration   epoch seconds: the record's end (Powertools' expires_after_seconds)
    in_progress_expiration   epoch milliseconds: the end of an INPROGRESS claim (the invocation's deadline)
    data         the handler's result as JSON text
    validation   MD5 of what payload_validation_jmespath selected, when Powertools had one

A completed, unexpired record is replayed (its `data` as Powertools would return it) and kept as the layer's own
record; a live INPROGRESS one is in progress; an expired one, or none, lets the handler run. One read more per first
run, only while the setting is set: remove it once Powertools' records have expired (its expires_after_seconds,
one hour by default).
"""

from __future__ import annotations

import json
import logging
import time

from .cycle import Earlier
from .errors import IdempotencyPersistenceLayerError
from .keys import KeyDeriver, powertools_hash, powertools_key
from .log import LOGGER_NAME, fields

logger = logging.getLogger(LOGGER_NAME)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .deadline import Deadline
    from .stores.dynamodb.store import DynamoDBStore

NAMES = ["status", "expiration", "in_progress_expiration", "data", "validation"]


class Reader:
    """Reads, for an event, what Powertools' record of it says (an `Earlier`), or None."""

    def __init__(self, store: DynamoDBStore, keys: KeyDeriver, function_name: str, handler: str) -> None:
        self.store = store
        self.keys = keys
        self.prefix = f"{function_name}.{handler}"
        self.warned = False  # said once per environment

    def __call__(self, event: Any) -> Callable[[Deadline], Earlier | None] | None:
        """The read for `event`, or None when Powertools would have seen no key in it (and stored nothing)."""
        key = powertools_key(self.prefix, self.keys.select(event))
        if key is None:
            return None
        payload = self.keys.select_payload(event) if self.keys.payload else None

        def read(deadline: Deadline) -> Earlier | None:
            try:
                item = self.store.foreign(key, NAMES, deadline)
            except IdempotencyPersistenceLayerError as error:
                if not error.denied:
                    raise
                # A role confined to this function's keys (dynamodb:LeadingKeys of `<prefix>#*`) may not read
                # Powertools' key, which lies outside them: say which statement is missing, not just "denied".
                # A persistence error, not a configuration error: it is raised by an invocation (init sends no
                # Powertools read), the cycle releases its claim so the handler does not run, and the event
                # comes back (a 5xx, a failed record, a retried invocation) to succeed once the grant is made,
                # with no redeploy, while a configuration error says the environment can never work.
                raise IdempotencyPersistenceLayerError(
                    denied_message(self.prefix), permanent=True, denied=True) from error
            if item is not None and "validation" in item and self.keys.payload is None and not self.warned:
                self.warned = True
                logger.warning("Powertools checked this function's payloads (its record %r has a validation hash), "
                               "the layer does not: set IDEMPOTENCY_PAYLOAD_JMESPATH to Powertools' "
                               "payload_validation_jmespath", key, extra=fields(None))
            return None if item is None else judge(key, item, payload, self.keys.payload is not None, time.time())

        return read


def denied_message(prefix: str) -> str:
    """What a first run says when the role may not read Powertools' records of `prefix` (`<function>.<handler>`)."""
    return (f"the function's role may not read the Powertools record of this invocation: grant dynamodb:GetItem on "
            f"keys '{prefix}#*' (a GetItem-only statement, docs/security.md)")


def judge(key: str, item: dict[str, Any], payload: Any, compare: bool, now: float) -> Earlier | None:
    """What Powertools' `item` says at `now`: as Powertools itself would judge it on its next call."""
    said = f"Powertools' record {key!r}"
    try:
        status = item["status"]["S"]
        expiration = int(item["expiration"]["N"])
        until_ms = int(item["in_progress_expiration"]["N"]) if "in_progress_expiration" in item else None
        data = item["data"]["S"] if "data" in item else None
        validation = item["validation"]["S"] if "validation" in item else None
    except (KeyError, TypeError, ValueError):
        raise IdempotencyPersistenceLayerError(
            f"{said} is not one Powertools' DynamoDB layer writes (attributes missing or of the wrong type); "
            "refused, the handler did not run"
        ) from None
    # Powertools' own rules (its conditional put and DataRecord): a record is expired once the whole second
    # `int(now)` is past its expiration, an INPROGRESS claim once `now` in ms is past in_progress_expiration.
    if expiration < int(now):
        return None  # expired: Powertools would run the event again too
    if status == "INPROGRESS" and until_ms is not None and until_ms < int(now * 1000):
        return None  # its invocation is over without a result: Powertools takes such a claim over, any payload
    if status not in ("INPROGRESS", "COMPLETED"):
        # A live EXPIRED record Powertools itself refuses (IdempotencyInconsistentStateError); any other status is
        # not one it writes.
        raise IdempotencyPersistenceLayerError(
            f"{said} is live with a status Powertools would not run the event on; refused, the handler did not run"
        )
    if compare and validation is not None and validation != powertools_hash(payload):
        return Earlier(said, completed=status == "COMPLETED", mismatch=True)
    if status == "INPROGRESS":
        return Earlier(said, completed=False)
    try:
        value = None if data is None else json.loads(data)
    except ValueError:
        raise IdempotencyPersistenceLayerError(f"{said} holds a result that is not JSON; refused, the handler did "
                                               "not run") from None
    return Earlier(said, completed=True, value=value)
