"""How a handler's result is kept in its record, and handed back on replay.

    encode(value)   -> what to hand back, and what to complete the key with; never raises:
                       results.encode           the stored form (`codec.Encoded`)
                       Undeliverable            UNDELIVERABLE: the runtime cannot send it; copies are told why
                       our own failure          TOO_LARGE, as one that cannot be stored
                       too large for a record   bucket.keep: the pointer to complete with, or TOO_LARGE when the
                                                bucket could not take it in time
    decode(result)  -> the value a replay hands back, or the layer's error for one it cannot: a pointer fetched
                       back from the bucket first (bucket.fetch); DONE, UNDELIVERABLE, TOO_LARGE refused
    replay(record)  -> decode, and the record kept in this environment's memory (`LocalCache`), which the cycle
                       replays from once one read confirms the record (`Cycle.cached`)

The large-results bucket (IDEMPOTENCY_LARGE_RESULTS_BUCKET) is asked, never named: it writes and reads the
pointer's text, and says its own failures as the layer's store error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from . import codec
from .errors import (
    IdempotencyKeyError,
    IdempotencyPersistenceLayerError,
    IdempotencyResultTooLargeError,
    IdempotencyResultUndeliverableError,
)
from .log import fields
from .results import Undeliverable
from .stores import readable

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from .deadline import Deadline
    from .invocation import Invocation
    from .results import Results
    from .stores.protocol import Record

    class Reader(Protocol):
        """What a replay, or the CLI's show and purge, asks of the large-results bucket about a record's stored
        result, the bucket set or not (`stores.s3.Bucket`, `stores.s3.UNSET`)."""

        def fetch(self, key: str, result: codec.Encoded, deadline: Deadline | None = None) -> codec.Encoded: ...

        def located(self, result: codec.Encoded) -> Any: ...  # the pointer (bucket, object_key, size, sha256)

        def look(self, key: str, result: codec.Encoded) -> codec.Encoded | tuple[str, str]: ...

    class Bucket(Reader, Protocol):
        """What the keeper asks of the large-results bucket (`stores.s3.Bucket` answers it)."""

        def keep(self, key: str, owner: str, result: codec.Oversized, deadline: Deadline | None = None
                 ) -> codec.Encoded: ...

logger = logging.getLogger("idempotency_layer")


class LocalCache:
    """Completed records of this execution environment, least recently used first out: each one's result and the
    owner token of the claim that completed it, so a replay from memory can confirm, with one small read, that the
    record is still that one (an operator may have purged it, another environment run it again)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[int, codec.Encoded, str | None]] = OrderedDict()
        self._lock = threading.Lock()  # batch records complete from several threads

    def get(self, key: str, now: float) -> tuple[codec.Encoded, str | None] | None:
        """The result of `key` and the owner token of its record's claim, or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires_at, result, owner = entry
            if expires_at < int(now):  # never outlive the record
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return result, owner

    def holds(self, key: str, now: float) -> bool:
        return self.get(key, now) is not None

    def put(self, key: str, expires_at: int, result: codec.Encoded, owner: str | None) -> None:
        with self._lock:
            self._entries[key] = (expires_at, result, owner)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def drop(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)


class Keeper:
    """How one environment keeps results: `results`, how they are stored and handed back unless a key says
    otherwise; `bucket`, the large-results bucket, or None; `cache`, its completed records in memory
    (IDEMPOTENCY_LOCAL_CACHE_SIZE), or None; `clock`, the wall clock the cache's expiry is judged by."""

    __slots__ = ("bucket", "cache", "clock", "results")

    def __init__(self, results: Results, bucket: Bucket | None = None, cache_size: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.results = results
        self.bucket = bucket
        self.cache = LocalCache(cache_size) if cache_size > 0 else None
        self.clock = clock

    def holds_any(self, keys: list[str]) -> bool:
        """Whether this environment's local cache holds a completed record of any of `keys`."""
        if self.cache is None:
            return False
        now = self.clock()
        return any(self.cache.holds(key, now) for key in keys)

    def replay(self, record: Record, results: Results | None = None, deadline: Deadline | None = None) -> Any:
        """The completed `record`'s result, decoded (and kept in the local cache); raises the layer's error for a
        result it cannot hand back (too large, undeliverable, a batch record's)."""
        result = record.result
        if result is None:
            raise IdempotencyPersistenceLayerError(f"record {record.key!r} is completed but has no result format")
        value = self.decode(record.key, result, results, deadline)
        if self.cache is not None:
            self.cache.put(record.key, record.expires_at, result, record.owner)
        return value

    def encode(self, inv: Invocation, key: str, value: Any, results: Results, owner: str | None = None,
               deadline: Deadline | None = None) -> tuple[Any, codec.Encoded]:
        """What to hand back for the result `value` of a handler that ran, and what to complete `key` with: never
        raises, since the key must be completed whatever becomes of its result (one the runtime cannot send, or
        that cannot be stored, is completed without it, and copies are told why). A result too large for a record
        goes to the bucket when there is one and `owner` is given, done by `deadline` (the completion's)."""
        try:
            delivered, result = results.encode(value)
        except Undeliverable as refused:
            # The runtime reports its own error (Runtime.MarshalError) for this invocation; the work is done, so
            # the key is completed and copies are told why there is nothing to replay, never run again.
            logger.warning("result of key %r (of type %s) cannot be sent by the runtime; completed without it, "
                           "replays will raise", key, refused.kind, extra=fields(key, "first_run"))
            delivered, result = value, codec.Encoded(codec.UNDELIVERABLE, refused.kind)
        except BaseException as error:  # our own failure (a bug, MemoryError, RecursionError): do not rerun
            logger.error("result of key %r cannot be stored (%s); replays will raise", key, type(error).__name__,
                         extra=fields(key, "first_run"))
            delivered, result = value, codec.Encoded(codec.TOO_LARGE, None)
        if isinstance(result, codec.Oversized) and self.bucket is not None and owner is not None:
            kept = self._spill(inv, self.bucket, key, owner, result, deadline)
            if kept is None:  # said and counted where it failed
                return delivered, codec.Encoded(codec.TOO_LARGE, None)
            result = kept
        if result.format == codec.TOO_LARGE:
            logger.warning("result of key %r is too large to store; replays will raise", key,
                           extra=fields(key, "first_run"))
            inv.count("ResultsTooLarge")
        return delivered, result

    @staticmethod
    def adopt(value: Any, results: Results) -> tuple[Any, codec.Encoded]:
        """What to hand back and complete with for a result another tool's record holds (a migration): as
        `encode`, silently, and one too large for a record is completed without it (never to the bucket)."""
        try:
            return results.encode(value)
        except Undeliverable as refused:
            return value, codec.Encoded(codec.UNDELIVERABLE, refused.kind)

    def _spill(self, inv: Invocation, bucket: Bucket, key: str, owner: str, result: codec.Oversized,
               deadline: Deadline | None) -> codec.Encoded | None:
        """`result` written to the bucket, as the pointer to complete with; or None when it could not be written
        by `deadline`, when a completion may still start (the upload counts against the completion's time)."""
        try:
            with inv.timed:
                kept = bucket.keep(key, owner, result, deadline)
        except IdempotencyPersistenceLayerError as error:
            logger.warning("result of key %r could not be written to the large-results bucket (%s); completed "
                           "without it, replays will raise", key, error, extra=fields(key, "first_run"))
            inv.count("LargeResultFailures")
            inv.count("ResultsTooLarge")
            return None
        inv.count("LargeResults")
        return kept

    def decode(self, key: str, result: codec.Encoded, results: Results | None = None,
               deadline: Deadline | None = None) -> Any:
        """A stored result, as the handler returned it; raises the layer's error for one it cannot hand back.
        `deadline`: by when a result in the large-results bucket must have been read."""
        if result.format.startswith(codec.STORED):
            result = readable(self.bucket).fetch(key, result, deadline)
        if result.format == codec.DONE:
            raise IdempotencyKeyError(
                f"key {key!r} was completed as a batch record, which keeps no result, so this event cannot be "
                "replayed; batch records and whole events must not select the same key"
            )
        if result.format == codec.UNDELIVERABLE:
            raise IdempotencyResultUndeliverableError(
                f"key {key!r} already ran, but the runtime could not send the result its handler returned (of type "
                f"{result.data!s:.120}: Runtime.MarshalError), so there is nothing to replay; it does not run again "
                "while its record lives (purge the key to run it again)"
            )
        if result.format == codec.TOO_LARGE:
            raise IdempotencyResultTooLargeError(
                f"key {key!r} already ran, but its result was too large to store "
                f"(over {codec.ITEM_LIMIT - codec.RECORD_OVERHEAD} bytes compressed; or the large-results bucket "
                "could not take it in time) or could not be encoded, so it cannot be replayed"
            )
        try:
            return (results or self.results).decode(result)
        except Exception as error:
            raise IdempotencyPersistenceLayerError(
                f"the stored result of key {key!r} (format {result.format!r}) cannot be decoded: "
                f"{type(error).__name__}"
            ) from None
