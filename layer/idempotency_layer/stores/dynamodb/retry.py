"""The retry rule: botocore's standard retry mode (botocore.retries.standard, .quota, .special), as data.

Which answers are retried (throttles, transient errors, failed sends, a CRC32 mismatch, the one modeled
retryable error), the backoff (full jitter from a 1 s base for throttles and DynamoDB's 25 ms for the rest,
capped at 20 s, `x-amz-retry-after` honoured) and the retry quota shared by a client's calls.
tests/unit/test_dynamodb_retry.py checks the decisions and the quota against botocore's own on generated
sequences, and the modeled errors against botocore's DynamoDB model.
"""

from __future__ import annotations

import random as _random
import threading
from collections.abc import Mapping

from .errors import CHECK_FAILED

__all__ = ["MODELED_ERRORS", "RETRYABLE_MODELED", "Retry"]

_TRANSIENT_CODES = frozenset(("RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"))
_TRANSIENT_STATUSES = frozenset((500, 502, 503, 504))
_THROTTLE_CODES = frozenset(
    (
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    )
)

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any
# Each operation's modeled errors (a 429 is a throttle only when its code is not one of them) and the one
# marked retryable (not as a throttle). tests/unit/test_dynamodb_retry.py checks these against botocore's model.
_COMMON_ERRORS = frozenset(
    (
        "ProvisionedThroughputExceededException",
        "ResourceNotFoundException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ThrottlingException",
    )
)
_WRITE_ERRORS = _COMMON_ERRORS | {
    CHECK_FAILED,
    "ItemCollectionSizeLimitExceededException",
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
}
MODELED_ERRORS = {
    "PutItem": _WRITE_ERRORS,
    "UpdateItem": _WRITE_ERRORS,
    "DeleteItem": _WRITE_ERRORS,
    "GetItem": _COMMON_ERRORS,
    "BatchGetItem": _COMMON_ERRORS,
}
_CONFLICT = frozenset(("ReplicatedWriteConflictException",))
RETRYABLE_MODELED = {"PutItem": _CONFLICT, "UpdateItem": _CONFLICT, "DeleteItem": _CONFLICT}
_EMPTY: frozenset[str] = frozenset()

_QUOTA_CAPACITY = 500
_RETRY_COST = 14
_THROTTLING_RETRY_COST = 5
_NO_RETRY_INCREMENT = 1
_THROTTLING_BASE = 1.0
_TRANSIENT_BASE = 0.025  # DynamoDB's
_MAX_BACKOFF = 20.0
_RETRY_AFTER_MAX_ADDITIONAL = 5.0


class Retry:
    """The standard retry mode's decision, backoff and retry quota, for one transport (the quota is shared)."""

    def __init__(self, max_attempts: int, random: Any = _random.random) -> None:
        self.max_attempts = max_attempts
        self._random = random
        self._lock = threading.Lock()
        self.capacity = _QUOTA_CAPACITY

    def delay(
        self,
        operation: str,
        attempt: int,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        failed_send: bool = False,
        crc_mismatch: bool = False,
    ) -> tuple[float, int] | None:
        """(seconds to wait, quota taken) before the next attempt, or None: give up.

        `code` is the parsed error code (None without a parsed error: a failed send, a damaged body).
        """
        if attempt >= self.max_attempts:
            return None
        modeled = MODELED_ERRORS.get(operation, _EMPTY)
        retryable_modeled = code is not None and code in RETRYABLE_MODELED.get(operation, _EMPTY)
        throttle_status = status == 429 and not (code is not None and code in modeled)
        throttle_code = code in _THROTTLE_CODES
        if not (
            code in _TRANSIENT_CODES
            or status in _TRANSIENT_STATUSES
            or failed_send
            or throttle_code
            or throttle_status
            or retryable_modeled
            or crc_mismatch
        ):
            return None
        # The one modeled retryable error is transient, so a throttle is a code or a bare 429.
        throttling = throttle_code or (not retryable_modeled and throttle_status)
        cost = _THROTTLING_RETRY_COST if throttling else _RETRY_COST
        with self._lock:
            if cost > self.capacity:
                return None
            self.capacity -= cost
        base = _THROTTLING_BASE if throttling else _TRANSIENT_BASE
        wait = self._random() * min(base * 2 ** (attempt - 1), _MAX_BACKOFF)
        after = _retry_after(headers)
        if after is not None:
            wait = max(wait, min(after, _RETRY_AFTER_MAX_ADDITIONAL + wait))
        return wait, cost

    def succeeded(self, taken: int) -> None:
        """A 2xx answer: give back the last retry's quota, or one unit when the call needed no retry."""
        if self.capacity >= _QUOTA_CAPACITY:  # full, as it nearly always is: nothing to give back, no lock taken
            return
        amount = taken or _NO_RETRY_INCREMENT
        with self._lock:
            self.capacity = min(_QUOTA_CAPACITY, self.capacity + amount)


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    if headers is None:
        return None
    value = headers.get("x-amz-retry-after")
    if value is None:
        return None
    try:
        seconds = int(value) / 1000.0
    except (ValueError, OverflowError):
        return None
    return None if seconds < 0 else seconds
