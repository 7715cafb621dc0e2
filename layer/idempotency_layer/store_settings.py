"""The settings of the stores: which store keeps the records (IDEMPOTENCY_STORE), and each one's own. DynamoDB's
table name or ARN, its record attributes' names and the partition value and key sizes they allow; the Valkey URL
and where its password comes from (the URL, a Secrets Manager secret, IAM); the S3 bucket for large results.

config.py reads them with the rest of the settings, in `load`, and holds the names (`NAMES`) init accepts: this
module validates what a setting means, config.py that it is one."""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Mapping

from .errors import IdempotencyConfigurationError
from .setting_readers import choice, text

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

_STORES = ("dynamodb", "valkey")
# What only the DynamoDB store reads: set with IDEMPOTENCY_STORE=valkey, each would be ignored, so init fails.
_DYNAMODB_ONLY = ("IDEMPOTENCY_TABLE", "IDEMPOTENCY_TRANSPORT", "IDEMPOTENCY_PARTITION_VALUE",
                  "IDEMPOTENCY_POWERTOOLS_HANDLER")
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_TABLE_ARN = re.compile(r"arn:aws[a-z-]*:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[A-Za-z0-9_.-]{3,255}")
# IDEMPOTENCY_PARTITION_VALUE: as the default idempotency#<prefix> is (config.KEY_PREFIX), `#` allowed
_PARTITION_VALUE = re.compile(r"[A-Za-z0-9_#-]{1,128}")
_DIGEST_CHARS = 1 + 64  # "#" and the sha256 hex digest after the prefix
_PARTITION_KEY_BYTES, _SORT_KEY_BYTES = 2048, 1024  # DynamoDB's limits on key values
ATTR_VARIABLES = {
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


def read_table(env: Mapping[str, str], disabled: bool, store: str = "dynamodb") -> str:
    table = text(env, "IDEMPOTENCY_TABLE", "")
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
    return table


_VALKEY_SCHEMES = {"rediss": True, "valkeys": True, "redis": False, "valkey": False}  # scheme: TLS


def read_store(env: Mapping[str, str], disabled: bool) -> tuple[str, Valkey | None]:
    """IDEMPOTENCY_STORE, and IDEMPOTENCY_VALKEY_URL parsed when it is valkey."""
    store = choice(env, "IDEMPOTENCY_STORE", "dynamodb", _STORES)
    url = text(env, "IDEMPOTENCY_VALKEY_URL")
    if store == "dynamodb":
        for name in ("IDEMPOTENCY_VALKEY_URL", "IDEMPOTENCY_VALKEY_SECRET", "IDEMPOTENCY_VALKEY_IAM"):
            if text(env, name) is not None:
                raise IdempotencyConfigurationError(
                    f"{name} is set but IDEMPOTENCY_STORE is not valkey: the records would go to DynamoDB; set "
                    f"IDEMPOTENCY_STORE=valkey, or unset {name}"
                )
        return store, None
    for name in _DYNAMODB_ONLY + tuple(ATTR_VARIABLES.values()):
        if text(env, name) is not None:
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


def _valkey_auth(env: Mapping[str, str], valkey: Valkey) -> Valkey:
    """IDEMPOTENCY_VALKEY_SECRET or IDEMPOTENCY_VALKEY_IAM: where the password comes from, if not the URL."""
    secret, iam = text(env, "IDEMPOTENCY_VALKEY_SECRET"), text(env, "IDEMPOTENCY_VALKEY_IAM")
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
    if text(env, "AWS_REGION") is None:
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


# S3 bucket names without dots: a dotted name cannot be reached by TLS at <bucket>.s3.<region>.amazonaws.com.
BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_OBJECT_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/-]{0,512}")


# The prefix a bucket setting had before the default became per function: records completed then point to
# objects `idempotency-results/<record key>/<owner>`, which replays still read (docs/large-results.md#migration).
LEGACY_PREFIX = "idempotency-results/"


def default_results_prefix(key_prefix: str) -> str:
    """IDEMPOTENCY_LARGE_RESULTS_PREFIX when unset: one folder per function (`idempotency-results/<P>/`), so a
    function's role can be granted its own objects alone."""
    return f"{LEGACY_PREFIX}{key_prefix}/" if key_prefix else LEGACY_PREFIX


