"""The record-MAC key read at init (IDEMPOTENCY_RECORD_MAC_KEY): `read_secret(source, env, deadline)` returns the
bytes one source names.

    secretsmanager:<arn|name>   GetSecretValue (AWSCURRENT): SecretString as UTF-8, or SecretBinary
    ssm:<name|arn>              GetParameter, WithDecryption: a SecureString's value as UTF-8
    env:<VAR>                   the variable's value, as the bytes the environment holds (tests only)

Never logged. The request is signed by the layer's own SigV4 (`aws.sigv4.Signer`) and sent with `http.client`,
one connection per read: botocore is not imported for it (about 100 ms of init, and at DEBUG its parsers log the
answer's body and its signer the session token: the security review's M4), and nothing here logs. Errors name the
setting, the source and AWS's error code, never the value, the answer's message or the credentials; they are
raised `from None`, so no exception holding the answer is chained to them.

Why a connection of its own, not the DynamoDB client's pool (stores/dynamodb/connection.py): the AWS kit imports
nothing of the stores, and one request at init needs none of the pool's keep-alive rules, proxy tunnels or
counting reader. Moving that pool here would touch every DynamoDB request for the sake of one; this module opens
a connection as the large-results bucket does (stores/s3.py): connect, one POST, the answer read, closed, the
whole exchange bounded by a timer that shuts the socket at the attempt's end (a server that trickles bytes trips
no socket timeout), TLS verified with `aws.trust.tls_context` and the CA bundle the DynamoDB client trusts
(`aws.environment.ca_bundle`). No proxy is used: a function in a VPC reaches the services through their VPC
endpoints (docs/record-authentication-reading.md).

Where and as whom, from `env` alone, as the DynamoDB client reads a plain Lambda environment: credentials from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (else botocore's chain, waited for until the
deadline: `aws.environment.function_credentials`); the region of the ARN, else AWS_DEFAULT_REGION, else
AWS_REGION; the endpoint from AWS_ENDPOINT_URL_SECRETS_MANAGER or AWS_ENDPOINT_URL_SSM, then AWS_ENDPOINT_URL (unless
AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is true), else `https://<service>[-fips].<region>.amazonaws.com[.cn]`.

Time: `deadline` is a `time.monotonic()` instant. Each attempt gets at most `ATTEMPT_S` and never past the
deadline; throttling, a 5xx or no answer is tried again (at most `ATTEMPTS` in all, a jittered pause between)
while an attempt of `MIN_ATTEMPT_S` still fits. An answer over `MAX_ANSWER` bytes is refused unread.
"""

from __future__ import annotations

import re
import time

from ..deadline import Backoff
from ..errors import IdempotencyConfigurationError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .target import Credentials

__all__ = ["ATTEMPTS", "ATTEMPT_S", "MAX_ANSWER", "read_secret"]

# Every message begins with the setting's name, IDEMPOTENCY_RECORD_MAC_KEY, written in it: the setting is read and
# validated by config, which lists it; this module only names it.
MAX_ANSWER = 128 * 1024  # a secret is at most 64 KiB (Secrets Manager), a parameter 8 KiB: the rest is JSON
ATTEMPTS = 4
ATTEMPT_S = 2.0  # one attempt's most: a stalled one leaves time to try again within the caller's 5 s
MIN_ATTEMPT_S = 0.05  # no attempt is started with less than this before the deadline
_PAUSES = Backoff(0.05, 0.4)

# botocore's standard retry mode: these codes and statuses are worth another attempt.
_THROTTLED = frozenset((
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled", "SlowDown",
    "PriorRequestNotComplete", "EC2ThrottledException", "RequestTimeout", "RequestTimeoutException",
    "InternalServiceError", "InternalServerError", "InternalFailure", "ServiceUnavailable",
))
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,63}")
_NAME = re.compile(r"[A-Za-z0-9/_+=.@:-]{1,2048}")
_KIND = re.compile(r"[a-z]{1,20}")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_REGION = re.compile(r"(?![0-9]+$)(?!-)[a-z0-9-]{1,63}(?<!-)")
_PARTITION_DOMAINS = {"aws": "amazonaws.com", "aws-us-gov": "amazonaws.com", "aws-cn": "amazonaws.com.cn"}


class _Service:
    """What differs between the two services: names, the request, where the value is in the answer, and what the
    function's role needs."""

    __slots__ = ("arn_service", "endpoint_variable", "grant", "label", "missing", "product", "request", "signing",
                 "target", "value")

    def __init__(self, product: str, label: str, signing: str, target: str, endpoint_variable: str, grant: str,
                 missing: str, request: Callable[[str], dict[str, Any]], value: Callable[[str, Any], bytes]) -> None:
        self.product, self.label, self.signing, self.arn_service = product, label, signing, signing
        self.target, self.endpoint_variable, self.grant, self.missing = target, endpoint_variable, grant, missing
        self.request, self.value = request, value


