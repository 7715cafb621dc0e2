"""The escape hatch, `IDEMPOTENCY_TRANSPORT=boto3`: a plain boto3 client, its errors reshaped into
`DynamoDBError`. Nothing of botocore is driven by hand: its own retries (standard mode), its own HTTP. A client's
timeouts are fixed, so a call that might outlast its deadline is waited for on a thread."""

from __future__ import annotations

import os

from ...deadline import Deadline, within
from .errors import CHECK_FAILED, DEADLINE, NOT_SENT, DynamoDBError, out_of_time
from .wire import PARSER_ERROR, json_object, unreadable, unreadable_error

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Boto3Transport", "worst_case_s"]

_SERVICE = "dynamodb"


def worst_case_s(connect_timeout: float, read_timeout: float, max_attempts: int) -> float:
    """The longest a call may take: every attempt timing out, and the longest backoff between them
    (standard mode's cap doubles from 1 s to 20 s, and an `x-amz-retry-after` may add up to 5 s to each),
    with a second to spare. DNS lookups and credential refreshes have no timeout of their own."""
    backoff = sum(min(20.0, 2.0**i) + 5.0 for i in range(max_attempts - 1))
    return max_attempts * (connect_timeout + read_timeout) + backoff + 1.0


class Boto3Transport:
    """A plain boto3 client; its errors reshaped into DynamoDBError."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, max_attempts: int) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

        self._client_error = ClientError
        self._botocore_error = BotoCoreError
        # botocore's `max_attempts` counts retries only; `total_max_attempts` counts the first attempt too.
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": max_attempts, "mode": "standard"},
        )
        self._worst_case = worst_case_s(connect_timeout, read_timeout, max_attempts)
        self._max_attempts = max_attempts
        try:
            self.client = boto3.client(_SERVICE, config=config)
        except NoRegionError:
            # botocore reads only AWS_DEFAULT_REGION and the config file; Lambda also sets AWS_REGION.
            if not os.environ.get("AWS_REGION"):
                raise
            self.client = boto3.client(_SERVICE, region_name=os.environ["AWS_REGION"], config=config)
        self.region = self.client.meta.region_name
        self.endpoint = self.client.meta.endpoint_url
        self._methods: dict[str, Any] = {}
        # botocore reads a 200 whose body is not JSON as an empty success (a claim that failed its condition
        # would look taken) and makes a body it cannot parse an error's message: both are refused before it
        # parses them, through the client's public `before-parse` event.
        self.client.meta.events.register(f"before-parse.{_SERVICE}", _refuse_unreadable)
        _QUIET.attach()

    def call(self, operation: str, params: dict, deadline: Deadline | None = None) -> dict:
        if deadline is not None and deadline.left() < self._worst_case:
            return _within(deadline, operation, lambda: self._call(operation, params))
        return self._call(operation, params)

    def _call(self, operation: str, params: dict) -> dict:
        method = self._methods.get(operation)
        if method is None:
            from botocore import xform_name

            method = self._methods[operation] = getattr(self.client, xform_name(operation))
        _QUIET.on()
        try:
            return method(**params)
        except self._client_error as error:
            response = error.response
            err = response.get("Error", {})
            code = err.get("Code", "")
            item = response.get("Item") if code == CHECK_FAILED else None
            metadata = response.get("ResponseMetadata", {})
            status = metadata.get("HTTPStatusCode")
            # botocore does not say how its earlier attempts ended: any of them may have been applied.
            uncertain = (status or 500) >= 500 or metadata.get("RetryAttempts", 0) > 0
            raise DynamoDBError(operation, code, err.get("Message", ""), item, status, uncertain) from error
        except self._botocore_error as error:
            code = type(error).__name__
            uncertain = code not in NOT_SENT or self._max_attempts > 1
            raise DynamoDBError(operation, code, str(error), uncertain=uncertain) from error
        except _Unreadable as error:
            raise DynamoDBError(operation, PARSER_ERROR, str(error), None, error.status, uncertain=True) from error
        except Exception as error:  # botocore tripped on an answer (e.g. an x-amz-crc32 that is no integer)
            raise DynamoDBError(operation, type(error).__name__, "the answer could not be read",
                                uncertain=True) from error
        finally:
            _QUIET.off()


class _Quiet:
    """Drops the log records botocore and urllib3 write while this thread makes one of the layer's calls: at DEBUG
    (AWS_LAMBDA_LOG_LEVEL=DEBUG sets the root logger's level) botocore logs each request's body and each answer's,
    a stored result among them, and the layer's logs never carry event or result content. A logger's filter sees
    only its own records, so it goes on each of their loggers; a call of the function's own boto3 clients, on any
    thread, is logged as before."""

    def __init__(self) -> None:
        import threading

        self._local = threading.local()
        self._attached: set[str] = set()

    def on(self) -> None:
        self._local.active = True

    def off(self) -> None:
        self._local.active = False

    def filter(self, record: object) -> bool:
        return not getattr(self._local, "active", False)

    def attach(self) -> None:
        """On every botocore, boto3 and urllib3 logger there is, and on those of the modules a call may import
        only when it first runs (a logger is the same object whether its module or this makes it first)."""
        import logging

        for name in [*_LATE_LOGGERS, *logging.Logger.manager.loggerDict]:
            if name not in self._attached and name.split(".")[0] in ("botocore", "boto3", "urllib3", "s3transfer"):
                logging.getLogger(name).addFilter(self)
                self._attached.add(name)


_LATE_LOGGERS = ("botocore.endpoint", "botocore.parsers", "botocore.hooks", "botocore.auth", "botocore.retryhandler",
                 "botocore.retries.standard", "botocore.retries.adaptive", "botocore.retries.special",
                 "botocore.httpsession", "botocore.awsrequest", "botocore.httpchecksum", "botocore.response",
                 "botocore.credentials", "botocore.utils", "botocore.client", "botocore.regions",
                 "botocore.endpoint_provider", "urllib3.connectionpool", "urllib3.connection", "urllib3.response",
                 "urllib3.util.retry")


_QUIET = _Quiet()


def _within(deadline: Deadline, operation: str, call: Any) -> dict:
    """`call()` waited for until `deadline`. A call still running then is left to finish on its own; the writes
    the cycle bounds this way are conditioned on the owner token, so landing late is harmless."""
    left = deadline.attempt_time()
    if left is None:
        raise out_of_time(operation)
    try:
        return within(left, call, f"idempotency-{operation}")
    except TimeoutError:  # still in flight: it may land
        raise DynamoDBError(operation, DEADLINE, f"no answer within the {left:.2f} s the invocation had left",
                            uncertain=True) from None


class _Unreadable(Exception):
    """An answer whose body is not DynamoDB's JSON: nothing says what it answered, or whether it was applied."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(unreadable(body))
        self.status = status


def _refuse_unreadable(response_dict: dict, **_: Any) -> None:
    body = response_dict.get("body") or b""
    status = response_dict.get("status_code") or 0
    if (status < 300 and not json_object(body)) or (status >= 300 and unreadable_error(status, body)):
        raise _Unreadable(status, body)
