"""Results too large for a record, kept in the large-results bucket (moto's S3) through the cycle, on every store:
written before the completion, replayed byte for byte, refused when the object is missing or changed, and
completed without it (too large, as before) when S3 cannot take it in time. Executions counted by the handler."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError, IdempotencyResultTooLargeError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.s3 import Bucket
from tests.support.raw_server import RawServer, read_head

LONG = 60_000
CREDENTIALS = ("AKIDEXAMPLE", "secret", None)


@pytest.fixture
def bucket(s3_bucket: Any, moto: Any) -> Any:
    name, client = s3_bucket
    return Bucket(name, "idempotency-results/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=2,
                  read_timeout=10, endpoint=moto.endpoint), client


class Handler:
    def __init__(self, result: Any) -> None:
        self.calls = 0
        self.result = result

    def __call__(self) -> Any:
        self.calls += 1
        return self.result


@pytest.mark.parametrize("size", [512 * 1024, int(5.9 * 1024 * 1024)])
def test_a_large_result_replays_byte_for_byte(store: Any, bucket: Any, size: int) -> None:
    ours, client = bucket
    cycle = Cycle(store, ttl_seconds=3600, bucket=ours)
    handler = Handler(os.urandom(size))  # incompressible bytes
    first = cycle.run(Invocation(LONG), "fn#big", handler)
    again = cycle.run(Invocation(LONG), "fn#big", handler)
    assert handler.calls == 1 and again.replayed and again.value == first.value == handler.result
    record = store.get("fn#big")
    assert record.result.format == codec.STORED + codec.TAGGED + codec.COMPRESSED  # bytes, tagged outside a runtime
    pointer = json.loads(record.result.data)
    assert pointer["key"] == f"idempotency-results/fn#big/{record.owner}" and pointer["size"] >= size * 0.75
    assert client.head_object(Bucket=ours.name, Key=pointer["key"])["ServerSideEncryption"] == "AES256"


def test_a_missing_or_changed_object_is_refused_and_nothing_runs(store: Any, bucket: Any) -> None:
    ours, client = bucket
    cycle = Cycle(store, ttl_seconds=3600, bucket=ours)
    handler = Handler(os.urandom(600 * 1024))
    cycle.run(Invocation(LONG), "fn#k", handler)
    key = json.loads(store.get("fn#k").result.data)["key"]
    client.put_object(Bucket=ours.name, Key=key, Body=os.urandom(600 * 1024))
    with pytest.raises(IdempotencyPersistenceLayerError, match="is not the one written") as raised:
        cycle.run(Invocation(LONG), "fn#k", handler)
    assert raised.value.permanent
    client.delete_object(Bucket=ours.name, Key=key)
    with pytest.raises(IdempotencyPersistenceLayerError, match="is missing"):
        cycle.run(Invocation(LONG), "fn#k", handler)
    assert handler.calls == 1


def test_a_bucket_that_cannot_take_it_completes_without_it(store: Any) -> None:
    down = Bucket("b", "p/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=0.2, read_timeout=0.2,
                  endpoint="http://127.0.0.1:9")
    cycle = Cycle(store, ttl_seconds=3600, bucket=down)
    handler = Handler(os.urandom(600 * 1024))
    assert cycle.run(Invocation(LONG), "fn#down", handler).value == handler.result  # this caller gets its result
    with pytest.raises(IdempotencyResultTooLargeError):
        cycle.run(Invocation(LONG), "fn#down", handler)
    without = Cycle(store, ttl_seconds=3600)  # no bucket: as before
    without.run(Invocation(LONG), "fn#none", handler)
    with pytest.raises(IdempotencyResultTooLargeError):
        without.run(Invocation(LONG), "fn#none", handler)
    assert handler.calls == 2 and store.get("fn#none").result == codec.Encoded(codec.TOO_LARGE, None)


def test_an_upload_that_stalls_ends_within_the_completions_time_and_completes_without_it(store: Any) -> None:
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))  # accepts, reads, never answers
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        stalled = Bucket("b", "p/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=2, read_timeout=30,
                         endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}")
        cycle = Cycle(store, ttl_seconds=3600, bucket=stalled)
        handler = Handler(os.urandom(600 * 1024))
        started = time.monotonic()
        assert cycle.run(Invocation(2500), "fn#slow", handler).value == handler.result  # 2.5 s left
        assert time.monotonic() - started < 2.5  # the upload gave up in time for the completion
        assert store.get("fn#slow").result == codec.Encoded(codec.TOO_LARGE, None) and handler.calls == 1
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_an_object_whose_completion_never_landed_is_left_to_the_lifecycle_rule(store: Any, bucket: Any) -> None:
    """A kill between the upload and the completion: the claim expires, the next copy runs and writes its own object
    (under its own owner), which is what its record points to; the first object is nobody's."""
    ours, client = bucket
    cycle = Cycle(store, ttl_seconds=3600, bucket=ours)
    now = time.time()
    assert store.claim("fn#killed", "dead-owner", now, int(now * 1000) - 1, int(now) + 3600) is None  # expired
    ours.put("fn#killed", "dead-owner", os.urandom(600 * 1024))  # uploaded, then the environment died
    handler = Handler(os.urandom(600 * 1024))
    cycle.run(Invocation(LONG), "fn#killed", handler)
    assert cycle.run(Invocation(LONG), "fn#killed", handler).value == handler.result and handler.calls == 1
    keys = sorted(item["Key"] for item in client.list_objects_v2(Bucket=ours.name)["Contents"])
    owner = store.get("fn#killed").owner
    assert keys == sorted([f"idempotency-results/fn#killed/{owner}", "idempotency-results/fn#killed/dead-owner"])


