"""The layer's configuration: every environment variable, its default and its validation, in one place.

`load()` runs once at init. A bad setting raises `IdempotencyConfigurationError` naming the variable, the
value and what is accepted, so the function fails init instead of misbehaving on the first event.
"""

from __future__ import annotations

import os
import re
from collections import namedtuple
from collections.abc import Mapping

from .errors import IdempotencyConfigurationError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# AWS_LAMBDA_LOG_LEVEL as awslambdaric reads it (upper-cased, TRACE taken as DEBUG, a name `logging` knows or
# ignored), as the level name this layer sets
_LAMBDA_LOG_LEVELS = {"TRACE": "DEBUG", "DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARNING", "WARNING": "WARNING",
                      "ERROR": "ERROR", "FATAL": "CRITICAL", "CRITICAL": "CRITICAL"}
_METRICS = ("off", "emf")
# CloudWatch's namespace rules: 1 to 255 of these characters, and not AWS/ (reserved for AWS's own metrics)
_NAMESPACE = re.compile(r"[A-Za-z0-9 ._/#:-]{1,255}")
_TRANSPORTS = ("lean", "boto3")
_SCOPES = ("auto", "event", "record")
_STREAM_FAILURES = ("checkpoint", "records")
_BATCH_RESPONSES = ("partial", "fail")  # fail: the mapping ignores partial batch responses
_BATCH_PRECHECKS = ("auto", "always", "never")
_HTTP_MODES = ("auto", "off")
_DURABLE_MODES = ("pass", "execution")
_STORES = ("dynamodb", "valkey")
# What only the DynamoDB store reads: set with IDEMPOTENCY_STORE=valkey, each would be ignored, so init fails.
_DYNAMODB_ONLY = ("IDEMPOTENCY_TABLE", "IDEMPOTENCY_TRANSPORT", "IDEMPOTENCY_PARTITION_VALUE",
                  "IDEMPOTENCY_POWERTOOLS_HANDLER")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an HTTP token
_WHOLE = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?|-?\.[0-9]+")
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_TABLE_ARN = re.compile(r"arn:aws[a-z-]*:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[A-Za-z0-9_.-]{3,255}")
_DIGEST_CHARS = 1 + 64  # "#" and the sha256 hex digest after the prefix
_PARTITION_KEY_BYTES, _SORT_KEY_BYTES = 2048, 1024  # DynamoDB's limits on key values
_ATTR_VARIABLES = {
    "key": "IDEMPOTENCY_KEY_ATTR",
    "sort_key": "IDEMPOTENCY_SORT_KEY_ATTR",
    "status": "IDEMPOTENCY_STATUS_ATTR",
    "expires_at": "IDEMPOTENCY_EXPIRES_AT_ATTR",
    "in_progress_until": "IDEMPOTENCY_IN_PROGRESS_UNTIL_ATTR",
    "owner": "IDEMPOTENCY_OWNER_ATTR",
    "result": "IDEMPOTENCY_RESULT_ATTR",
    "result_format": "IDEMPOTENCY_RESULT_FORMAT_ATTR",
    "payload_hash": "IDEMPOTENCY_PAYLOAD_HASH_ATTR",
}


if TYPE_CHECKING:
    class _AttributesFields(NamedTuple):
        key: str = "id"
        sort_key: str | None = None
        status: str = "status"
        expires_at: str = "expires_at"
        in_progress_until: str = "in_progress_until"
        owner: str = "owner"
        result: str = "result"
        result_format: str = "result_format"
        payload_hash: str = "payload_hash"
else:
    _AttributesFields = namedtuple("Attributes", (
        "key",
        "sort_key",
        "status",
        "expires_at",
        "in_progress_until",
        "owner",
        "result",
        "result_format",
        "payload_hash",
    ), defaults=(
        "id", None, "status", "expires_at", "in_progress_until", "owner", "result", "result_format", "payload_hash",
    ))


class Attributes(_AttributesFields):
    """Names of the record's attributes in the table."""
    __slots__ = ()


if TYPE_CHECKING:
    class _ValkeyFields(NamedTuple):
        tls: bool  # rediss:// (verified TLS, never plain text); redis:// plain text
        host: str
        port: int
        db: int
        username: str | None
        password: str | None
        secret: str | None = None  # IDEMPOTENCY_VALKEY_SECRET: a Secrets Manager secret holding the password
        iam: str | None = None  # IDEMPOTENCY_VALKEY_IAM's service: elasticache, elasticache-serverless, memorydb
        cache: str | None = None  # ... and the cache (or MemoryDB cluster) its tokens name
