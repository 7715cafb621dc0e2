"""The layer's configuration: every environment variable, its default and its validation, in one place.

`load()` runs once at init. A bad setting raises `IdempotencyConfigurationError` naming the variable, the
value and what is accepted, so the function fails init instead of misbehaving on the first event.
"""

from __future__ import annotations

import os
import re
from collections import namedtuple
from collections.abc import Mapping

from . import store_settings
from .errors import IdempotencyConfigurationError
from .setting_readers import boolean, choice, number, text
from .store_settings import Attributes, Valkey

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

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
_HTTP_ANONYMOUS = ("separate", "shared")
_HTTP_PREVIOUS_KEYS = ("consult", "off")
_DURABLE_MODES = ("pass", "execution")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an HTTP token
# IDEMPOTENCY_KEY_PREFIX, and AWS_LAMBDA_FUNCTION_NAME as its default: no `#` (a prefix `a#b` would put its keys
# under function `a`'s `a#*`), no wildcard of IAM's StringLike or Valkey's ACL globs (`*?[`), no cluster hash tag
# (`{}`), no `.` (Powertools' `<function>.<handler>#` keys), no space, control or non-ASCII character
KEY_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,64}")


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
        large_results_prefix: str = "idempotency-results/"  # by default idempotency-results/<key prefix>/
        # IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS: the buckets besides the setting's that a replay may read
        large_results_read_buckets: tuple[str, ...] = ()
        store: str = "dynamodb"  # IDEMPOTENCY_STORE: "dynamodb" or "valkey"
        valkey: Valkey | None = None  # IDEMPOTENCY_VALKEY_URL when the store is valkey
        # IDEMPOTENCY_HTTP_ANONYMOUS=shared: a response that sets a cookie is stored for anonymous callers too (they
        # share one scope per key); False (separate): it is not, so no caller is replayed another's cookie
        http_anonymous_shared: bool = False
        # IDEMPOTENCY_HTTP_PREVIOUS_KEYS=consult: a first run of an HTTP request also reads the record under the key
        # it had before the API and stage were part of keys (one read); False (off): never read
        http_previous_keys: bool = True
        # IDEMPOTENCY_RECORD_MAC_KEY: where the record MAC's keys are read from at init, current first; (): off
        record_mac_sources: tuple[str, ...] = ()
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
        "large_results_read_buckets",
        "store",
        "valkey",
        "http_anonymous_shared",
        "http_previous_keys",
        "record_mac_sources",
    ), defaults=(False, "Idempotency", None, None, False, "auto", None, False, None, "idempotency-results/",
                 (), "dynamodb", None, False, True, ()))


class Config(_ConfigFields):
    """Every setting, validated, as the values the layer decides by."""
    __slots__ = ()


def _caller_headers(env: Mapping[str, str], key_header: str) -> tuple[str, ...]:
    value = text(env, "IDEMPOTENCY_CALLER_HEADERS")
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


def _log_level(env: Mapping[str, str]) -> str:
    """IDEMPOTENCY_LOG_LEVEL when set; else AWS_LAMBDA_LOG_LEVEL (Lambda's application log level) as the runtime
    applies it to the root logger; else WARNING."""
    if text(env, "IDEMPOTENCY_LOG_LEVEL") is not None:
        return choice(env, "IDEMPOTENCY_LOG_LEVEL", "WARNING", _LOG_LEVELS)
    lambda_level = (text(env, "AWS_LAMBDA_LOG_LEVEL") or "").upper()
    return _LAMBDA_LOG_LEVELS.get(lambda_level, "WARNING")  # a value the runtime ignores, this layer ignores too


def _namespace(env: Mapping[str, str]) -> str:
    value = text(env, "IDEMPOTENCY_METRICS_NAMESPACE", "Idempotency")
    assert value is not None
    if not _NAMESPACE.fullmatch(value) or value.upper().startswith("AWS/"):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_METRICS_NAMESPACE={value!r} is not a CloudWatch namespace (1 to 255 of A-Z a-z 0-9 and "
            "space . _ / # : -, not starting with AWS/)"
        )
    return value


def _handler(env: Mapping[str, str]) -> str:
    original_handler = text(env, "IDEMPOTENCY_ORIGINAL_HANDLER")
    if original_handler is None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_ORIGINAL_HANDLER is not set: the layer's exec wrapper sets it from _HANDLER; "
            "set AWS_LAMBDA_EXEC_WRAPPER=/opt/idempotency-wrapper instead of pointing _HANDLER at the layer"
        )
    return original_handler


