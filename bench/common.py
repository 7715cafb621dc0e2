"""What the parent and its workers share: the events, the systems and how each is configured."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LAYER_SRC = ROOT / "layer"

KEY_JMESPATH = "orderId"
KEY_PREFIX = "bench"
TTL_SECONDS = 3600
CACHE_ITEMS = 1024  # room for every key a run touches, so a cache hit never depends on eviction
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_ITEMS = [{"sku": "BOOK-42", "quantity": 1}, {"sku": "MUG-7", "quantity": 2}]


def event(namespace: str, index: int, size: str = "small", keyed: bool = True) -> dict[str, Any]:
    """The `index`th event of a key namespace; every system gets exactly these."""
    result: dict[str, Any] = {"items": [dict(item) for item in _ITEMS], "size": size}
    if keyed:
        result["orderId"] = f"order-{namespace}-{index:05d}"
    return result


class Context:
    """Enough of a LambdaContext for both libraries: a deadline, a name, a request id."""

    function_name = "bench"
    function_version = "$LATEST"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    aws_request_id = "00000000-0000-0000-0000-000000000000"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


# system -> (kind, settings); a worker process per system, since both libraries configure themselves once.
SYSTEMS: dict[str, tuple[str, dict[str, Any]]] = {
    "bare": ("bare", {}),
    "layer": ("layer", {"transport": "lean", "cache": 0}),
    "layer-boto3": ("layer", {"transport": "boto3", "cache": 0}),
    "powertools": ("powertools", {"cache": False}),
    "layer+cache": ("layer", {"transport": "lean", "cache": CACHE_ITEMS}),
    "powertools+cache": ("powertools", {"cache": True}),
}


def layer_env(table: str, endpoint: str, transport: str = "lean", cache: int = 0) -> dict[str, str]:
    """The layer's settings, as a function would have them (the wrapper sets IDEMPOTENCY_ORIGINAL_HANDLER)."""
    return {
        "IDEMPOTENCY_ORIGINAL_HANDLER": "bench_handler.handler",
        "IDEMPOTENCY_TABLE": table,
        "IDEMPOTENCY_KEY_JMESPATH": KEY_JMESPATH,
        "IDEMPOTENCY_KEY_PREFIX": KEY_PREFIX,
        "IDEMPOTENCY_TTL_SECONDS": str(TTL_SECONDS),
        "IDEMPOTENCY_LOCAL_CACHE_SIZE": str(cache),
        "IDEMPOTENCY_TRANSPORT": transport,
        "AWS_ENDPOINT_URL_DYNAMODB": endpoint,
    }


def base_env(endpoint: str) -> dict[str, str]:
    """The environment every worker starts from: no user AWS config, the bench's credentials and endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "IDEMPOTENCY_", "POWERTOOLS_"))}
    env.update(CREDENTIALS)
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
    env["AWS_LAMBDA_FUNCTION_NAME"] = "bench"
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH), str(LAYER_SRC)])
    return env


def make_powertools(table: str, cache: bool, handler: Any) -> Any:
    """Powertools configured like the layer: same key expression, TTL, prefix and cache size."""
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent,
    )

    persistence = DynamoDBPersistenceLayer(table_name=table)
    config = IdempotencyConfig(
        event_key_jmespath=KEY_JMESPATH,
        expires_after_seconds=TTL_SECONDS,
        use_local_cache=cache,
        local_cache_max_items=CACHE_ITEMS,
        raise_on_no_idempotency_key=False,  # the layer's IDEMPOTENCY_REQUIRE_KEY=false: pass through
    )
    return idempotent(persistence_store=persistence, config=config, key_prefix=KEY_PREFIX)(handler)


def python() -> str:
    return sys.executable