else:
    _ValkeyFields = namedtuple("Valkey", ("tls", "host", "port", "db", "username", "password", "secret", "iam",
                                          "cache"), defaults=(None, None, None))


class Valkey(_ValkeyFields):
    """Where IDEMPOTENCY_STORE=valkey keeps the records: IDEMPOTENCY_VALKEY_URL, parsed."""
    __slots__ = ()

    def __repr__(self) -> str:  # never the password, wherever a config is shown
        scheme = "rediss" if self.tls else "redis"
        user = f"{self.username or ''}:***@" if self.password else f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        auth = (f", password from {self.secret}" if self.secret else
                f", IAM authentication to {self.iam} {self.cache}" if self.iam else "")
        return f"Valkey({scheme}://{user}{host}:{self.port}/{self.db}{auth})"


if TYPE_CHECKING:
    class _ConfigFields(NamedTuple):
        disabled: bool
        table: str
        # "auto": batches (SQS, Kinesis, DynamoDB Streams, Kafka, Amazon MQ) per record, others whole; "event"; "record"
        scope: str
        # IDEMPOTENCY_STREAM_FAILURES=checkpoint: a stream handler's earliest reported record and every one after it
        # are released (Lambda retries the shard from there); False (records): only the records it reports, as SQS's
        stream_checkpoint: bool
        key_jmespath: str | None  # None: the whole event (a batch record: its delivery identity)
        payload_jmespath: str | None  # the part of the event a reused key must match (its SHA-256); None: unchecked
        http: bool  # IDEMPOTENCY_HTTP=auto: API Gateway, Function URL and ALB events get HTTP semantics
        key_header: str  # the request header holding the idempotency key of an HTTP event
        # lower-cased request headers whose values scope an HTTP request's key: who is calling, for functions that
        # authenticate callers themselves (no authorizer names them in requestContext); () when unset
        caller_headers: tuple[str, ...]
        key_prefix: str
        require_key: bool
        ttl_seconds: int
        in_progress_seconds: int  # a claim lasts at least this long, beyond the invocation's deadline; 0: no floor
        wait_seconds: float  # how long a copy that finds a live claim waits for its outcome; 0: it does not wait
        local_cache_size: int
        attributes: Attributes
        partition_value: str | None  # static partition key value when a sort key holds the key
        log_level: str  # DEBUG, INFO, WARNING or ERROR
        transport: str  # "lean" or "boto3"
        connect_timeout: float
        read_timeout: float
        max_attempts: int
        original_handler: str
        metrics: bool = False  # IDEMPOTENCY_METRICS=emf: one CloudWatch EMF document per invocation on stdout
        metrics_namespace: str = "Idempotency"
        function_name: str | None = None  # AWS_LAMBDA_FUNCTION_NAME: a durable execution's envelope names it
        region: str | None = None  # AWS_REGION: ... and its Region
        fail_whole_batch: bool = False  # IDEMPOTENCY_BATCH_RESPONSE=fail: a record that must come back fails the batch
        # "auto": a batch showing redelivery is read first in one BatchGetItem; "always"; "never"
        batch_precheck: str = "auto"
        # IDEMPOTENCY_POWERTOOLS_HANDLER: the handler as Powertools' @idempotent named it (module.function), whose
        # records a first run reads too (a migration); None: never read
        powertools_handler: str | None = None
        # IDEMPOTENCY_DURABLE=execution: a Lambda durable execution of this function is one unit of work, keyed by
        # its input and owned by the execution; False (pass): its invocations are passed through, never claimed
        durable_executions: bool = False
        # IDEMPOTENCY_LARGE_RESULTS_BUCKET / _PREFIX: where results too large for a record go; None: not stored
        large_results_bucket: str | None = None
        large_results_prefix: str = "idempotency-results/"
        store: str = "dynamodb"  # IDEMPOTENCY_STORE: "dynamodb" or "valkey"
        valkey: Valkey | None = None  # IDEMPOTENCY_VALKEY_URL when the store is valkey
