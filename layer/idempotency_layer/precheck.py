"""A batch's pre-check: which of its keys are done, read with one consistent `store.read` per `READ_KEYS` keys
before any claim, so that a redelivered batch's completed records cost no claim each. Imported only when a batch
is pre-checked (`Cycle.precheck`: IDEMPOTENCY_BATCH_PRECHECK is `always`, or `auto` and the batch shows
redelivery).
"""

from __future__ import annotations

import logging

from .deadline import Backoff, Deadline
from .errors import IdempotencyPayloadMismatchError, IdempotencyPersistenceLayerError
from .keys import check_fingerprint
from .log import fields
from .stores.protocol import COMPLETED, READ_KEYS

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .invocation import Invocation
    from .record_mac import RecordMac
    from .stores.protocol import Record, Store

# The keys a read leaves unprocessed are read again after 50 ms, doubling to 1 s, with jitter, at most
# MAX_READ_ATTEMPTS reads in all; the pre-check takes at most PRECHECK_SHARE of what the invocation has left: it
# only saves requests, and the claims after it must still fit.
READ_RETRIES, MAX_READ_ATTEMPTS, PRECHECK_SHARE = Backoff(0.05, 1.0), 5, 0.5

logger = logging.getLogger("idempotency_layer")


class Precheck:
    """One batch's pre-check against `store`; `environment` (the cycle's `Environment`) learns here that the store
    refuses the read (`precheck_denied`). With `mac` (IDEMPOTENCY_RECORD_MAC_KEY) the read takes whole records, and
    only those that pass it are answered: any other is left to its claim, which refuses it (and says so once)."""

    __slots__ = ("clock", "environment", "mac", "sleep", "store")

    def __init__(self, store: Store, environment: Any, clock: Callable[[], float],
                 sleep: Callable[[float], None], mac: RecordMac | None = None) -> None:
        self.store = store
        self.mac = mac
        self.environment = environment
        self.clock = clock
        self.sleep = sleep

    def found(self, inv: Invocation, wanted: dict[str, str | None]
              ) -> dict[str, Record | IdempotencyPayloadMismatchError]:
        """The completed records among `wanted` (key -> the fingerprint its copy carries). A key is answered only
        when a claim would have found the same: a completed, unexpired record (its fingerprint checked as a replay
        checks it, a mismatch answered as the error). Anything else (absent, in progress, expired, unreadable,
        left unprocessed) is left out, for the claim to judge. Never raises: a failed read leaves its keys to the
        claims, with a warning."""
        found: dict[str, Record | IdempotencyPayloadMismatchError] = {}
        keys = list(wanted)
        until = Deadline.after(max(0, inv.remaining_ms) * PRECHECK_SHARE / 1000)
        for start in range(0, len(keys), READ_KEYS):
            try:
                records = self._read(inv, keys[start:start + READ_KEYS], until)
            except IdempotencyPersistenceLayerError as error:
                if error.denied:
                    self.environment.precheck_denied = True
                    grant = self.store.read_grant
                    logger.warning("the function lacks %s: batches are no longer pre-checked in this environment, "
                                   "each record is claimed (grant it to answer a redelivered batch in one request)",
                                   grant, extra=fields(None))
                else:
                    logger.warning("pre-checking %d keys of the batch failed; claiming them instead: %s",
                                   len(keys) - start, error, extra=fields(None, "store_error"))
                return found
            except Exception as error:  # not the store's word (a bug): the claims still decide
                logger.warning("pre-checking %d keys of the batch failed (%s); claiming them instead",
                               len(keys) - start, type(error).__name__, extra=fields(None, "store_error"))
                return found
            now = self.clock()
            for key, record in records.items():
                if record.status != COMPLETED or record.is_expired(now):
                    continue
                if self.mac is not None and self.mac.fault(record) is not None:
                    continue
                try:
                    check_fingerprint(key, record.fingerprint, wanted[key])
                except IdempotencyPayloadMismatchError as error:
                    found[key] = error
                else:
                    found[key] = record
        return found

    def _read(self, inv: Invocation, keys: list[str], until: Deadline) -> dict[str, Record]:
        """`store.read` of `keys`, the keys it leaves unprocessed read again with backoff while `until` allows."""
        records: dict[str, Record] = {}
        for attempt in range(1, MAX_READ_ATTEMPTS + 1):
            with inv.timed:
                read, keys = (self.store.read(keys, until) if self.mac is None
                              else self.store.read(keys, until, whole=True))
            records.update(read)
            if not keys:
                return records
            pause = READ_RETRIES.delay(attempt)
            if attempt == MAX_READ_ATTEMPTS or not until.allows(pause):
                logger.warning("the table left %d keys of the batch's pre-check unprocessed; claiming them instead",
                               len(keys), extra=fields(None))
                return records
            self.sleep(pause)
        return records
