"""The lean client's connections on DynamoDB Local: connections the server closed between invocations,
batch-sized concurrency over the pool, and the interceptor's whole init in the plain Lambda environment without
botocore or urllib3."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from idempotency_layer.stores.dynamodb import connection
from idempotency_layer.stores.dynamodb.client import Client
from tests.conftest import build_transport

LAYER = Path(__file__).resolve().parents[2] / "layer"


def wait_until_the_server_closed(transport, timeout=10.0):
    """Until every idle connection reads as closed: the proxy's close has reached this side."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(connection._alive(c) for c in transport.pool._idle):
            return
        time.sleep(0.01)
    raise AssertionError("the idle connections were not closed by the server")


def put(transport, table, key):
    transport.call("PutItem", {"TableName": table, "Item": {"id": {"S": key}}})


def test_a_connection_the_server_closed_between_invocations_is_reopened(layer_env, proxy, table, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    transport = build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=1)  # no retry to spend
    put(transport, table, "a")
    for round_ in range(3):
        proxy.drop_connections()  # the server side closes the idle connection (as after a long freeze)
        wait_until_the_server_closed(transport)
        put(transport, table, f"b{round_}")
    assert transport.pool.opened == 4


def test_a_connection_closed_as_the_request_goes_is_sent_again_not_retried(layer_env, proxy, table, monkeypatch):
    # The idle check cannot see a close that races the send: the request fails on the old connection before
    # any answer, and goes again on a new one without using an attempt.
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    transport = build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=1)
    put(transport, table, "a")
    proxy.drop_connections()
    wait_until_the_server_closed(transport)
    monkeypatch.setattr(connection, "_alive", lambda _: True)
    proxy.reset()
    put(transport, table, "b")
    assert transport.pool.opened == 2 and transport.pool.resent == 1
    assert proxy.snapshot()[0] == {"PutItem": 1}
    item = transport.call("GetItem", {"TableName": table, "Key": {"id": {"S": "b"}}, "ConsistentRead": True})
    assert item["Item"] == {"id": {"S": "b"}}


def test_ten_threads_share_the_pool(layer_env, proxy, table, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    transport = build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2)
    assert isinstance(transport, Client) and transport.target.source == "environment"
    errors: list[BaseException] = []

    def work(n):
        try:
            for i in range(5):
                put(transport, table, f"t{n}-{i}")
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    for _ in range(2):  # two batches: the second reuses the first one's connections
        threads = [threading.Thread(target=work, args=(n,)) for n in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not errors
    assert transport.pool.opened <= 10


def test_the_interceptors_init_in_the_plain_environment_imports_no_botocore(layer_env, table, tmp_path):
    (tmp_path / "app.py").write_text("def handler(event, context):\n    return {'ok': True}\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(LAYER), str(tmp_path)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        **{name: os.environ[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")},
        "AWS_ENDPOINT_URL_DYNAMODB": os.environ["AWS_ENDPOINT_URL_DYNAMODB"],
        "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
        "IDEMPOTENCY_TABLE": table,
        "IDEMPOTENCY_KEY_JMESPATH": "orderId",
        "AWS_LAMBDA_FUNCTION_NAME": "plain",
    }
    code = (
        "import sys; import idempotency_layer.interceptor as i; "
        "print(i.handler.cycle.store.transport.target.source); "
        "print(i.handler({'orderId': 'x'}, None)); "
        "print(' '.join(sorted(sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    kind, answer, modules = run.stdout.splitlines()
    assert kind == "environment" and answer == "{'ok': True}"
    loaded = {name.split(".")[0] for name in modules.split()}
    assert not loaded & {"botocore", "boto3", "urllib3", "s3transfer", "requests", "dateutil"}