else:
    _ConfigFields = namedtuple("Config", (
        "disabled",
        "table",
        "scope",
        "stream_checkpoint",
        "key_jmespath",
        "payload_jmespath",
        "http",
        "key_header",
        "caller_headers",
        "key_prefix",
        "require_key",
        "ttl_seconds",
        "in_progress_seconds",
        "wait_seconds",
        "local_cache_size",
        "attributes",
        "partition_value",
        "log_level",
        "transport",
        "connect_timeout",
        "read_timeout",
        "max_attempts",
        "original_handler",
        "metrics",
        "metrics_namespace",
        "function_name",
        "region",
        "fail_whole_batch",
        "batch_precheck",
        "powertools_handler",
        "durable_executions",
        "large_results_bucket",
        "large_results_prefix",
        "store",
        "valkey",
    ), defaults=(False, "Idempotency", None, None, False, "auto", None, False, None, "idempotency-results/",
                 "dynamodb", None))


class Config(_ConfigFields):
    """Every setting, validated, as the values the layer decides by."""
    __slots__ = ()


def _text(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python as lone surrogates
        raise IdempotencyConfigurationError(f"{name} is not valid UTF-8 text") from None
    return value.strip()


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = _text(env, name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise IdempotencyConfigurationError(
        f"{name}={value!r} is not a boolean; accepted: true/false, 1/0, yes/no (any case)"
    )


def _number(env: Mapping[str, str], name: str, default: float, minimum: float, maximum: float, kind: type) -> Any:
    value = _text(env, name)
    if value is None:
        return default
    # Plain ASCII decimals only: Python's int() and float() also take "1_0", other scripts' digits, "inf".
    pattern = _WHOLE if kind is int else _DECIMAL
    number = kind(value) if pattern.fullmatch(value) else None
    if number is None or not minimum <= number <= maximum:
        what = "a whole number" if kind is int else "seconds"
        raise IdempotencyConfigurationError(
            f"{name}={value!r} is not accepted; expected {what} from {minimum} to {maximum}"
        )
    return number


def _int(env: Mapping[str, str], name: str, default: int, minimum: int, maximum: int) -> int:
    return _number(env, name, default, minimum, maximum, int)


def _float(env: Mapping[str, str], name: str, default: float, minimum: float, maximum: float) -> float:
    return _number(env, name, default, minimum, maximum, float)


def _choice(env: Mapping[str, str], name: str, default: str, accepted: tuple[str, ...]) -> str:
    value = _text(env, name, default)
    assert value is not None
    for option in accepted:
        if value.lower() == option.lower():
            return option
    raise IdempotencyConfigurationError(f"{name}={value!r} is not accepted; expected one of {', '.join(accepted)}")


def _caller_headers(env: Mapping[str, str], key_header: str) -> tuple[str, ...]:
    value = _text(env, "IDEMPOTENCY_CALLER_HEADERS")
    if value is None:
        return ()
    names = [name.strip() for name in value.split(",")]
    for name in names:
        if not _HEADER_NAME.fullmatch(name):
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_CALLER_HEADERS={value!r} is not accepted: {name!r} is not an HTTP header name (a "
                "comma-separated list of names of 1 to 128 of A-Z a-z 0-9 and !#$%&'*+.^_`|~-)"
            )
        if name.lower() == key_header.lower():
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_CALLER_HEADERS={value!r} names the key header {key_header!r}: the caller must be "
                "another header"
            )
    return tuple(dict.fromkeys(name.lower() for name in names))


def _attribute(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    value = _text(env, name, default)
    if value is not None and len(value.encode()) > 255:
        raise IdempotencyConfigurationError(f"{name}={value!r} is not accepted; attribute names are 1 to 255 bytes")
    return value


def _log_level(env: Mapping[str, str]) -> str:
    """IDEMPOTENCY_LOG_LEVEL when set; else AWS_LAMBDA_LOG_LEVEL (Lambda's application log level) as the runtime
    applies it to the root logger; else WARNING."""
    if _text(env, "IDEMPOTENCY_LOG_LEVEL") is not None:
        return _choice(env, "IDEMPOTENCY_LOG_LEVEL", "WARNING", _LOG_LEVELS)
    lambda_level = (_text(env, "AWS_LAMBDA_LOG_LEVEL") or "").upper()
    return _LAMBDA_LOG_LEVELS.get(lambda_level, "WARNING")  # a value the runtime ignores, this layer ignores too


def _namespace(env: Mapping[str, str]) -> str:
    value = _text(env, "IDEMPOTENCY_METRICS_NAMESPACE", "Idempotency")
    assert value is not None
    if not _NAMESPACE.fullmatch(value) or value.upper().startswith("AWS/"):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_METRICS_NAMESPACE={value!r} is not a CloudWatch namespace (1 to 255 of A-Z a-z 0-9 and "
            "space . _ / # : -, not starting with AWS/)"
        )
    return value


def _handler_and_table(env: Mapping[str, str], disabled: bool, store: str = "dynamodb") -> tuple[str, str]:
    original_handler = _text(env, "IDEMPOTENCY_ORIGINAL_HANDLER")
    if original_handler is None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_ORIGINAL_HANDLER is not set: the layer's exec wrapper sets it from _HANDLER; "
            "set AWS_LAMBDA_EXEC_WRAPPER=/opt/idempotency-wrapper instead of pointing _HANDLER at the layer"
        )
    table = _text(env, "IDEMPOTENCY_TABLE", "")
    assert table is not None
    if not disabled and not table and store == "dynamodb":
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_TABLE is not set; expected the name or ARN of the DynamoDB table holding the records"
        )
    if table and not (_TABLE_NAME.fullmatch(table) or _TABLE_ARN.fullmatch(table)):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_TABLE={table!r} is not a table name (3 to 255 of A-Z a-z 0-9 _ . -) "
            "nor a table ARN (arn:aws:dynamodb:<region>:<account>:table/<name>)"
        )
    return original_handler, table