def _prefix(env: Mapping[str, str], disabled: bool) -> tuple[str | None, str | None]:
    """The key prefix, and the variable it came from."""
    explicit = text(env, "IDEMPOTENCY_KEY_PREFIX")
    prefix = explicit or text(env, "AWS_LAMBDA_FUNCTION_NAME")
    variable = "IDEMPOTENCY_KEY_PREFIX" if explicit else "AWS_LAMBDA_FUNCTION_NAME"
    if not disabled and not prefix:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_KEY_PREFIX is not set and neither is AWS_LAMBDA_FUNCTION_NAME; "
            "expected a prefix that tells this function's records apart in a shared table"
        )
    if not disabled and prefix and not KEY_PREFIX.fullmatch(prefix):
        # ascii(): a bidi or control character in the value is shown escaped, never as itself
        used = "" if explicit else ", used as the key prefix as IDEMPOTENCY_KEY_PREFIX is unset"
        raise IdempotencyConfigurationError(
            f"{variable}={_shown(prefix)}{used} is not accepted: a key prefix is 1 to 64 of A-Z a-z 0-9 _ - "
            "(Lambda's function-name alphabet), so that '<prefix>#' is a prefix no other function's keys share in "
            "IAM dynamodb:LeadingKeys patterns, Valkey ACL key patterns and S3 resources"
            + ("" if explicit else "; set IDEMPOTENCY_KEY_PREFIX")
        )
    return prefix, variable


def _shown(value: str) -> str:
    """`value` as an error shows it: escaped to ASCII, and cut short when long."""
    return ascii(value) if len(value) <= 80 else f"{value[:64]!a}... ({len(value)} characters)"


def _key_header(env: Mapping[str, str]) -> str:
    key_header = text(env, "IDEMPOTENCY_KEY_HEADER", "Idempotency-Key")
    assert key_header is not None
    if not _HEADER_NAME.fullmatch(key_header):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_KEY_HEADER={key_header!r} is not an HTTP header name (1 to 128 of A-Z a-z 0-9 and "
            "!#$%&'*+.^_`|~-)"
        )
    return key_header


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
    ("http_anonymous_shared", "IDEMPOTENCY_HTTP_ANONYMOUS", _HTTP_ANONYMOUS, "separate", "shared"),
    ("http_previous_keys", "IDEMPOTENCY_HTTP_PREVIOUS_KEYS", _HTTP_PREVIOUS_KEYS, "consult", "consult"),
)


def _check_http_only(env: Mapping[str, str], values: dict[str, Any], caller_headers: tuple[str, ...]) -> None:
    """Settings that only HTTP handling reads fail init under IDEMPOTENCY_HTTP=off rather than being ignored."""
    if values["http"]:
        return
    if caller_headers:  # ignored, every caller would share a key
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_CALLER_HEADERS is set but IDEMPOTENCY_HTTP=off: caller headers scope only requests the "
            "layer handles as HTTP, so every caller would share each key; unset IDEMPOTENCY_HTTP (auto), or put the "
            "caller in IDEMPOTENCY_KEY_JMESPATH instead"
        )
    for name in ("IDEMPOTENCY_HTTP_ANONYMOUS", "IDEMPOTENCY_HTTP_PREVIOUS_KEYS"):
        if text(env, name) is not None:
            raise IdempotencyConfigurationError(
                f"{name} is set but IDEMPOTENCY_HTTP=off: it decides only for requests the layer handles as HTTP, "
                f"so nothing would read it; unset {name}, or unset IDEMPOTENCY_HTTP (auto)"
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


_MAC_SOURCES = ("secretsmanager", "ssm", "env")


def _record_mac_sources(env: Mapping[str, str], values: dict[str, Any], attributes: Attributes) -> tuple[str, ...]:
    """IDEMPOTENCY_RECORD_MAC_KEY's sources, current key first; their keys are read at init by the interceptor.
    Each error names the entry, never a key."""
    value = text(env, "IDEMPOTENCY_RECORD_MAC_KEY")
    if value is None:
        return ()
    sources = tuple(part.strip() for part in value.split(","))
    for index, source in enumerate(sources, 1):
        kind, _, name = source.partition(":")
        if kind not in _MAC_SOURCES or not name.strip():
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_RECORD_MAC_KEY: entry {index} of {len(sources)} is not a key source (expected a comma "
                "list of secretsmanager:<secret ARN or name>, ssm:<SecureString parameter name> or env:<VARIABLE>, "
                "the current key first)"
            )
    if len(set(sources)) != len(sources):
        raise IdempotencyConfigurationError("IDEMPOTENCY_RECORD_MAC_KEY names one key source twice")
    if values["powertools_handler"] is not None:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_RECORD_MAC_KEY and IDEMPOTENCY_POWERTOOLS_HANDLER cannot be set together: Powertools' "
            "records carry no MAC, so a migration would replay results that cannot be authenticated; finish the "
            "migration (unset IDEMPOTENCY_POWERTOOLS_HANDLER once Powertools' records have expired), then set the key"
        )
    if "mac" in attributes:
        raise IdempotencyConfigurationError(
            "IDEMPOTENCY_RECORD_MAC_KEY stores each record's MAC in the attribute 'mac', which an "
            "IDEMPOTENCY_*_ATTR setting gives to another of the record's attributes; name that one otherwise"
        )
    return sources


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
        return choice(env, variable, default, arguments)
    if reader == "text":
        return text(env, variable, default)
    if reader == "bool":
        return boolean(env, variable, default)
    minimum, maximum = arguments
    return number(env, variable, default, minimum, maximum, int if reader == "int" else float)