def _trickle(conn: Any) -> None:
    """Read a request, then answer it a few bytes at a time (never a socket timeout)."""
    read_head(conn)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nx-padding: " + b"x" * 400 + b"\r\n\r\n"
    for i in range(0, len(answer), 8):
        conn.sendall(answer[i:i + 8])
        time.sleep(0.25)


def test_an_s3_that_answers_a_few_bytes_at_a_time_is_given_up_by_the_deadline(store: Any) -> None:
    trickle = RawServer(_trickle)
    try:
        slow = Bucket("b", "p/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=2, read_timeout=3,
                      endpoint=trickle.endpoint)
        cycle = Cycle(store, ttl_seconds=3600, bucket=slow)
        handler = Handler(os.urandom(600 * 1024))
        started = time.monotonic()
        assert cycle.run(Invocation(3000), "fn#trickle", handler).value == handler.result
        assert time.monotonic() - started < 3.0  # within the invocation: its completion landed
        assert store.get("fn#trickle").result == codec.Encoded(codec.TOO_LARGE, None) and handler.calls == 1
    finally:
        trickle.close()


def test_a_replay_reads_the_bucket_its_pointer_names(store: Any, bucket: Any, moto: Any) -> None:
    """After the setting moved, with the old bucket on the read allow-list (IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS);
    tests/store/test_large_result_pointers.py: without it, nothing is read."""
    ours, client = bucket
    handler = Handler(os.urandom(600 * 1024))
    Cycle(store, ttl_seconds=3600, bucket=ours).run(Invocation(LONG), "fn#moved", handler)
    client.create_bucket(Bucket=ours.name + "-new")
    moved = Bucket(ours.name + "-new", "idempotency-results/", region="us-east-1", credentials=CREDENTIALS,
                   connect_timeout=2, read_timeout=10, endpoint=moto.endpoint, read_buckets=(ours.name,))
    again = Cycle(store, ttl_seconds=3600, bucket=moved).run(Invocation(LONG), "fn#moved", handler)
    assert again.replayed and again.value == handler.result and handler.calls == 1


def _opened(moto: Any, monkeypatch: pytest.MonkeyPatch, name: str, **settings: str) -> Any:
    """The bucket the layer opens from its settings (the function `fn`, moto's S3)."""
    from idempotency_layer import config
    from idempotency_layer.stores import open_bucket

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.endpoint)
    return open_bucket(config.load({"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "AWS_LAMBDA_FUNCTION_NAME": "fn",
                                    "IDEMPOTENCY_TABLE": "t-1", "IDEMPOTENCY_LARGE_RESULTS_BUCKET": name,
                                    **settings}))


def test_a_record_completed_before_the_per_function_prefix_replays_after_the_upgrade(
        store: Any, bucket: Any, moto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the upgrade the default prefix was idempotency-results/ for every function: a record completed then
    points to idempotency-results/<record key>/<owner>, which the upgraded layer (default prefix
    idempotency-results/fn/) still replays, so nothing runs twice; new objects go under the function's prefix."""
    old, client = bucket  # the layer before the upgrade
    handler = Handler(os.urandom(600 * 1024))
    Cycle(store, ttl_seconds=3600, bucket=old).run(Invocation(LONG), "fn#before", handler)
    legacy = json.loads(store.get("fn#before").result.data)["key"]
    assert legacy == f"idempotency-results/fn#before/{store.get('fn#before').owner}"
    upgraded = _opened(moto, monkeypatch, old.name)
    assert upgraded.prefix == "idempotency-results/fn/"
    cycle = Cycle(store, ttl_seconds=3600, bucket=upgraded)
    again = cycle.run(Invocation(LONG), "fn#before", handler)
    assert again.replayed and again.value == handler.result and handler.calls == 1
    after = Handler(os.urandom(600 * 1024))
    cycle.run(Invocation(LONG), "fn#after", after)
    assert cycle.run(Invocation(LONG), "fn#after", after).value == after.result and after.calls == 1
    owner = store.get("fn#after").owner
    assert json.loads(store.get("fn#after").result.data)["key"] == f"idempotency-results/fn/fn#after/{owner}"
    client.head_object(Bucket=old.name, Key=f"idempotency-results/fn/fn#after/{owner}")
    explicit = _opened(moto, monkeypatch, old.name, IDEMPOTENCY_LARGE_RESULTS_PREFIX="results/fn/")
    with pytest.raises(IdempotencyPersistenceLayerError, match="its object key is not") as raised:
        Cycle(store, ttl_seconds=3600, bucket=explicit).run(Invocation(LONG), "fn#before", handler)
    assert raised.value.permanent and handler.calls == 1  # an explicit prefix reads only its own objects