_VALKEY_SCHEMES = {"rediss": True, "valkeys": True, "redis": False, "valkey": False}  # scheme: TLS


def _store(env: Mapping[str, str], disabled: bool) -> tuple[str, Valkey | None]:
    """IDEMPOTENCY_STORE, and IDEMPOTENCY_VALKEY_URL parsed when it is valkey."""
    store = _choice(env, "IDEMPOTENCY_STORE", "dynamodb", _STORES)
    url = _text(env, "IDEMPOTENCY_VALKEY_URL")
    if store == "dynamodb":
        for name in ("IDEMPOTENCY_VALKEY_URL", "IDEMPOTENCY_VALKEY_SECRET", "IDEMPOTENCY_VALKEY_IAM"):
            if _text(env, name) is not None:
                raise IdempotencyConfigurationError(
                    f"{name} is set but IDEMPOTENCY_STORE is not valkey: the records would go to DynamoDB; set "
                    f"IDEMPOTENCY_STORE=valkey, or unset {name}"
                )
        return store, None
    for name in _DYNAMODB_ONLY + tuple(_ATTR_VARIABLES.values()):
        if _text(env, name) is not None:
            raise IdempotencyConfigurationError(
                f"{name} is set, but it is a setting of the DynamoDB store and IDEMPOTENCY_STORE=valkey: it would be "
                "ignored; unset it"
            )
    if url is None:
        if disabled:
            return store, None
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_STORE=valkey needs IDEMPOTENCY_VALKEY_URL: rediss://[user:password@]host[:port][/db]"
        )
    return store, _valkey_auth(env, _valkey_url(url))


_IAM_SERVICES = ("elasticache", "elasticache-serverless", "memorydb")
_SECRET = re.compile(r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}|"
                     r"[A-Za-z0-9/_+=.@-]{1,512}")
_CACHE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,39}")


# S3 bucket names without dots: a dotted name cannot be reached by TLS at <bucket>.s3.<region>.amazonaws.com.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_OBJECT_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/-]{0,512}")


def _large_results(env: Mapping[str, str]) -> tuple[str | None, str]:
    bucket = _text(env, "IDEMPOTENCY_LARGE_RESULTS_BUCKET")
    prefix = _text(env, "IDEMPOTENCY_LARGE_RESULTS_PREFIX")
    if bucket is None:
        if prefix is not None:
            raise IdempotencyConfigurationError(
                "IDEMPOTENCY_LARGE_RESULTS_PREFIX is set but IDEMPOTENCY_LARGE_RESULTS_BUCKET is not: no result would "
                "go there"
            )
        return None, "idempotency-results/"
    reserved = bucket.startswith(("xn--", "sthree-")) or bucket.endswith(("-s3alias", "--ol-s3"))
    if not _BUCKET.fullmatch(bucket) or reserved:
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_LARGE_RESULTS_BUCKET={bucket!r} is not an S3 bucket name this layer can reach (3 to 63 of "
            "a-z 0-9 -, no dots)"
        )
    if prefix is not None and not _OBJECT_PREFIX.fullmatch(prefix):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_LARGE_RESULTS_PREFIX={prefix!r} is not accepted; expected up to 512 of A-Z a-z 0-9 and "
            "!_.*'()/-"
        )
    return bucket, "idempotency-results/" if prefix is None else prefix


