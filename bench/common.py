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
# A session token as long as Lambda's (about 1,100 characters): the "+token" systems sign and send it.
SESSION_TOKEN = "IQoJb3JpZ2luX2VjE" + "".join(f"{n * 2654435761 % 4294967296:08x}" for n in range(135))
_ITEMS = [{"sku": "BOOK-42", "quantity": 1}, {"sku": "MUG-7", "quantity": 2}]
SQS_BATCH = 10  # records per batch on the batch rows, SQS and Kafka (Lambda's default batch size for SQS)
KAFKA_PARTITIONS = 2  # a Kafka row's batch holds SQS_BATCH records spread over this many partitions
E2E_POWERTOOLS_TABLE = "bench-e2e-powertools"  # the end-to-end Powertools function's table (bench/rie_bench.py)


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
    # The SQS batch rows: an unmodified consumer under the layer's default (record) scope, and Powertools'
    # BatchProcessor with idempotent_function per record; both keyed by each message's messageId.
    "layer-sqs": ("layer", {"transport": "lean", "cache": 0, "batch": "sqs"}),
    "powertools-sqs": ("powertools", {"cache": False, "batch": "sqs"}),
    # The Kafka batch rows: the same consumer on MSK batches, under IDEMPOTENCY_BATCH_PRECHECK's default (auto:
    # Kafka shows no redelivery, so no pre-check) and under `always`; Powertools' BatchProcessor(EventType.Kafka)
    # with idempotent_function per record, keyed by topic, partition and offset.
    "layer-kafka": ("layer", {"transport": "lean", "cache": 0, "batch": "kafka"}),
    "layer-kafka-always": ("layer", {"transport": "lean", "cache": 0, "batch": "kafka", "precheck": "always"}),
    "powertools-kafka": ("powertools", {"cache": False, "batch": "kafka"}),
    # The floor rows (bench/floor.py): the layer with a session token, and plain http.client sending the layer's
    # own requests, without and with one.
    "layer+token": ("layer", {"transport": "lean", "cache": 0, "token": True}),
    "floor": ("floor", {"cache": 0}),
    "floor+token": ("floor", {"cache": 0, "token": True}),
    # The layer with IDEMPOTENCY_METRICS=emf (an EMF document per invocation), for the cost of metrics (run.py).
    "layer+emf": ("layer", {"transport": "lean", "cache": 0, "metrics": "emf"}),
}


def layer_env(
    table: str, endpoint: str, transport: str = "lean", cache: int = 0, batch: str | None = None,
    metrics: str = "off", precheck: str | None = None,
) -> dict[str, str]:
    """The layer's settings, as a function would have them (the wrapper sets IDEMPOTENCY_ORIGINAL_HANDLER).

    `batch` ("sqs" or "kafka"): the batch consumer, with no key expression and no IDEMPOTENCY_SCOPE, so the
    layer's defaults apply: a batch runs per record, an SQS message keyed by its messageId, a Kafka record by its
    cluster, topic, partition and offset. `precheck`: IDEMPOTENCY_BATCH_PRECHECK (unset: the default, auto).
    """
    env = {
        "IDEMPOTENCY_ORIGINAL_HANDLER": "bench_handler.consumer" if batch else "bench_handler.handler",
        "IDEMPOTENCY_TABLE": table,
        "IDEMPOTENCY_KEY_JMESPATH": KEY_JMESPATH,
        "IDEMPOTENCY_KEY_PREFIX": KEY_PREFIX,
        "IDEMPOTENCY_TTL_SECONDS": str(TTL_SECONDS),
        "IDEMPOTENCY_LOCAL_CACHE_SIZE": str(cache),
        "IDEMPOTENCY_TRANSPORT": transport,
        "IDEMPOTENCY_METRICS": metrics,
        "AWS_ENDPOINT_URL_DYNAMODB": endpoint,
    }
    if batch:
        del env["IDEMPOTENCY_KEY_JMESPATH"]
    if precheck:
        env["IDEMPOTENCY_BATCH_PRECHECK"] = precheck
    return env


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


def make_powertools_batch(table: str, cache: bool, work: Any, kind: str = "sqs") -> Any:
    """Powertools' documented batch + idempotency: BatchProcessor, process_partial_response, and
    idempotent_function on the record handler; TTL, prefix and cache as make_powertools. An SQS message is keyed
    by its messageId; a Kafka record (EventType.Kafka, which Powertools 3.37.0's BatchProcessor processes) by its
    topic, partition and offset. `work(body)` is one record's work, the same function the layer's consumer calls
    per record."""
    from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    kafka = kind == "kafka"
    processor = BatchProcessor(event_type=EventType.Kafka if kafka else EventType.SQS)
    persistence = DynamoDBPersistenceLayer(table_name=table)
    config = IdempotencyConfig(
        event_key_jmespath="[topic, partition, offset]" if kafka else "messageId",
        expires_after_seconds=TTL_SECONDS,
        use_local_cache=cache,
        local_cache_max_items=CACHE_ITEMS,
    )

    @idempotent_function(data_keyword_argument="record", config=config, persistence_store=persistence,
                         key_prefix=KEY_PREFIX)
    def record_handler(record: Any) -> None:
        work(record.decoded_value.decode() if kafka else record.body)

    def lambda_handler(event: dict[str, Any], context: Any) -> Any:
        config.register_lambda_context(context)
        return process_partial_response(event=event, context=context, processor=processor,
                                        record_handler=record_handler)

    return lambda_handler


# The Valkey store's rows (bench/valkey_bench.py): a worker's TABLE argument is the server's URL.
VALKEY_SYSTEMS = ("bare", "layer-valkey", "powertools-cache")


def make_powertools_cache(url: str, handler: Any) -> Any:
    """Powertools' CachePersistenceLayer (redis-py) on the server at `url`, configured like make_powertools."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    persistence = CachePersistenceLayer(url=url, ssl=False)
    config = IdempotencyConfig(event_key_jmespath=KEY_JMESPATH, expires_after_seconds=TTL_SECONDS,
                               raise_on_no_idempotency_key=False)
    return idempotent(persistence_store=persistence, config=config, key_prefix=KEY_PREFIX)(handler)


def python() -> str:
    return sys.executable
