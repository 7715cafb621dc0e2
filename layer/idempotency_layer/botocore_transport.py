"""The botocore-based transports: `LeanTransport` (DynamoDB JSON 1.0 over botocore's credentials, SigV4,
endpoint rules and standard-mode retries) for every environment the fast transport does not serve, and
`Boto3Transport`. Imported only when one of them is built (see transport.make_transport).
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from hashlib import sha256
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import urllib3
from botocore import exceptions as bce
from botocore.auth import SigV4Auth, _host_from_url
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError, ChecksumError, NoRegionError
from botocore.parsers import JSONParser
from botocore.retries import quota, standard

from .fast import after_fork
from .transport import (
    _NOT_SENT,
    CHECK_FAILED,
    DynamoDBError,
    _out_of_time,
    _time_left,
    _within,
    condition_item,
    crc32_ok,
    decode_answer,
    encode_body,
    json_object,
    unreadable,
    unreadable_error,
    worst_case_s,
)

if TYPE_CHECKING:
    from botocore.session import Session

_SERVICE = "dynamodb"
_API_VERSION = "2012-08-10"
_TARGET_PREFIX = "DynamoDB_20120810."
_CONTENT_TYPE = "application/x-amz-json-1.0"
_CRC32_HEADER = "x-amz-crc32"
_MAX_POOL_CONNECTIONS = 10  # botocore's default


def resolve_region(session: Session) -> str | None:
    # botocore reads only AWS_DEFAULT_REGION and the config file; Lambda also sets AWS_REGION (other SDKs read it).
    return session.get_config_variable("region") or os.environ.get("AWS_REGION") or None


# -- lean ----------------------------------------------------------------------------------------------------


class _ErrorShape(NamedTuple):
    name: str
    metadata: dict


class _ServiceModel(NamedTuple):
    service_name: str


class _OperationModel(NamedTuple):
    name: str
    error_shapes: tuple[_ErrorShape, ...]
    service_model: _ServiceModel


# The part of the DynamoDB service model that botocore's standard retry mode reads: each operation's modeled
# errors (a 429 is a throttle only when its code is not one of them) and which are marked retryable.
# tests/unit/test_transport.py checks this against the installed botocore's model.
_RETRYABLE_CONFLICT = _ErrorShape("ReplicatedWriteConflictException", {"retryable": {"throttling": False}})
_COMMON_ERRORS = tuple(
    _ErrorShape(name, {})
    for name in (
        "ProvisionedThroughputExceededException",
        "ResourceNotFoundException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ThrottlingException",
    )
)
_WRITE_ERRORS = (
    *_COMMON_ERRORS,
    _ErrorShape(CHECK_FAILED, {}),
    _ErrorShape("ItemCollectionSizeLimitExceededException", {}),
    _ErrorShape("TransactionConflictException", {}),
    _RETRYABLE_CONFLICT,
)
_DYNAMODB = _ServiceModel(_SERVICE)
_OPERATIONS = {
    "PutItem": _OperationModel("PutItem", _WRITE_ERRORS, _DYNAMODB),
    "UpdateItem": _OperationModel("UpdateItem", _WRITE_ERRORS, _DYNAMODB),
    "DeleteItem": _OperationModel("DeleteItem", _WRITE_ERRORS, _DYNAMODB),
    "GetItem": _OperationModel("GetItem", _COMMON_ERRORS, _DYNAMODB),
}


_error_parser = JSONParser()


def parse_error(status: int, headers: Any, body: bytes) -> dict:
    """The error of a non-2xx answer, the way boto3 parses it: `{"Error": {"Code": ..., "Message": ...}}`.

    botocore's JSON parser strips `com.amazonaws.dynamodb.v20120810#`, reads `message`/`Message`, and turns
    an empty or HTML 5xx body (a load balancer's) into code `"503"` and the status's reason.
    """
    return _error_parser.parse({"status_code": status, "headers": headers, "body": body}, None)


class _RetryPolicy:
    """botocore's standard retry mode, driven by hand: the same conditions, backoff and retry quota.

    Retries throttles (1 s base) and transient errors (5xx, connection errors, timeouts, a CRC32 mismatch;
    DynamoDB's 25 ms base), full jitter, capped at 20 s, `x-amz-retry-after` honoured, `max_attempts` in all.
    """

    def __init__(self, max_attempts: int, sleep: Any = time.sleep, random: Any = None) -> None:
        throttling = standard.ThrottlingErrorDetector(standard.RetryEventAdapter())
        jitter = {} if random is None else {"random": random}  # tests pin the jitter
        backoff = standard.ExponentialBackoff(service_name=_SERVICE, throttling_detector=throttling, **jitter)
        self.max_attempts = max_attempts
        self._policy = standard.RetryPolicy(
            retry_checker=standard.StandardRetryConditions(max_attempts=max_attempts), retry_backoff=backoff
        )
        self._quota = standard.RetryQuotaChecker(quota.RetryQuota(), throttling)
        self._sleep = sleep

    def context(
        self,
        operation: str,
        attempt: int,
        request_context: dict,
        *,
        http_response: Any = None,
        parsed_response: dict | None = None,
        caught_exception: Exception | None = None,
    ) -> standard.RetryContext:
        return standard.RetryContext(
            attempt_number=attempt,
            operation_model=_OPERATIONS.get(operation) or _OperationModel(operation, (), _DYNAMODB),
            parsed_response=parsed_response,
            http_response=http_response,
            caught_exception=caught_exception,
            request_context=request_context,
        )

    def delay(self, context: standard.RetryContext) -> float | None:
        """Seconds to wait before the next attempt, or None: give up."""
        if self._policy.should_retry(context) and self._quota.acquire_retry_quota(context):
            return self._policy.compute_retry_delay(context)
        return None

    def wait(self, seconds: float) -> None:
        self._sleep(seconds)

    def succeeded(self, request_context: dict, http_response: Any) -> None:
        self._quota.release_retry_quota(request_context, http_response)


def configured_endpoint(session: Session) -> str | None:
    """The endpoint URL the user configured for DynamoDB, as a boto3 client would find it.

    AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, then the config file's `services` section and `endpoint_url`;
    none of them under AWS_IGNORE_CONFIGURED_ENDPOINT_URLS / `ignore_configured_endpoint_urls`.
    """
    from botocore.utils import ensure_boolean

    if ensure_boolean(session.get_config_variable("ignore_configured_endpoint_urls") or False):
        return None
    try:
        from botocore.configprovider import ConfiguredEndpointProvider  # botocore >= 1.31, marked private
    except ImportError:  # pragma: no cover - older botocore: the two environment variables only
        return os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or os.environ.get("AWS_ENDPOINT_URL") or None
    provider = ConfiguredEndpointProvider(
        full_config=session.full_config, scoped_config=session.get_scoped_config(), client_name=_SERVICE
    )
    return provider.provide() or None


def regional_endpoint(session: Session, region: str, account_id: str | None = None) -> str:
    """DynamoDB's endpoint for `region` from botocore's endpoint rule set (partitions, FIPS, dual-stack,
    account-based endpoints), without the service model a boto3 client loads."""
    from botocore.endpoint_provider import EndpointProvider
    from botocore.exceptions import DataNotFoundError
    from botocore.utils import ensure_boolean

    loader = session.get_component("data_loader")
    try:  # by path: finding the latest API version lists every service's directory (~10 ms)
        ruleset = loader.load_data(f"{_SERVICE}/{_API_VERSION}/endpoint-rule-set-1")
    except DataNotFoundError:  # pragma: no cover - a botocore that moved its data
        ruleset = loader.load_service_model(_SERVICE, "endpoint-rule-set-1")
    provider = EndpointProvider(ruleset_data=ruleset, partition_data=loader.load_data("partitions"))
    params: dict[str, Any] = {
        "Region": region,
        "UseFIPS": ensure_boolean(session.get_config_variable("use_fips_endpoint") or False),
        "UseDualStack": ensure_boolean(session.get_config_variable("use_dualstack_endpoint") or False),
    }
    mode = session.get_config_variable("account_id_endpoint_mode")
    if mode:
        params["AccountIdEndpointMode"] = mode
        if account_id and mode != "disabled":
            params["AccountId"] = account_id
    return provider.resolve_endpoint(**params).url


class _Response(NamedTuple):
    # The three things botocore's retry checkers read from a response (as on its AWSResponse).
    status_code: int
    headers: Any  # case-insensitive mapping
    content: bytes


class _PoolHTTP:
    """One urllib3 connection pool to the endpoint, kept alive across calls.

    It is botocore's URLLib3Session.send without its per-request URL parsing, pool lookup and header copying
    (~70 us of CPU a call here); urllib3's exceptions become the same botocore ones that send raises, so the
    error codes and the retry decisions are the boto3 client's.
    """

    def __init__(self, endpoint: str, timeout: tuple[float, float], verify: Any, socket_options: list) -> None:
        from botocore.httpsession import create_urllib3_context, get_cert_path

        self._endpoint = endpoint
        self._path = urlsplit(endpoint).path or "/"
        self._timeout = timeout
        options: dict[str, Any] = {
            "timeout": urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            "maxsize": _MAX_POOL_CONNECTIONS,
            "retries": False,
            "socket_options": socket_options,
        }
        if endpoint.lower().startswith("https:"):
            options["ssl_context"] = create_urllib3_context()
            options["cert_reqs"] = "CERT_REQUIRED" if verify else "CERT_NONE"
            options["ca_certs"] = get_cert_path(verify) if verify else None
        self._options = options
        self._pool = urllib3.connection_from_url(endpoint, **options)
        after_fork(self, _PoolHTTP._forget)

    def _forget(self) -> None:
        # In a forked child the pool's connections are the parent's too: the child gets a pool of its own (the
        # old one is dropped, not closed: its lock may have been held at the fork).
        self._pool = urllib3.connection_from_url(self._endpoint, **self._options)

    bounded = True  # send() takes `left`: its timeouts are cut to the time left

    def send(self, request: AWSRequest, body: bytes, left: float | None = None) -> _Response:
        errors = urllib3.exceptions
        extra: dict[str, Any] = {}
        if left is not None:
            # `total` bounds connecting and reading together (each recv() still has the read timeout of its own).
            extra["timeout"] = urllib3.Timeout(
                total=left, connect=min(self._timeout[0], left), read=min(self._timeout[1], left)
            )
        try:
            raw = self._pool.urlopen(
                "POST", self._path, body=body, headers=dict(request.headers.items()), decode_content=False, **extra
            )
            return _Response(raw.status, raw.headers, raw.data)
        # The mapping of botocore.httpsession.URLLib3Session.send, in its order (NewConnectionError is a
        # urllib3 ConnectTimeoutError).
        except errors.SSLError as error:
            raise bce.SSLError(endpoint_url=self._endpoint, error=error) from error
        except (errors.NewConnectionError, socket.gaierror) as error:
            raise bce.EndpointConnectionError(endpoint_url=self._endpoint, error=error) from error
        except errors.ConnectTimeoutError as error:
            raise bce.ConnectTimeoutError(endpoint_url=self._endpoint, error=error) from error
        except errors.ReadTimeoutError as error:
            raise bce.ReadTimeoutError(endpoint_url=self._endpoint, error=error) from error
        except errors.ProtocolError as error:
            raise bce.ConnectionClosedError(error=error, request=request, endpoint_url=self._endpoint) from error
        except Exception as error:
            raise bce.HTTPClientError(error=error) from error


class _SessionHTTP:
    """botocore's own HTTP session, for an endpoint reached through a proxy (HTTPS_PROXY and friends)."""

    def __init__(
        self, endpoint: str, timeout: tuple[float, float], verify: Any, socket_options: list, proxies: dict
    ) -> None:
        from botocore.httpsession import URLLib3Session

        self._session = URLLib3Session(
            verify=verify,
            proxies=proxies,
            timeout=timeout,
            max_pool_connections=_MAX_POOL_CONNECTIONS,
            socket_options=socket_options,
        )

    bounded = False  # botocore's session keeps its timeouts: a bounded call waits for it on a thread

    def send(self, request: AWSRequest, body: bytes, left: float | None = None) -> Any:
        return self._session.send(request.prepare())


class _SigV4Auth(SigV4Auth):
    """botocore's SigV4, hashing the body bytes as they are: `request.body` would prepare the request again."""

    def payload(self, request: AWSRequest) -> str:
        return sha256(request.data).hexdigest()


class LeanTransport:
    """DynamoDB JSON 1.0 over botocore's credentials, SigV4, endpoint rules and standard-mode retries."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        session: Session | None = None,
        sleep: Any = time.sleep,
    ) -> None:
        from botocore import __version__ as botocore_version
        from botocore.utils import get_environ_proxies, is_valid_endpoint_url, is_valid_ipv6_endpoint_url

        if session is None:
            from botocore.session import Session

            session = Session()
        # The whole provider chain; a RefreshableCredentials refreshes itself, so it is frozen per request.
        self._credentials = session.get_credentials()
        region = resolve_region(session)
        if not region:
            raise NoRegionError()
        self.region = region
        endpoint = configured_endpoint(session)
        if endpoint is None:
            account_id = None
            if self._credentials is not None:
                account_id = getattr(self._credentials.get_frozen_credentials(), "account_id", None)
            endpoint = regional_endpoint(session, region, account_id)
        if not (is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)):
            raise ValueError(f"Invalid endpoint: {endpoint}")
        self.endpoint = endpoint
        self._url = endpoint if urlsplit(endpoint).path else endpoint + "/"  # JSON 1.0 POSTs to the root
        user_agent = f"idempotency-layer Botocore/{botocore_version} md/transport#lean"
        self._headers: dict[str, dict[str, str]] = {}
        # Host given up front: SigV4Auth would otherwise parse the URL for it twice per request.
        self._header_base = {"Content-Type": _CONTENT_TYPE, "User-Agent": user_agent, "Host": _host_from_url(endpoint)}
        self.retry = _RetryPolicy(max_attempts, sleep)
        self._worst_case = worst_case_s(connect_timeout, read_timeout, max_attempts)
        # What a boto3 client's endpoint would use: CA bundle, TCP options, proxies from the environment.
        verify = session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE") or True
        socket_options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        if session.get_config_variable("tcp_keepalive"):
            socket_options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
        timeout = (connect_timeout, read_timeout)
        proxies = get_environ_proxies(endpoint)
        self._http: _PoolHTTP | _SessionHTTP
        if proxies.get(urlsplit(endpoint).scheme):
            self._http = _SessionHTTP(endpoint, timeout, verify, socket_options, proxies)
        else:
            self._http = _PoolHTTP(endpoint, timeout, verify, socket_options)

    def call(self, operation: str, params: dict, deadline: float | None = None) -> dict:
        if deadline is not None and not self._http.bounded and deadline - time.monotonic() < self._worst_case:
            return _within(deadline, operation, lambda: self._call(operation, params, deadline))
        return self._call(operation, params, deadline)

    def _call(self, operation: str, params: dict, deadline: float | None) -> dict:
        body = encode_body(params)
        retry = self.retry
        request_context: dict = {}
        attempt = 1
        uncertain = False  # an attempt of this call may have been applied
        while True:
            response = None
            parsed = None
            caught: Exception | None = None
            left = None
            if deadline is not None:
                left = _time_left(deadline)
                if left is None:  # the backoff overslept the deadline
                    raise _out_of_time(operation, uncertain)
            try:
                response = self._send(operation, body, left)
            except BotoCoreError as error:
                caught = error
                failure = DynamoDBError(operation, type(error).__name__, str(error))
                uncertain = uncertain or failure.code not in _NOT_SENT
            else:
                content = response.content
                status = response.status_code
                if not crc32_ok(response.headers, content):
                    # Damaged on the way: nothing in the body can be trusted, so it is not parsed.
                    mismatch = ChecksumError(
                        checksum_type="crc32",
                        expected_checksum=response.headers.get(_CRC32_HEADER),
                        actual_checksum=zlib.crc32(content),
                    )
                    failure = DynamoDBError(operation, ChecksumError.__name__, str(mismatch), None, status)
                    uncertain = True
                    # botocore's retry check reads the header as an integer: one that is not (empty, hex, two
                    # values) is shown to it as the mismatch it is, not raised as a ValueError.
                    headers = urllib3.HTTPHeaderDict(response.headers)
                    headers[_CRC32_HEADER] = str((zlib.crc32(content) + 1) & 0xFFFFFFFF)
                    response = _Response(status, headers, content)
                elif status < 300:
                    retry.succeeded(request_context, response)
                    return decode_answer(operation, status, content)
                else:
                    try:
                        error_part = parse_error(status, response.headers, content)["Error"]
                        code, message = str(error_part["Code"]), str(error_part["Message"])
                    except Exception:  # a body botocore's parser trips on: the status is all there is
                        code, message = str(status), "an error answer that cannot be read"
                    # A failed condition's code came from the JSON object's __type: checked no further (a replay's
                    # answer carries the whole record).
                    damaged = code != CHECK_FAILED and unreadable_error(status, content)
                    if damaged:
                        message = unreadable(content)  # botocore made the body the message: it may hold a result
                    parsed = {"Error": {"Code": code, "Message": message}}
                    failure = DynamoDBError(operation, code, message, condition_item(code, content), status)
                    # A 5xx says nothing of whether it was applied, nor does an answer that is not DynamoDB's
                    # JSON (a 400 cut short may have answered a claim that landed).
                    uncertain = uncertain or status >= 500 or damaged
            context = retry.context(
                operation,
                attempt,
                request_context,
                http_response=response,
                parsed_response=parsed,
                caught_exception=caught,
            )
            delay = retry.delay(context)
            if delay is None or (deadline is not None and time.monotonic() + delay >= deadline):
                failure.uncertain = uncertain
                raise failure from caught
            retry.wait(delay)
            attempt += 1

    def _send(self, operation: str, body: bytes, left: float | None = None) -> Any:
        headers = self._headers.get(operation)
        if headers is None:
            headers = self._headers[operation] = {"X-Amz-Target": _TARGET_PREFIX + operation, **self._header_base}
        request = AWSRequest(method="POST", url=self._url, data=body, headers=headers)
        credentials = self._credentials
        # Signed per attempt: a fresh X-Amz-Date, and credentials refreshed when they near expiry.
        frozen = None if credentials is None else credentials.get_frozen_credentials()
        _SigV4Auth(frozen, _SERVICE, self.region).add_auth(request)
        return self._http.send(request, body, left)


# -- boto3 ---------------------------------------------------------------------------------------------------


class Boto3Transport:
    """A plain boto3 client; its errors reshaped into DynamoDBError."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, max_attempts: int) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError

        self._client_error = ClientError
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
        self._methods: dict[str, Any] = {}
        # botocore reads a 200 whose body is not JSON as an empty success (a claim that failed its condition
        # would look taken) and makes a body it cannot parse an error's message: both are refused before it
        # parses them. A public event of the client's, so nothing of botocore's is driven by hand.
        self.client.meta.events.register(f"before-parse.{_SERVICE}", _refuse_unreadable)

    def call(self, operation: str, params: dict, deadline: float | None = None) -> dict:
        # A client's timeouts are fixed: when the call might outlast the deadline, it is waited for on a thread.
        if deadline is not None and deadline - time.monotonic() < self._worst_case:
            return _within(deadline, operation, lambda: self._call(operation, params))
        return self._call(operation, params)

    def _call(self, operation: str, params: dict) -> dict:
        method = self._methods.get(operation)
        if method is None:
            from botocore import xform_name

            method = self._methods[operation] = getattr(self.client, xform_name(operation))
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
        except BotoCoreError as error:
            code = type(error).__name__
            uncertain = code not in _NOT_SENT or self._max_attempts > 1
            raise DynamoDBError(operation, code, str(error), uncertain=uncertain) from error
        except _Unreadable as error:
            raise DynamoDBError(operation, "ResponseParserError", str(error), None, error.status,
                                uncertain=True) from error
        except Exception as error:  # botocore tripped on an answer (e.g. an x-amz-crc32 that is no integer)
            raise DynamoDBError(operation, type(error).__name__, "the answer could not be read",
                                uncertain=True) from error


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