def _valkey_auth(env: Mapping[str, str], valkey: Valkey) -> Valkey:
    """IDEMPOTENCY_VALKEY_SECRET or IDEMPOTENCY_VALKEY_IAM: where the password comes from, if not the URL."""
    secret, iam = _text(env, "IDEMPOTENCY_VALKEY_SECRET"), _text(env, "IDEMPOTENCY_VALKEY_IAM")
    if secret is not None and iam is not None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_VALKEY_SECRET and IDEMPOTENCY_VALKEY_IAM are both set: the password comes from one of them"
        )
    if (secret is not None or iam is not None) and valkey.password is not None:
        raise IdempotencyConfigurationError(
            f"{'IDEMPOTENCY_VALKEY_SECRET' if secret else 'IDEMPOTENCY_VALKEY_IAM'} is set and IDEMPOTENCY_VALKEY_URL "
            "holds a password too: remove the password from the URL"
        )
    if secret is not None:
        if not _SECRET.fullmatch(secret):
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_VALKEY_SECRET={secret!r} is not a Secrets Manager secret's ARN or name"
            )
        return valkey._replace(secret=secret)
    if iam is None:
        return valkey
    service, _, cache = iam.partition(":")
    if service not in _IAM_SERVICES or not _CACHE_NAME.fullmatch(cache):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_VALKEY_IAM={iam!r} is not accepted; expected elasticache:<replication group id>, "
            "elasticache-serverless:<cache name> or memorydb:<cluster name>"
        )
    if not valkey.tls or valkey.username is None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_VALKEY_IAM authenticates the user named in IDEMPOTENCY_VALKEY_URL over TLS: the URL must "
            "be rediss://<user id>@host..."
        )
    if _text(env, "AWS_REGION") is None:
        raise IdempotencyConfigurationError("IDEMPOTENCY_VALKEY_IAM signs its tokens for AWS_REGION, which is not set")
    return valkey._replace(iam=service, cache=cache)


def _valkey_url(url: str) -> Valkey:
    from urllib.parse import unquote, urlsplit

    # The URL may hold a password: never shown in an error, only its shape.
    shape = ("IDEMPOTENCY_VALKEY_URL is not accepted: expected rediss://[user:password@]host[:port][/db] (TLS; or "
             "redis:// for plain text), with a port from 1 to 65535, a database number and no query")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise IdempotencyConfigurationError(shape) from None
    scheme = parts.scheme.lower()
    path = parts.path.strip("/")
    if scheme not in _VALKEY_SCHEMES or not parts.hostname or parts.query or parts.fragment or "#" in url:
        raise IdempotencyConfigurationError(shape)
    if re.search(r"%(?![0-9A-Fa-f]{2})", parts.netloc.rpartition("@")[0]):  # a broken escape in user or password
        raise IdempotencyConfigurationError(shape + " (user and password percent-encoded: %XX)")
    if (path and not path.isdigit()) or not path.isascii() or port == 0 or any(c in url for c in "\t\r\n "):
        raise IdempotencyConfigurationError(shape)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return Valkey(tls=_VALKEY_SCHEMES[scheme], host=parts.hostname, port=port or 6379, db=int(path or 0),
                  username=username, password=password)


def _prefix(env: Mapping[str, str], disabled: bool) -> tuple[str | None, str | None]:
    """The key prefix, and the variable it came from."""
    explicit = _text(env, "IDEMPOTENCY_KEY_PREFIX")
    prefix = explicit or _text(env, "AWS_LAMBDA_FUNCTION_NAME")
    if not disabled and not prefix:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_KEY_PREFIX is not set and neither is AWS_LAMBDA_FUNCTION_NAME; "
            "expected a prefix that tells this function's records apart in a shared table"
        )
    return prefix, "IDEMPOTENCY_KEY_PREFIX" if explicit else "AWS_LAMBDA_FUNCTION_NAME"


def _key_header(env: Mapping[str, str]) -> str:
    key_header = _text(env, "IDEMPOTENCY_KEY_HEADER", "Idempotency-Key")
    assert key_header is not None
    if not _HEADER_NAME.fullmatch(key_header):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_KEY_HEADER={key_header!r} is not an HTTP header name (1 to 128 of A-Z a-z 0-9 and "
            "!#$%&'*+.^_`|~-)"
        )
    return key_header


def _attributes(env: Mapping[str, str]) -> Attributes:
    defaults = Attributes()
    names: dict[str, Any] = {field: _attribute(env, variable, getattr(defaults, field))
                             for field, variable in _ATTR_VARIABLES.items()}
    attributes = Attributes(**names)
    seen: dict[str, str] = {}
    for field, variable in _ATTR_VARIABLES.items():
        value = getattr(attributes, field)
        if value is None:
            continue
        if value in seen:
            raise IdempotencyConfigurationError(
                f"{seen[value]} and {variable} name the same attribute {value!r} (set or by default); "
                "each record attribute needs a name of its own"
            )
        seen[value] = variable
    return attributes