def reachable_bucket(name: str) -> bool:
    """Whether `name` is a bucket name this layer can reach: 3 to 63 of a-z 0-9 -, no dots, and none of the forms
    S3 reserves (the setting's rule; also what a pointer, or the read allow-list, may name)."""
    reserved = name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3"))
    return BUCKET.fullmatch(name) is not None and not reserved


def read_large_results(env: Mapping[str, str], key_prefix: str) -> tuple[str | None, str, tuple[str, ...]]:
    """The bucket, the objects' prefix (by default `default_results_prefix(key_prefix)`) and the other buckets
    replays may read (IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS)."""
    bucket = text(env, "IDEMPOTENCY_LARGE_RESULTS_BUCKET")
    prefix = text(env, "IDEMPOTENCY_LARGE_RESULTS_PREFIX")
    readable = text(env, "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS")
    if bucket is None:
        for name, value in (("IDEMPOTENCY_LARGE_RESULTS_PREFIX", prefix),
                            ("IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS", readable)):
            if value is not None:
                raise IdempotencyConfigurationError(
                    f"{name} is set but IDEMPOTENCY_LARGE_RESULTS_BUCKET is not: no result would go there or be read"
                )
        return None, default_results_prefix(key_prefix), ()
    if not reachable_bucket(bucket):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_LARGE_RESULTS_BUCKET={bucket!r} is not an S3 bucket name this layer can reach (3 to 63 of "
            "a-z 0-9 -, no dots)"
        )
    if prefix is not None and not _OBJECT_PREFIX.fullmatch(prefix):
        raise IdempotencyConfigurationError(
            f"IDEMPOTENCY_LARGE_RESULTS_PREFIX={prefix!r} is not accepted; expected up to 512 of A-Z a-z 0-9 and "
            "!_.*'()/-"
        )
    return bucket, default_results_prefix(key_prefix) if prefix is None else prefix, _read_buckets(readable, bucket)


def _read_buckets(value: str | None, bucket: str) -> tuple[str, ...]:
    """IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS: a comma list of bucket names (after a move, the old bucket)."""
    if value is None:
        return ()
    names = [name.strip() for name in value.split(",")]
    for name in names:
        if not reachable_bucket(name):
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS={value!r} is not accepted: {name!r} is not an S3 bucket name "
                "this layer can reach (a comma-separated list of names of 3 to 63 of a-z 0-9 -, no dots)"
            )
    return tuple(name for name in dict.fromkeys(names) if name != bucket)


def _attribute(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    value = text(env, name, default)
    if value is not None and len(value.encode()) > 255:
        raise IdempotencyConfigurationError(f"{name}={value!r} is not accepted; attribute names are 1 to 255 bytes")
    return value


def read_attributes(env: Mapping[str, str]) -> Attributes:
    defaults = Attributes()
    names: dict[str, Any] = {field: _attribute(env, variable, getattr(defaults, field))
                             for field, variable in ATTR_VARIABLES.items()}
    attributes = Attributes(**names)
    seen: dict[str, str] = {}
    for field, variable in ATTR_VARIABLES.items():
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


def read_partition_value(env: Mapping[str, str], attributes: Attributes, prefix: str | None,
                         prefix_variable: str | None, disabled: bool) -> str | None:
    """IDEMPOTENCY_PARTITION_VALUE when the key goes in a sort key; and keys checked to fit DynamoDB's limits."""
    partition_value = None
    key_limit = _PARTITION_KEY_BYTES
    if attributes.sort_key is not None:
        partition_value = text(env, "IDEMPOTENCY_PARTITION_VALUE", f"idempotency#{prefix}")
        assert partition_value is not None
        if not disabled and not _PARTITION_VALUE.fullmatch(partition_value):
            shown = ascii(partition_value) if len(partition_value) <= 160 else (
                f"{partition_value[:128]!a}... ({len(partition_value)} characters)")
            raise IdempotencyConfigurationError(
                f"IDEMPOTENCY_PARTITION_VALUE={shown} is not accepted: a partition value is 1 to 128 of A-Z a-z 0-9 "
                "_ - # (like the default idempotency#<prefix>), with no wildcard *?[ nor braces, so that an IAM "
                "dynamodb:LeadingKeys condition can name it exactly"
            )
        key_limit = _SORT_KEY_BYTES
    elif text(env, "IDEMPOTENCY_PARTITION_VALUE") is not None:
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
