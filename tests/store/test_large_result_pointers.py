"""Pointers to stored results are confined even without a record MAC (security review R2.2, T2.2): a record whose
pointer names another bucket, an object outside `<prefix><record key>/<32 hex owner>`, or a size over the cap is
refused with IdempotencyPersistenceLayerError (permanent; the handler does not run), and S3 sees nothing: requests
and bytes are counted on the wire, by a proxy in front of moto's S3, not by the layer. A pointer to a bucket on
IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS is read; an answer announcing another length than the pointer's is refused.

The forged records are written by the layer itself: a first run whose bucket stand-in completes the record with
the forged pointer, on every store; the replay then goes through the real bucket."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.s3 import MAX_OBJECT_BYTES, Bucket, Pointer, stored
from tests.support.counting_proxy import CountingProxy
from tests.support.raw_server import RawServer, read_head

LONG = 60_000
CREDENTIALS = ("AKIDEXAMPLE", "secret", None)
PREFIX = "idempotency-results/fn/"
OWNER = "0123456789abcdef" * 2


class Forger:
    """A large-results bucket that writes nothing and completes each record with `pointer` (None: one to
    `object_key` in `bucket` with the result's own size and digest): the record a forger with write access to the
    table would plant. `packed`: the result's bytes, as they would have been stored."""

    def __init__(self, pointer: Pointer | None = None, object_key: str = "", bucket: str | None = None) -> None:
        self.pointer, self.object_key, self.bucket = pointer, object_key, bucket
        self.packed = b""

    def keep(self, key: str, owner: str, result: codec.Oversized, deadline: Any = None) -> codec.Encoded:
        self.packed = result.packed
        found = self.pointer or Pointer(self.object_key, len(self.packed), hashlib.sha256(self.packed).hexdigest(),
                                        self.bucket)
        return stored(found, result.inner)


class Handler:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return os.urandom(600 * 1024)  # over what a record holds


@pytest.fixture
def counted(s3_bucket: Any, moto: Any) -> Any:
    """The bucket `s3_bucket` behind a counting proxy: (name, boto3 client, proxy)."""
    name, client = s3_bucket
    upstream = moto.endpoint.rsplit(":", 1)
    proxy = CountingProxy(upstream[0].split("//")[1], int(upstream[1]))
    yield name, client, proxy
    proxy.close()


def _bucket(name: str, endpoint: str, read: tuple[str, ...] = ()) -> Bucket:
    return Bucket(name, PREFIX, region="us-east-1", credentials=CREDENTIALS, connect_timeout=2, read_timeout=10,
                  endpoint=endpoint, read_buckets=read)


def _planted(store: Any, key: str, forger: Forger) -> Handler:
    """`key` completed with the forger's pointer as its stored result; the handler that ran once."""
    handler = Handler()
    Cycle(store, ttl_seconds=3600, bucket=forger).run(Invocation(LONG), key, handler)  # type: ignore[arg-type]
    assert handler.calls == 1 and store.get(key).result.format.startswith(codec.STORED)
    return handler


SHA = "ab" * 32


@pytest.mark.parametrize(("forged", "said"), [
    (Pointer(f"{PREFIX}fn#k/{OWNER}", 100, SHA, "tenant-b-private"),
     "names the bucket 'tenant-b-private', which is neither IDEMPOTENCY_LARGE_RESULTS_BUCKET"),
    (Pointer("payroll/2026-12.json", 100, SHA, None), "its object key is not the one this layer writes"),
    (Pointer(f"{PREFIX}fn#other/{OWNER}", 100, SHA, None), "its object key is not"),  # another record's object
    (Pointer(f"{PREFIX}fn#k/owner-1", 100, SHA, None), "its object key is not"),  # another owner form
    (Pointer(f"{PREFIX}fn#k/{OWNER.upper()}", 100, SHA, None), "its object key is not"),
    (Pointer(f"{PREFIX}fn#k/{OWNER}/x", 100, SHA, None), "its object key is not"),
    (Pointer(f"{PREFIX}fn#k/../../payroll/{OWNER}", 100, SHA, None), "its object key is not"),  # .. segments
    (Pointer(f"{PREFIX}../other-fn/fn#k/{OWNER}", 100, SHA, None), "its object key is not"),
    (Pointer(f"{PREFIX}fn#k/{OWNER}", 5 * 1024 ** 3, SHA, None), "its size (5368709120 bytes) is over"),
], ids=["other-bucket", "outside-prefix", "other-record", "owner-form", "owner-upper", "deeper", "dotdot",
        "dotdot-prefix", "5-GiB"])
def test_a_pointer_outside_the_layers_bucket_prefix_or_size_is_refused_with_no_s3_request(
        store: Any, counted: Any, forged: Pointer, said: str) -> None:
    name, client, proxy = counted
    client.put_object(Bucket=name, Key=forged.object_key, Body=b"x" * 100)  # there to read, were it followed
    handler = _planted(store, "fn#k", Forger(forged))
    proxy.reset()
    cycle = Cycle(store, ttl_seconds=3600, bucket=_bucket(name, proxy.endpoint))
    with pytest.raises(IdempotencyPersistenceLayerError, match="the handler did not run") as raised:
        cycle.run(Invocation(LONG), "fn#k", handler)
    assert said in str(raised.value) and raised.value.permanent
    assert forged.object_key not in str(raised.value)  # the problem is named, not the pointer's content
    assert handler.calls == 1 and proxy.total() == 0 and proxy.bytes_sent == 0


def test_a_pointer_to_a_bucket_on_the_read_allow_list_is_read(store: Any, counted: Any, moto: Any) -> None:
    name, client, proxy = counted
    old = Bucket(name, PREFIX, region="us-east-1", credentials=CREDENTIALS, connect_timeout=2, read_timeout=10,
                 endpoint=moto.endpoint)
    handler = Handler()
    Cycle(store, ttl_seconds=3600, bucket=old).run(Invocation(LONG), "fn#moved", handler)
    client.create_bucket(Bucket=name + "-new")
    moved = _bucket(name + "-new", proxy.endpoint, read=(name,))  # the setting moved; the old bucket still read
    proxy.reset()
    again = Cycle(store, ttl_seconds=3600, bucket=moved).run(Invocation(LONG), "fn#moved", handler)
    assert again.replayed and handler.calls == 1 and proxy.snapshot()[0] == {"GetObject": 1}
    proxy.reset()
    unlisted = _bucket(name + "-new", proxy.endpoint)  # the old bucket not listed: not read
    with pytest.raises(IdempotencyPersistenceLayerError, match="IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS") as raised:
        Cycle(store, ttl_seconds=3600, bucket=unlisted).run(Invocation(LONG), "fn#moved", handler)
    assert raised.value.permanent and handler.calls == 1 and proxy.total() == 0 and proxy.bytes_sent == 0


class Announcing(RawServer):
    """An S3 stand-in on loopback that answers every GET 200 with `length` as its Content-Length (None: chunked,
    no length) and then `body`; it counts the requests it got and the body bytes it could send."""

    def __init__(self, length: int | None, body: bytes) -> None:
        self.length, self.body = length, body
        self.requests = 0
        self.sent = 0
        super().__init__(self._answer)

    def _answer(self, conn: socket.socket) -> None:
        read_head(conn)
        self.requests += 1
        head = (f"Content-Length: {self.length}" if self.length is not None else "Transfer-Encoding: chunked")
        conn.sendall(f"HTTP/1.1 200 OK\r\n{head}\r\nConnection: close\r\n\r\n".encode())
        for i in range(0, len(self.body), 65536):
            part = self.body[i:i + 65536]
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part) if self.length is None else part)
            self.sent += len(part)
        if self.length is None:
            conn.sendall(b"0\r\n\r\n")


