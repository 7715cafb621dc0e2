"""The CLI with IDEMPOTENCY_LARGE_RESULTS_BUCKET (DynamoDB Local and moto's S3), as a subprocess: purge deletes a
record's object with it; doctor writes, reads and deletes a probe object, and fails on a bucket it cannot use."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.invocation import Invocation
from idempotency_layer.s3 import Bucket
from idempotency_layer.store import DynamoDBStore
from tests.conftest import build_transport
from tests.store.test_cli_commands import cli_env, run


@pytest.fixture
def bucket(s3_bucket: Any, moto: Any) -> Any:
    name, client = s3_bucket
    return name, moto.endpoint, client


def test_purge_deletes_the_records_object_and_doctor_probes_the_bucket(layer_env: Any, table: str,
                                                                       bucket: Any) -> None:
    name, endpoint, client = bucket
    store = DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2), table,
                          Attributes())
    ours = Bucket(name, "idempotency-results/", region="us-east-1", credentials=("a", "b", None),
                  connect_timeout=2, read_timeout=10, endpoint=endpoint)
    Cycle(store, ttl_seconds=3600, bucket=ours).run(Invocation(60_000), "orders#big", lambda: os.urandom(600_000))
    object_key = json.loads(store.get("orders#big").result.data)["key"]
    env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name, AWS_ENDPOINT_URL_S3=endpoint)
    done = run(env, "purge", "orders#big", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"deleted the record of key orders#big (it was completed); its result: deleted "
                                   f"s3://{name}/{object_key}")
    assert client.list_objects_v2(Bucket=name).get("KeyCount") == 0
    doctor = run(env, "doctor", "--key-jmespath", "orderId", "--require-key", "true")
    lines = doctor.stdout.splitlines()
    for check in ("PutObject", "GetObject", "DeleteObject"):
        assert any(line.startswith(f"PASS large results {check}:") for line in lines), doctor.stdout
    assert doctor.returncode == 0 and client.list_objects_v2(Bucket=name).get("KeyCount") == 0
    # A purge whose object S3 will not delete: the record is deleted, and the object named as left to the rule.
    Cycle(store, ttl_seconds=3600, bucket=ours).run(Invocation(60_000), "orders#big", lambda: os.urandom(600_000))
    object_key = json.loads(store.get("orders#big").result.data)["key"]
    done = run({**env, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}, "purge", "orders#big", "--yes")
    assert done.returncode == 0 and f"left in place: s3://{name}/{object_key}" in done.stdout, done.stdout
    assert store.get("orders#big") is None
    gone = run({**env, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "no-such-bucket-1"}, "doctor")
    assert gone.returncode == 1 and any(line.startswith("FAIL large results bucket:") and "NoSuchBucket" in line
                                        for line in gone.stdout.splitlines())