def _partition(env: Mapping[str, str], attributes: Attributes, prefix: str | None, prefix_variable: str | None,
               disabled: bool) -> str | None:
    """IDEMPOTENCY_PARTITION_VALUE when the key goes in a sort key; and keys checked to fit DynamoDB's limits."""
    partition_value = None
    key_limit = _PARTITION_KEY_BYTES
    if attributes.sort_key is not None:
        partition_value = _text(env, "IDEMPOTENCY_PARTITION_VALUE", f"idempotency#{prefix}")
        assert partition_value is not None
        if len(partition_value.encode()) > _PARTITION_KEY_BYTES:
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_PARTITION_VALUE is {len(partition_value.encode())} bytes; a partition key value "
                f"is at most {_PARTITION_KEY_BYTES} bytes"
            )
        key_limit = _SORT_KEY_BYTES
    elif _text(env, "IDEMPOTENCY_PARTITION_VALUE") is not None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_PARTITION_VALUE is set but IDEMPOTENCY_SORT_KEY_ATTR is not; the partition value is only "
            "used when the key goes in a sort key"
        )
    if not disabled and prefix and len(prefix.encode()) + _DIGEST_CHARS > key_limit:
        raise IdempotencyConfigurationError(
            f"{prefix_variable} is {len(prefix.encode())} bytes as a key prefix; with the 65 characters of the digest, "
            f"keys must fit in {key_limit} bytes ({'sort' if key_limit == _SORT_KEY_BYTES else 'partition'} key)"
        )
    return partition_value


# The settings read by a reader and its bounds alone: (field, variable, reader, default, reader's arguments).
_PLAIN = (
    ("scope", "IDEMPOTENCY_SCOPE", "choice", "auto", _SCOPES),
    ("payload_jmespath", "IDEMPOTENCY_PAYLOAD_JMESPATH", "text", None, ()),
    ("require_key", "IDEMPOTENCY_REQUIRE_KEY", "bool", False, ()),
    ("ttl_seconds", "IDEMPOTENCY_TTL_SECONDS", "int", 3600, (1, 366 * 24 * 3600)),
    ("in_progress_seconds", "IDEMPOTENCY_IN_PROGRESS_SECONDS", "int", 0, (0, 366 * 24 * 3600)),
    ("wait_seconds", "IDEMPOTENCY_WAIT_SECONDS", "float", 0.0, (0.0, 900.0)),
    ("local_cache_size", "IDEMPOTENCY_LOCAL_CACHE_SIZE", "int", 0, (0, 100_000)),
    ("transport", "IDEMPOTENCY_TRANSPORT", "choice", "lean", _TRANSPORTS),
    ("connect_timeout", "IDEMPOTENCY_CONNECT_TIMEOUT", "float", 2.0, (0.05, 60.0)),
    ("read_timeout", "IDEMPOTENCY_READ_TIMEOUT", "float", 3.0, (0.05, 60.0)),
    ("max_attempts", "IDEMPOTENCY_MAX_ATTEMPTS", "int", 3, (1, 10)),
    ("batch_precheck", "IDEMPOTENCY_BATCH_PRECHECK", "choice", "auto", _BATCH_PRECHECKS),
    ("powertools_handler", "IDEMPOTENCY_POWERTOOLS_HANDLER", "text", None, ()),
    ("function_name", "AWS_LAMBDA_FUNCTION_NAME", "text", None, ()),
    ("region", "AWS_REGION", "text", None, ()),
)
# Settings of a few named values that decide one thing: (field, variable, accepted, default, the value meaning True).
_DECIDED = (
    ("stream_checkpoint", "IDEMPOTENCY_STREAM_FAILURES", _STREAM_FAILURES, "checkpoint", "checkpoint"),
    ("http", "IDEMPOTENCY_HTTP", _HTTP_MODES, "auto", "auto"),
    ("metrics", "IDEMPOTENCY_METRICS", _METRICS, "off", "emf"),
    ("fail_whole_batch", "IDEMPOTENCY_BATCH_RESPONSE", _BATCH_RESPONSES, "partial", "fail"),
    ("durable_executions", "IDEMPOTENCY_DURABLE", _DURABLE_MODES, "pass", "execution"),
)


