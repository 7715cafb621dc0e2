"""The storage floor, and its opener: the one place a backend is chosen and built.

`stores.protocol` is what every backend speaks (Store, Record, the statuses); `dynamodb/`, `valkey/` and `s3` are
the backends, siblings that import no other backend. The function (interceptor), the operator CLI and its doctor
open what the settings name here and nowhere else. A backend is imported inside these functions only: the cycle
imports `stores.protocol`, which runs this module first, and a plain-Lambda init loads no Valkey code, no botocore
and no S3 client.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from ..config import Config
    from .protocol import Store
    from .s3 import Bucket, Unset

    B = TypeVar("B")  # whatever stands for the bucket: stores.s3.Bucket, or a test's


def open_transport(config: Config) -> Any:
    """The DynamoDB client `config` names (IDEMPOTENCY_TRANSPORT and its timeouts and attempts), its target (Region,
    endpoint, credentials) read from the process environment. Errors are the client's own, for the caller to
    explain (the function fails init with them, the CLI names the setting to fix)."""
    from .dynamodb import make_transport

    return make_transport(config.transport, connect_timeout=config.connect_timeout,
                          read_timeout=config.read_timeout, max_attempts=config.max_attempts)


def open_store(config: Config, transport: Any = None) -> Store:
    """The store `config` names, not yet verified: the Valkey server of IDEMPOTENCY_VALKEY_URL, else the DynamoDB
    table of IDEMPOTENCY_TABLE on `transport` (by default `open_transport(config)`)."""
    if config.store == "valkey":
        from .valkey import make_store

        return make_store(config)
    from .dynamodb.store import DynamoDBStore

    return DynamoDBStore(transport if transport is not None else open_transport(config), config.table,
                         config.attributes, config.partition_value, key_prefix=config.key_prefix)


def open_bucket(config: Config) -> Bucket | None:
    """The large-results bucket `config` names (IDEMPOTENCY_LARGE_RESULTS_BUCKET and its prefix), or None; no
    request is sent and no S3 code imported without one."""
    if config.large_results_bucket is None:
        return None
    from ..store_settings import LEGACY_PREFIX, default_results_prefix
    from .s3 import from_environment

    # With the default prefix, records completed before it became per function point under the old one.
    default = config.large_results_prefix == default_results_prefix(config.key_prefix)
    return from_environment(config.large_results_bucket, config.large_results_prefix,
                            connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                            read_buckets=config.large_results_read_buckets,
                            legacy_prefix=LEGACY_PREFIX if default else None)


def readable(bucket: B | None) -> B | Unset:
    """`bucket`, or where IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set, the stand-in that reads a record's pointer
    and says the setting is missing: what a replay, or the CLI's show and purge, asks about a stored result. The
    bucket's module is imported only for a record that points to a bucket this environment was not given."""
    if bucket is not None:
        return bucket
    from .s3 import UNSET

    return UNSET
