"""The state machine: claim -> invoke -> complete or release, and replay.

It knows nothing of Lambda or DynamoDB: it is given a key, a way to invoke the handler and a `Store`, so
the same cycle serves a whole event now and a batch record later. Errors it raises carry the key, so a
caller can map them to responses.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from . import codec
from .errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyClaimConflictError,
    IdempotencyPersistenceLayerError,
    IdempotencyResultTooLargeError,
)
from .store import COMPLETED, Record, Store

MAX_CLAIM_ATTEMPTS = 3

logger = logging.getLogger("idempotency_layer")


class Undeliverable(Exception):
    """Raised by a `deliver` function: the result cannot be handed back at all, so it must not be stored."""


class Outcome(NamedTuple):
    value: Any
    replayed: bool


class LocalCache:
    """Completed records of this execution environment, least recently used first out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[int, codec.Encoded]] = OrderedDict()

    def get(self, key: str, now: float) -> codec.Encoded | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, result = entry
        if expires_at < int(now):  # never outlive the record
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return result

    def put(self, key: str, expires_at: int, result: codec.Encoded) -> None:
        self._entries[key] = (expires_at, result)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def _when(epoch_ms: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_ms / 1000))


class Cycle:
    def __init__(
        self,
        store: Store,
        ttl_seconds: int,
        cache_size: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.cache = LocalCache(cache_size) if cache_size > 0 else None
        self.clock = clock

    def run(
        self,
        key: str,
        invoke: Callable[[], Any],
        remaining_ms: int,
        deliver: Callable[[Any], Any] | None = None,
    ) -> Outcome:
        """Run `invoke` once for `key`, or replay the result of the run that did.

        `remaining_ms` is how long this invocation may still take: the claim lasts that long.
        `deliver` turns a fresh result into what is handed back (e.g. already marshalled), or raises
        `Undeliverable`: such a result is not stored, and the claim is released.
        """
        if self.cache is not None:
            cached = self.cache.get(key, self.clock())
            if cached is not None:
                return Outcome(codec.decode(cached), True)
        owner = os.urandom(16).hex()
        record = self._claim(key, owner, remaining_ms)
        if record is not None:
            return self._replay(record)
        return Outcome(self._invoke(key, owner, invoke, deliver), False)

    def _claim(self, key: str, owner: str, remaining_ms: int) -> Record | None:
        for _ in range(MAX_CLAIM_ATTEMPTS):
            now = self.clock()
            in_progress_until = int(now * 1000) + max(0, remaining_ms)
            # A claim must not expire (and be taken) while its invocation may still be running.
            expires_at = max(int(now) + self.ttl_seconds, -(-in_progress_until // 1000))
            record = self.store.claim(key, owner, now, in_progress_until, expires_at)
            if record is None or record.owner == owner:  # ours: the transport retried our own write
                return None
            now = self.clock()
            if not record.is_expired(now):
                if record.status == COMPLETED:
                    return record
                if not record.is_claim_expired(now):
                    until = record.in_progress_until or record.expires_at * 1000
                    raise IdempotencyAlreadyInProgressError(
                        f"another invocation is running key {key!r}; its claim expires at {_when(until)}"
                    )
            # The table saw a live record that this clock sees as expired: claim again.
        raise IdempotencyClaimConflictError(
            f"claiming key {key!r} failed {MAX_CLAIM_ATTEMPTS} times on a record this clock sees as expired; "
            "the client clock and the table disagree"
        )

    def _replay(self, record: Record) -> Outcome:
        result = record.result
        if result is None:
            raise IdempotencyPersistenceLayerError(f"record {record.key!r} is completed but has no result format")
        if result.format == codec.TOO_LARGE:
            raise IdempotencyResultTooLargeError(
                f"key {record.key!r} already ran, but its result was too large to store "
                f"(over {codec.ITEM_LIMIT - codec.RECORD_OVERHEAD} bytes compressed) or held text that cannot be "
                "encoded, so it cannot be replayed"
            )
        value = codec.decode(result)
        if self.cache is not None:
            self.cache.put(record.key, record.expires_at, result)
        return Outcome(value, True)

    def _invoke(self, key: str, owner: str, invoke: Callable[[], Any], deliver: Callable[[Any], Any] | None) -> Any:
        try:
            value = invoke()
        except BaseException:
            self._release(key, owner)
            raise
        delivered = value
        if deliver is not None:
            try:
                delivered = deliver(value)
            except Undeliverable:
                self._release(key, owner)
                return value
        try:
            result = codec.encode(value)
        except codec.ResultNotEncodable:
            logger.error("result of key %r cannot be stored; replays will fail", key, exc_info=True)
            result = codec.Encoded(codec.TOO_LARGE, None)
        if result.format == codec.TOO_LARGE:
            logger.warning("result of key %r is too large to store; replays will raise", key)
        expires_at = int(self.clock()) + self.ttl_seconds
        try:
            completed = self.store.complete(key, owner, result, expires_at)
        except IdempotencyPersistenceLayerError:
            # The handler ran: failing now would make the caller retry into a second run.
            logger.error("completing key %r failed; returning the result anyway", key, exc_info=True)
            return delivered
        if not completed:
            logger.error("claim on key %r expired and was taken over before completion; returning our result", key)
        elif self.cache is not None:
            self.cache.put(key, expires_at, result)
        return delivered

    def _release(self, key: str, owner: str) -> None:
        try:
            if not self.store.release(key, owner):
                logger.warning("claim on key %r was taken over before release; left it alone", key)
        except Exception:
            logger.error("releasing key %r failed; it stays claimed until its deadline", key, exc_info=True)