def read_secret(source: str, env: Mapping[str, str], deadline: float) -> bytes:
    """The bytes `source` names (`secretsmanager:<arn|name>`, `ssm:<name|arn>` or `env:<VAR>`), read by
    `deadline` (a `time.monotonic()` instant); IdempotencyConfigurationError naming IDEMPOTENCY_RECORD_MAC_KEY, the
    source and what went wrong (AWS's error code), never the value, when it cannot be."""
    kind, colon, name = source.partition(":")
    if kind == "env" and colon:
        return _from_environment(name, env)
    service = _SERVICES.get(kind) if colon else None
    # A text that is no source is never shown: it may be the key itself, written in the setting by mistake.
    if service is None:
        said = f"the kind {kind!r} is unknown" if colon and _KIND.fullmatch(kind) else "it has no kind"
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_RECORD_MAC_KEY: a source is not one ({said}; its text is not shown): write "
            "secretsmanager:<arn or name>, ssm:<SecureString parameter name> or env:<VARIABLE>")
    if not _NAME.fullmatch(name):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_RECORD_MAC_KEY: a {kind}: source does not name a {service.label} (its text is not "
            "shown): a name or ARN of letters, digits and / _ + = . @ : - (at most 2048)")
    return _fetch(service, name, env, deadline)


def _from_environment(variable: str, env: Mapping[str, str]) -> bytes:
    if not _VARIABLE.fullmatch(variable):
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_RECORD_MAC_KEY: an env: source does not name an environment variable (its text is not "
            "shown): env:<letters, digits and _>")
    value = env.get(variable)
    if not value:
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_RECORD_MAC_KEY: env:{variable}: the variable {variable} is not set or empty")
    # os.environ keeps bytes that are not UTF-8 as lone surrogates: given back as the bytes they were.
    return value.encode("utf-8", "surrogateescape")


def _failure(service: _Service, name: str, code: str, hint: str = "") -> IdempotencyConfigurationError:
    return IdempotencyConfigurationError(
        f"IDEMPOTENCY_RECORD_MAC_KEY: the {service.label} {name!r} could not be read: {code}"
        + (f" ({hint})" if hint else ""))


def _hint(service: _Service, code: str) -> str:
    if code == "AccessDeniedException":
        return f"the function's role needs {service.grant}"
    if code in ("ResourceNotFoundException", "ParameterNotFound", "ParameterVersionNotFound"):
        return service.missing
    if code in ("UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException",
                "IncompleteSignature", "MissingAuthenticationToken"):
        return "the function's AWS credentials were refused"
    return ""


# -- where the request goes, and as whom -------------------------------------------------------------------------


class _Where:
    __slots__ = ("cafile", "host", "host_header", "https", "port", "region", "signed_path", "wire")

    def __init__(self, endpoint: str, region: str, cafile: str | None) -> None:
        from urllib.parse import urlsplit

        from .target import request_target

        parts = urlsplit(endpoint)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port
        self.host_header = parts.netloc.rpartition("@")[2]
        target = request_target(endpoint)
        self.wire, self.signed_path = target.wire, target.signed_path
        self.region, self.cafile = region, cafile


def _where(service: _Service, name: str, env: Mapping[str, str]) -> _Where:
    """The endpoint, region and CA bundle of the read, from the ARN and the environment."""
    from .environment import ca_bundle

    region = partition = None
    if name.startswith("arn:"):
        fields = name.split(":")
        if len(fields) < 6 or fields[2] != service.arn_service or not _REGION.fullmatch(fields[3]):
            raise _failure(service, name, "not an ARN of its kind",
                           f"an ARN is arn:<partition>:{service.arn_service}:<region>:<account>:...")
        partition, region = fields[1], fields[3]
    region = region or env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or ""
    if not _REGION.fullmatch(region):
        raise _failure(service, name, "no region", "set AWS_REGION, or name the secret by its ARN")
    endpoint = _configured(service, env)
    if endpoint is None:
        domain = _PARTITION_DOMAINS.get(partition or ("aws-cn" if region.startswith("cn-") else "aws"))
        if domain is None:
            raise _failure(service, name, f"no endpoint known for the partition {partition!r}",
                           f"set {service.endpoint_variable}")
        fips = "-fips" if (env.get("AWS_USE_FIPS_ENDPOINT") or "").strip().lower() == "true" else ""
        endpoint = f"https://{service.signing}{fips}.{region}.{domain}"
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http:// or https:// URL with a host")
        where = _Where(endpoint, region, None)
    except ValueError as error:
        raise _failure(service, name, f"the endpoint URL {endpoint!r} is not usable: {error}",
                       f"check {service.endpoint_variable} and AWS_ENDPOINT_URL") from None
    if where.https:
        where.cafile = ca_bundle(env)
    return where