def test_an_answer_of_another_length_than_the_pointers_is_refused(store: Any) -> None:
    forger = Forger(object_key=f"{PREFIX}fn#len/{OWNER}", bucket="results-1")
    handler = _planted(store, "fn#len", forger)
    body = forger.packed
    for length, served in ((5 * 1024 ** 3, body), (len(body) - 1, body[:-1]),
                           (None, body + os.urandom(3 * 1024 * 1024))):
        server = Announcing(length, served)
        try:
            cycle = Cycle(store, ttl_seconds=3600, bucket=_bucket("results-1", server.endpoint))
            with pytest.raises(IdempotencyPersistenceLayerError, match="is not the one written") as raised:
                cycle.run(Invocation(LONG), "fn#len", handler)
            assert raised.value.permanent and server.requests == 1 and handler.calls == 1, length
        finally:
            server.close()
    right = Announcing(len(body), body)
    try:  # the same server, announcing the pointer's size: read
        again = Cycle(store, ttl_seconds=3600, bucket=_bucket("results-1", right.endpoint)).run(
            Invocation(LONG), "fn#len", handler)
        assert again.replayed and handler.calls == 1 and right.requests == 1
    finally:
        right.close()


def test_the_cap_is_above_what_lambda_can_answer() -> None:
    assert 6 * 1024 * 1024 < MAX_OBJECT_BYTES == 8 * 1024 * 1024