# module.qualname as Powertools joins them: any text without spaces, with a dot between non-empty parts
# (app.handler, my-app.handler, app.make.<locals>.handler)
_HANDLER_NAME = r"[^\s.#]+(\.[^\s.#]+)+"  # compiled only when the setting is set


def _check_powertools(values: dict[str, Any], attributes: Attributes) -> None:
    """IDEMPOTENCY_POWERTOOLS_HANDLER names a handler as Powertools did, and the table has Powertools' layout."""
    handler = values["powertools_handler"]
    if handler is None:
        return
    if not re.fullmatch(_HANDLER_NAME, handler):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_POWERTOOLS_HANDLER={handler!r} is not a handler as Powertools names it: the module and the "
            "function, e.g. app.handler (module.qualname of the function @idempotent decorated)"
        )
    if attributes.sort_key is not None or values["function_name"] is None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_POWERTOOLS_HANDLER reads the records of Powertools' DynamoDBPersistenceLayer as it lays them "
            "out by default: a partition key only (unset IDEMPOTENCY_SORT_KEY_ATTR), its keys prefixed with the "
            "function's name (AWS_LAMBDA_FUNCTION_NAME, which Lambda sets)"
        )


def _check_durable(values: dict[str, Any]) -> None:
    """IDEMPOTENCY_DURABLE=execution holds a claim for a whole durable execution, which may run far longer than
    any invocation: its lease is IDEMPOTENCY_IN_PROGRESS_SECONDS, which Lambda cannot tell the layer."""
    if not values["durable_executions"]:
        return
    if values["in_progress_seconds"] <= 0:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_DURABLE=execution needs IDEMPOTENCY_IN_PROGRESS_SECONDS: how long a durable execution may "
            "run (set it to the function's durable execution timeout, in seconds); a claim that ends before its "
            "execution does lets a duplicate run the workflow again"
        )
    if values["scope"] == "record":
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_DURABLE=execution keys each durable execution by its whole input, which "
            "IDEMPOTENCY_SCOPE=record contradicts (every invocation of a durable function is an execution's); "
            "unset IDEMPOTENCY_SCOPE"
        )
    if values["function_name"] is None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_DURABLE=execution recognises this function's durable executions by its name, and "
            "AWS_LAMBDA_FUNCTION_NAME (which Lambda sets) is not set"
        )


def _read(env: Mapping[str, str], variable: str, reader: str, default: Any, arguments: Any) -> Any:
    if reader == "choice":
        return _choice(env, variable, default, arguments)
    if reader == "text":
        return _text(env, variable, default)
    if reader == "bool":
        return _bool(env, variable, default)
    minimum, maximum = arguments
    return _number(env, variable, default, minimum, maximum, int if reader == "int" else float)


# Every IDEMPOTENCY_* name the layer reads: those above, the rest read by `load`, the exec wrapper's own and the
# CLI's. Any other name set fails init: a mistyped one would otherwise be ignored, and a mistyped key
# expression falls back to the whole event, a weaker key, without a word.
NAMES = frozenset(
    [variable for _, variable, *_ in _PLAIN + _DECIDED if variable.startswith("IDEMPOTENCY_")]
    + list(_ATTR_VARIABLES.values())
    + ["IDEMPOTENCY_DISABLED", "IDEMPOTENCY_ORIGINAL_HANDLER", "IDEMPOTENCY_TABLE", "IDEMPOTENCY_KEY_PREFIX",
       "IDEMPOTENCY_LARGE_RESULTS_BUCKET", "IDEMPOTENCY_LARGE_RESULTS_PREFIX",
       "IDEMPOTENCY_STORE", "IDEMPOTENCY_VALKEY_URL", "IDEMPOTENCY_VALKEY_SECRET", "IDEMPOTENCY_VALKEY_IAM",
       "IDEMPOTENCY_KEY_JMESPATH", "IDEMPOTENCY_KEY_HEADER", "IDEMPOTENCY_CALLER_HEADERS", "IDEMPOTENCY_LOG_LEVEL",
       "IDEMPOTENCY_PARTITION_VALUE", "IDEMPOTENCY_METRICS_NAMESPACE"]
    + ["IDEMPOTENCY_NEXT_WRAPPER", "IDEMPOTENCY_WRAPPER_CHAINED", "IDEMPOTENCY_CLI_TRACEBACK"]
)