def _configured(service: _Service, env: Mapping[str, str]) -> str | None:
    """The endpoint the environment sets for the service, as botocore reads it, or None."""
    if (env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").strip().lower() == "true":
        return None
    return env.get(service.endpoint_variable) or env.get("AWS_ENDPOINT_URL") or None


def _credentials(service: _Service, name: str, env: Mapping[str, str], deadline: float) -> Credentials:
    from .environment import UnsendableCredentials, check_sendable, function_credentials
    from .target import Credentials

    try:
        check_sendable(env)
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            found = function_credentials(env)  # Lambda's: read from the environment, no botocore
        else:  # botocore's chain (SnapStart's container credentials, a profile): it may wait on the network
            from ..deadline import within

            found = within(max(deadline - time.monotonic(), MIN_ATTEMPT_S), lambda: function_credentials(env),
                           "record-mac-key-credentials")
    except UnsendableCredentials as error:
        raise _failure(service, name, "unusable credentials", str(error)) from None
    except Exception as error:  # botocore's chain: its error's name, never its text
        raise _failure(service, name, f"no credentials ({type(error).__name__})") from None
    if found is None or not found[0] or not found[1]:
        raise _failure(service, name, "no credentials", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set")
    return Credentials(*found)


# -- the read: attempts within the deadline ----------------------------------------------------------------------


class _TooLarge(Exception):
    pass


def _fetch(service: _Service, name: str, env: Mapping[str, str], deadline: float) -> bytes:
    import http.client
    import json

    from .sigv4 import Signer

    where = _where(service, name, env)
    credentials = _credentials(service, name, env, deadline)
    signer = Signer(credentials.access_key, credentials.secret_key, credentials.token, where.region, service.signing)
    body = json.dumps(service.request(name)).encode("utf-8")  # as botocore's JSON serializer writes it
    headers = {"X-Amz-Target": service.target, "Content-Type": "application/x-amz-json-1.1",
               "Host": where.host_header}
    context = None
    if where.https:
        from .trust import tls_context

        try:
            context = tls_context(where.cafile)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            raise _failure(service, name, f"the CA bundle could not be loaded ({type(error).__name__})") from None
    code = "the deadline passed before the first attempt"
    for attempt in range(1, ATTEMPTS + 1):
        seconds = min(ATTEMPT_S, deadline - time.monotonic())
        if seconds < MIN_ATTEMPT_S:
            break
        try:
            status, error_type, answer = _exchange(where, context, signer.sign(headers, body, path=where.signed_path),
                                                   body, seconds)
        except _TooLarge:
            raise _failure(service, name, f"the answer is larger than {MAX_ANSWER // 1024} KiB") from None
        except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, TLS, a broken answer
            code = f"no answer from {where.host_header} ({type(error).__name__})"
        else:
            if status == 200:
                return service.value(name, _parsed(service, name, answer))
            code = _error_code(error_type, answer)
            if status < 500 and code not in _THROTTLED:
                raise _failure(service, name, code if code != "?" else f"HTTP {status}", _hint(service, code))
            code = f"{code} (HTTP {status})" if code != "?" else f"HTTP {status}"
        pause = _PAUSES.delay(attempt)
        if attempt == ATTEMPTS or time.monotonic() + pause + MIN_ATTEMPT_S > deadline:
            break
        time.sleep(pause)
    if code.startswith(("no answer", "the deadline")):
        hint = f"in a VPC without internet access, the function needs a VPC endpoint for {service.product}"
    else:
        hint = "tried again until the deadline"
    raise _failure(service, name, code, hint)


def _exchange(where: _Where, context: Any, headers: dict[str, str], body: bytes,
              seconds: float) -> tuple[int, str, bytes]:
    """One POST and its answer within `seconds`: the status, x-amzn-ErrorType and the body (at most MAX_ANSWER)."""
    import http.client
    import threading

    if where.https:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            where.host, where.port, timeout=seconds, context=context)
    else:
        conn = http.client.HTTPConnection(where.host, where.port, timeout=seconds)
    # The whole exchange ends by `seconds`: a server sending a byte at a time trips no socket timeout, which bounds
    # each read only, so a timer shuts the socket then (one still connecting is bounded by its own timeout). The
    # socket is held here: http.client lets go of `conn.sock` when an answer ends at the close (no length).
    fired: list[bool] = []
    held: list[Any] = []
    watchdog = threading.Timer(seconds, _shut, (held, fired))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        held.append(conn.sock)
        if fired:
            raise TimeoutError("the attempt's time ran out while connecting")
        conn.request("POST", where.wire, body=body, headers=headers)
        response = conn.getresponse()
        length = response.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > MAX_ANSWER:
            raise _TooLarge
        answer = response.read(MAX_ANSWER + 1)
        if len(answer) > MAX_ANSWER:
            raise _TooLarge
        if fired:  # cut at the attempt's end: what was read is no answer
            raise TimeoutError("the attempt's time ran out while reading")
        return response.status, response.getheader("x-amzn-ErrorType") or "", answer
    except (OSError, http.client.HTTPException):
        if fired:  # the timer shut the socket: what the read then raised (RemoteDisconnected, a reset) is a timeout
            raise TimeoutError("the attempt's time ran out") from None
        raise
    finally:
        watchdog.cancel()
        conn.close()
        for sock in held:
            sock.close()


def _shut(held: list[Any], fired: list[bool]) -> None:
    """End the exchange now: the socket's reads and writes fail at once (its reader holds it open past close)."""
    import contextlib
    import socket

    fired.append(True)
    for sock in held:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _error_code(error_type: str, answer: bytes) -> str:
    """AWS's error code, from x-amzn-ErrorType or the JSON body's `__type` (`prefix#Code`, `Code:url`); "?" for
    anything that is not a code's name (a broken or hostile peer's text, never quoted)."""
    import json

    code = error_type
    if not code:
        try:
            parsed = json.loads(answer)
        except ValueError:
            parsed = None
        found = parsed.get("__type") if isinstance(parsed, dict) else None
        code = found if isinstance(found, str) else ""
    code = code.rpartition("#")[2].partition(":")[0].strip()
    return code if _CODE.fullmatch(code) else "?"


def _parsed(service: _Service, name: str, answer: bytes) -> Any:
    import json

    try:
        return json.loads(answer)
    except ValueError:  # the error holds the document: never chained
        pass
    raise _failure(service, name, "the answer is not JSON")


# -- the two services --------------------------------------------------------------------------------------------


def _secret_value(name: str, answer: Any) -> bytes:
    service = _SERVICES["secretsmanager"]
    text = answer.get("SecretString") if isinstance(answer, dict) else None
    if isinstance(text, str):
        value = text.encode("utf-8", "surrogatepass")
    else:
        encoded = answer.get("SecretBinary") if isinstance(answer, dict) else None
        if not isinstance(encoded, str):
            raise _failure(service, name, "the answer holds neither SecretString nor SecretBinary")
        import base64
        import binascii

        try:
            value = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _failure(service, name, "its SecretBinary is not base64") from None
    if not value:
        raise _failure(service, name, "the secret is empty")
    return value


def _parameter_value(name: str, answer: Any) -> bytes:
    service = _SERVICES["ssm"]
    parameter = answer.get("Parameter") if isinstance(answer, dict) else None
    if not isinstance(parameter, dict) or not isinstance(parameter.get("Value"), str):
        raise _failure(service, name, "the answer holds no Parameter.Value")
    value, kind = parameter["Value"], parameter.get("Type")
    if kind != "SecureString":
        shown = kind if isinstance(kind, str) and _CODE.fullmatch(kind) else "?"
        raise _failure(service, name, f"it is a {shown} parameter, not a SecureString",
                       "a key is stored encrypted: put it in a SecureString parameter")
    if not value:
        raise _failure(service, name, "the parameter is empty")
    return value.encode("utf-8", "surrogatepass")


_SERVICES = {
    "secretsmanager": _Service(
        "Secrets Manager", "Secrets Manager secret", "secretsmanager", "secretsmanager.GetSecretValue",
        "AWS_ENDPOINT_URL_SECRETS_MANAGER", "secretsmanager:GetSecretValue on this secret (and kms:Decrypt on its "
        "key when that is a customer managed key)", "no secret of that name or ARN in this account and region",
        lambda name: {"SecretId": name}, _secret_value),
    "ssm": _Service(
        "Systems Manager (ssm)", "SSM parameter", "ssm", "AmazonSSM.GetParameter", "AWS_ENDPOINT_URL_SSM",
        "ssm:GetParameter on this parameter and kms:Decrypt on the key that encrypts it",
        "no parameter of that name in this account and region",
        lambda name: {"Name": name, "WithDecryption": True}, _parameter_value),
}
