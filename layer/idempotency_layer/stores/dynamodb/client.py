"""The attempt loop: one DynamoDB request, signed, sent, read and retried, within a deadline.

    call(operation, params, deadline)
      body = wire.encode_body(params)                          once per call
      loop, one attempt each time:
        deadline.attempt_time()     None -> InvocationDeadline (uncertain if an earlier attempt was)
        sign (sigv4, fresh X-Amz-Date, the target's current credentials)
        pool.send(...)              SendError -> failure (uncertain if it may have been sent)
        wire.answer_error(...)      None -> success: give back retry quota, return the decoded answer
        retry.delay(...)            None, or a backoff the deadline cannot fit -> raise the failure
        sleep, next attempt

Each concern has its module: the deadline rule in `deadline`, the retry rule in `retry`, the error model in
`errors` (`uncertain` accumulates over a call's attempts: any attempt that may have been applied makes the
failure uncertain, and so does a free re-send after a dead connection, whatever it was answered), the protocol
in `wire`, the HTTP in `connection`.
"""

from __future__ import annotations

import random as _random
import time
from urllib.parse import urlsplit

from ...aws.environment import unsendable
from ...aws.sigv4 import Signer
from ...aws.target import Credentials, Target, request_target
from ...deadline import Deadline, within
from . import wire
from .connection import Budget, Pool, SendError
from .errors import DEADLINE, DynamoDBError, out_of_time
from .retry import Retry

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Client"]

_SERVICE = "dynamodb"


class Client:
    """DynamoDB JSON 1.0 over `connection.Pool`, signed by `sigv4`, retried as botocore's standard mode."""

    def __init__(
        self,
        target: Target,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        sleep: Any = time.sleep,
        random: Any = _random.random,
    ) -> None:
        self.target = target
        self.region = target.region
        self.endpoint = target.endpoint
        parts = urlsplit(target.endpoint)
        scheme, netloc = parts.scheme, parts.netloc
        self._request = request_target(target.endpoint)
        # Host as botocore signs it: no default port.
        default = ":443" if scheme.lower() == "https" else ":80"
        self._host = netloc[: -len(default)] if netloc.endswith(default) else netloc
        self.pool = Pool(target.endpoint, connect_timeout=connect_timeout, read_timeout=read_timeout,
                         cafile=target.cafile, proxy=target.proxy, tcp_keepalive=target.tcp_keepalive)
        self.retry = Retry(max_attempts, random)
        self._sleep = sleep
        self._signed_by: tuple[Credentials | None, Signer | None] = (None, None)
        self._headers: dict[str, dict[str, str]] = {}

    def _signer(self, operation: str, left: float) -> Signer:
        """The signer for the target's credentials now. A refresh that may wait on the network (botocore's
        container or web identity credentials) gets the attempt's time (`left`), as a request would: nothing is
        sent when it runs out."""
        target = self.target
        try:
            if target.may_wait is not None and target.may_wait():
                credentials = within(left, target.credentials, "idempotency-credentials")
            else:
                credentials = target.credentials()
        except TimeoutError:
            raise DynamoDBError(operation, DEADLINE, "getting the credentials took all the time the attempt had; "
                                "nothing was sent") from None
        except Exception as error:  # the source could not get them (a refresh failed): nothing was sent
            # Its message is not shown: it may quote what a credential endpoint answered.
            raise DynamoDBError(operation, type(error).__name__, "getting the credentials failed; nothing was sent"
                                ) from error
        if credentials is None:
            raise DynamoDBError(operation, "NoCredentialsError", "Unable to locate credentials")
        known, signer = self._signed_by
        if credentials != known or signer is None:
            if unsendable(credentials.access_key) or (credentials.token and unsendable(credentials.token)):
                raise DynamoDBError(operation, "UnsendableCredentials", "the credentials hold a character that "
                                    "cannot be sent in an HTTP header (a CR, LF, NUL or one outside Latin-1)")
            signer = Signer(credentials.access_key, credentials.secret_key, credentials.token, self.region,
                            _SERVICE)
            self._signed_by = (credentials, signer)
        return signer

    def _base(self, operation: str) -> dict[str, str]:
        headers = self._headers.get(operation)
        if headers is None:
            headers = self._headers[operation] = {
                "Content-Type": wire.CONTENT_TYPE,
                "Host": self._host,
                "X-Amz-Target": wire.TARGET_PREFIX + operation,
            }
        return headers

    def call(self, operation: str, params: dict, deadline: Deadline | None = None) -> dict:
        """One request, retried as botocore's standard mode; with `deadline`, every attempt (its free re-send
        on a new connection included) ends by what `Deadline.attempt_time` gives, and no backoff that would end
        past the deadline is waited out."""
        body = wire.encode_body(params)
        base = self._base(operation)
        budget = Budget()  # one per call: its one free re-send after a dead kept-alive connection
        attempt = 1
        taken = 0
        uncertain = False  # an attempt of this call may have been applied
        while True:
            if deadline is None:
                left = self.pool.attempt_s  # the connect and read timeouts together
            else:
                cut = deadline.attempt_time()
                if cut is None:  # the backoff overslept the deadline
                    raise out_of_time(operation, uncertain)
                left = cut
            budget.attempt(left)
            headers = self._signer(operation, left).sign(base, body, path=self._request.signed_path,
                                                         query=self._request.signed_query)  # a fresh X-Amz-Date
            headers["User-Agent"] = "idempotency-layer md/transport#lean"
            headers["Accept-Encoding"] = "identity"  # no compressed answer: the CRC32 is of the body as sent
            answer_headers = None
            failure: DynamoDBError | None
            try:
                answer = self.pool.send(headers, body, budget)
            except SendError as error:
                failure = DynamoDBError(operation, error.code, str(error))
                uncertain = uncertain or error.sent
                failed_send = True
            else:
                failed_send = False
                answer_headers = answer.headers
                failure = wire.answer_error(operation, answer.status, answer.headers, answer.body)
                if failure is None:
                    self.retry.succeeded(taken)
                    return wire.decode_answer(operation, answer.status, answer.body)
                # A request re-sent after its kept-alive connection died may have been applied by the first
                # send, whatever the re-send was answered (a throttle, a failed condition): never certain.
                uncertain = uncertain or failure.uncertain or not budget.resend
            crc = failure.code == wire.CHECKSUM_ERROR
            decision = self.retry.delay(
                operation,
                attempt,
                status=failure.status,
                code=None if failed_send or crc else failure.code,
                headers=answer_headers,
                failed_send=failed_send,
                crc_mismatch=crc,
            )
            if decision is None or (deadline is not None and not deadline.allows(decision[0])):
                # The call's error: this attempt's answer, uncertain if any attempt may have been applied.
                if failure.uncertain == uncertain:
                    raise failure
                raise DynamoDBError(operation, failure.code, failure.message, failure.item, failure.status, uncertain)
            wait, taken = decision
            self._sleep(wait)
            attempt += 1