def _unknown_names(env: Mapping[str, str]) -> None:
    """Fail on a set IDEMPOTENCY_* name (in any case) the layer does not read, naming the closest known one; and on
    a name whose first word is IDEMPOTENCY misspelled (IDEMPOTENTCY_KEY_JMESPATH)."""
    for name in sorted(env):
        if name in NAMES or _text(env, name) is None:
            continue
        if name.upper().startswith("IDEMPOTENCY_"):
            raise IdempotencyConfigurationError(
                f"{name} is set, but it is not a setting of this layer{_closest(name)}; a misspelled setting "
                "would be ignored, so init fails (the README lists every setting)"
            )
        meant = _closest(name) if name[:4].upper() == "IDEM" and _misspelled_prefix(name) else ""
        if meant:  # a name of one's own that only starts alike (IDEMPOTENT_MODE) is left alone
            raise IdempotencyConfigurationError(
                f"{name} is set, and looks like a setting of this layer with IDEMPOTENCY_ misspelled{meant}; "
                "it would be ignored, so init fails"
            )


def _misspelled_prefix(name: str) -> bool:
    import difflib  # only for a name that starts IDEM: not at a good init's cost

    head = name.upper().split("_", 1)[0]
    known = {known[len("IDEMPOTENCY_"):].split("_", 1)[0] for known in NAMES}
    # IDEMPOTENTCY, IDEMPOTANCY; or IDEMPOTENCYKEY: the prefix run into a setting's first word
    return difflib.SequenceMatcher(None, head, "IDEMPOTENCY").ratio() >= 0.85 or any(
        head == "IDEMPOTENCY" + word for word in known)


def _closest(name: str) -> str:
    import difflib  # only when a name is wrong: not at a good init's cost

    upper = name.upper()
    if not upper.startswith("IDEMPOTENCY_"):  # its prefix misspelled: compared whole
        close = difflib.get_close_matches(upper, sorted(NAMES), n=1, cutoff=0.85)
        return f" (did you mean {close[0]}?)" if close else ""
    longer = [known for known in NAMES if known.startswith(upper + "_")]  # IDEMPOTENCY_TTL: IDEMPOTENCY_TTL_SECONDS
    # Compared without the prefix every name shares, which would make any name look close to all of them.
    rest = {known[len("IDEMPOTENCY_"):]: known for known in NAMES}
    similar = difflib.get_close_matches(upper[len("IDEMPOTENCY_"):], sorted(rest), n=1, cutoff=0.75)
    close = [upper] if upper in NAMES else longer if len(longer) == 1 else [rest[part] for part in similar]
    return f" (did you mean {close[0]}?)" if close else ""


def load(env: Mapping[str, str] | None = None) -> Config:
    """Build the configuration from the environment (os.environ by default)."""
    env = os.environ if env is None else env
    _unknown_names(env)
    disabled = _bool(env, "IDEMPOTENCY_DISABLED", False)
    store, valkey = _store(env, disabled)
    original_handler, table = _handler_and_table(env, disabled, store)
    prefix, prefix_variable = _prefix(env, disabled)
    key_jmespath = _text(env, "IDEMPOTENCY_KEY_JMESPATH")
    key_header = _key_header(env)
    caller_headers = _caller_headers(env, key_header)
    attributes = _attributes(env)
    partition_value = _partition(env, attributes, prefix, prefix_variable, disabled)
    values: dict[str, Any] = {field: _read(env, variable, reader, default, arguments)
                              for field, variable, reader, default, arguments in _PLAIN}
    values.update((field, _choice(env, variable, default, accepted) == meaning)
                  for field, variable, accepted, default, meaning in _DECIDED)
    _check_powertools(values, attributes)
    _check_durable(values)
    if caller_headers and not values["http"]:
        # Caller headers scope only the requests the layer handles as HTTP: ignored, every caller shares a key.
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_CALLER_HEADERS is set but IDEMPOTENCY_HTTP=off: caller headers scope only requests the "
            "layer handles as HTTP, so every caller would share each key; unset IDEMPOTENCY_HTTP (auto), or put the "
            "caller in IDEMPOTENCY_KEY_JMESPATH instead"
        )
    results_bucket, results_prefix = _large_results(env)
    return Config(
        large_results_bucket=results_bucket,
        large_results_prefix=results_prefix,
        disabled=disabled,
        table=table,
        key_jmespath=None if key_jmespath == "@" else key_jmespath,
        key_header=key_header,
        caller_headers=caller_headers,
        key_prefix=prefix or "",
        attributes=attributes,
        partition_value=partition_value,
        log_level=_log_level(env),
        original_handler=original_handler,
        metrics_namespace=_namespace(env),
        store=store,
        valkey=valkey,
        **values,
    )