def test_an_http_request_whose_record_points_elsewhere_is_answered_503_and_runs_nothing(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, layer_env: Any, table: str, ddb_client: Any,
        counted: Any) -> None:
    """E2.3 of the review through the interceptor: a request completed with a large body, its record then forged to
    point to another bucket's object (as one who may write the table can): the copy is answered 503, the handler
    does not run again, and S3 gets no byte."""
    import importlib
    import sys
    import time

    from idempotency_layer.config import Attributes
    from idempotency_layer.stores.dynamodb.store import DynamoDBStore
    from tests.conftest import build_transport
    from tests.support.http_events import v2
    from tests.support.inprocess import Function

    name, _, proxy = counted
    (tmp_path / "pointer_app.py").write_text("def handler(event, context):\n    return event\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for variable, value in {"AWS_LAMBDA_FUNCTION_NAME": "fn", "IDEMPOTENCY_ORIGINAL_HANDLER": "pointer_app.handler",
                            "IDEMPOTENCY_TABLE": table, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": name,
                            "AWS_ENDPOINT_URL_S3": proxy.endpoint}.items():
        monkeypatch.setenv(variable, value)
    sys.modules.pop("idempotency_layer.interceptor", None)
    try:
        function = Function(importlib.import_module("idempotency_layer.interceptor"))
        body = os.urandom(700 * 1024).hex()
        function.user = lambda event, context: {"statusCode": 200, "body": body}
        event = v2("POST", "/orders", {"idempotency-key": "k-42", "content-type": "application/json"}, "{}")
        assert function(event)["statusCode"] == 200 and len(function.runs) == 1
        replayed = function(event)  # the record as the layer wrote it: replayed
        assert replayed["statusCode"] == 200 and replayed["body"] == body and len(function.runs) == 1
        store = DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2), table,
                              Attributes(), key_prefix="fn")
        (key,) = [item["id"]["S"] for item in ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]]
        record = store.get(key)
        assert record is not None and record.result is not None and record.owner is not None
        assert record.result.format.startswith(codec.STORED)
        owner, form = record.owner, record.result.format

        def plant(data: str) -> None:  # the record completed anew with `data` as its pointer
            now = time.time()
            assert store.purge(key, record.status, owner)
            assert store.claim(key, owner, now, int((now + 300) * 1000), int(now + 3600), record.fingerprint) is None
            assert store.complete(key, owner, codec.Encoded(form, data), int(now + 3600))

        plant(str(record.result.data))  # planted as written: still replayed (what the forgery alone changes)
        assert function(event)["body"] == body and len(function.runs) == 1
        plant(Pointer(f"{PREFIX}{key}/{owner}", 100, SHA, "tenant-b-private").text())
        proxy.reset()
        answer = function(event)
        assert answer["statusCode"] == 503 and body[:64] not in json.dumps(answer), answer
        assert len(function.runs) == 1 and proxy.total() == 0 and proxy.bytes_sent == 0
    finally:
        sys.modules.pop("idempotency_layer.interceptor", None)