# Every IDEMPOTENCY_* name the layer reads: those above, the rest read by `load`, the exec wrapper's own and the
# CLI's. Any other name set fails init: a mistyped one would otherwise be ignored, and a mistyped key
# expression falls back to the whole event, a weaker key, without a word.
NAMES = frozenset(
    [variable for _, variable, *_ in _PLAIN + _DECIDED if variable.startswith("IDEMPOTENCY_")]
    + list(store_settings.ATTR_VARIABLES.values())
    + ["IDEMPOTENCY_DISABLED", "IDEMPOTENCY_ORIGINAL_HANDLER", "IDEMPOTENCY_TABLE", "IDEMPOTENCY_KEY_PREFIX",
       "IDEMPOTENCY_LARGE_RESULTS_BUCKET", "IDEMPOTENCY_LARGE_RESULTS_PREFIX",
       "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS",
       "IDEMPOTENCY_STORE", "IDEMPOTENCY_VALKEY_URL", "IDEMPOTENCY_VALKEY_SECRET", "IDEMPOTENCY_VALKEY_IAM",
       "IDEMPOTENCY_KEY_JMESPATH", "IDEMPOTENCY_KEY_HEADER", "IDEMPOTENCY_CALLER_HEADERS", "IDEMPOTENCY_LOG_LEVEL",
       "IDEMPOTENCY_PARTITION_VALUE", "IDEMPOTENCY_METRICS_NAMESPACE", "IDEMPOTENCY_RECORD_MAC_KEY"]
    + ["IDEMPOTENCY_NEXT_WRAPPER", "IDEMPOTENCY_WRAPPER_CHAINED", "IDEMPOTENCY_CLI_TRACEBACK"]
)


def _unknown_names(env: Mapping[str, str]) -> None:
    """Fail on a set IDEMPOTENCY_* name (in any case) the layer does not read, naming the closest known one; and on
    a name whose first word is IDEMPOTENCY misspelled (IDEMPOTENTCY_KEY_JMESPATH)."""
    for name in sorted(env):
        if name in NAMES or text(env, name) is None:
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
    disabled = boolean(env, "IDEMPOTENCY_DISABLED", False)
    store, valkey = store_settings.read_store(env, disabled)
    original_handler = _handler(env)
    table = store_settings.read_table(env, disabled, store)
    prefix, prefix_variable = _prefix(env, disabled)
    key_jmespath = text(env, "IDEMPOTENCY_KEY_JMESPATH")
    key_header = _key_header(env)
    caller_headers = _caller_headers(env, key_header)
    attributes = store_settings.read_attributes(env)
    partition_value = store_settings.read_partition_value(env, attributes, prefix, prefix_variable, disabled)
    values: dict[str, Any] = {field: _read(env, variable, reader, default, arguments)
                              for field, variable, reader, default, arguments in _PLAIN}
    values.update((field, choice(env, variable, default, accepted) == meaning)
                  for field, variable, accepted, default, meaning in _DECIDED)
    _check_powertools(values, attributes)
    _check_durable(values)
    _check_http_only(env, values, caller_headers)
    results_bucket, results_prefix, read_buckets = store_settings.read_large_results(env, prefix or "")
    return Config(
        large_results_bucket=results_bucket,
        large_results_prefix=results_prefix,
        large_results_read_buckets=read_buckets,
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
        record_mac_sources=_record_mac_sources(env, values, attributes),
        **values,
    )
