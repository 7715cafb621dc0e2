"""The CLI with IDEMPOTENCY_LARGE_RESULTS_BUCKET (DynamoDB Local and moto's S3), as a subprocess: purge deletes a
record's object with it, in the bucket its pointer names, and refuses a pointer outside the layer's prefix;
show --result reads and checks the object as a replay does, or names what is wrong; doctor writes, reads and deletes
a probe object, and fails on a bucket it cannot use."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.s3 import Bucket
from tests.conftest import build_transport
from tests.store.test_cli_commands import cli_env, one_line, run


@pytest.fixture
def bucket(s3_bucket: Any, moto: Any) -> Any:
    name, client = s3_bucket
    return name, moto.endpoint, client


def _store(table: str) -> DynamoDBStore:
    return DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2), table,
                         Attributes(), key_prefix="fn")


def _bucket(name: str, endpoint: str) -> Bucket:
    return Bucket(name, "idempotency-results/", region="us-east-1", credentials=("a", "b", None),
                  connect_timeout=2, read_timeout=10, endpoint=endpoint)


def test_purge_deletes_the_records_object_and_doctor_probes_the_bucket(layer_env: Any, table: str,
                                                                       bucket: Any) -> None:
    name, endpoint, client = bucket
    store = _store(table)
    ours = _bucket(name, endpoint)
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
    gone = run({**env, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "no-such-bucket-1"}, "doctor")
    assert gone.returncode == 1 and any(line.startswith("FAIL large results bucket:") and "NoSuchBucket" in line
                                        for line in gone.stdout.splitlines())


# -- show --result on a result kept in S3 (issue 42, item 4) ---------------------------------------------------

class RawBytes:
    """Results as the runtime's bytes (format `bytes`): random bytes do not compress, so the object is stored
    uncompressed (`s3:bytes`), as a handler returning bytes under the runtime stores it."""

    def encode(self, value: Any) -> Any:
        return value, codec.pack(codec.BYTES, value)

    def decode(self, encoded: Any) -> Any:
        return codec.decode(encoded)


def _object(store: DynamoDBStore, key: str) -> str:
    return str(json.loads(store.get(key).result.data)["key"])


class Denying(ThreadingHTTPServer):
    """An S3 endpoint that answers every request 403 AccessDenied, as S3 answers a caller without the permission."""

    def __init__(self) -> None:
        class Deny(BaseHTTPRequestHandler):
            def _deny(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                self.send_response(403)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_DELETE = _deny

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Deny)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def test_show_result_reads_the_object_the_pointer_names_compressed_or_not(layer_env: Any, table: str,
                                                                         bucket: Any) -> None:
    name, endpoint, client = bucket
    store = _store(table)
    ours = _bucket(name, endpoint)
    report = {"report": os.urandom(1_000_000).hex()}  # compresses, but not into a record: s3:json+z
    Cycle(store, ttl_seconds=3600, bucket=ours).run(Invocation(60_000), "orders#z", lambda: report)
    raw = os.urandom(600_000)  # does not compress: s3:bytes
    Cycle(store, ttl_seconds=3600, bucket=ours, results=RawBytes()).run(Invocation(60_000), "orders#raw",
                                                                          lambda: raw)
    assert store.get("orders#z").result.format == "s3:json+z" and store.get("orders#raw").result.format == "s3:bytes"
    client.create_bucket(Bucket=name + "-new")  # the setting moved since: the pointer's bucket is read
    env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name + "-new",
                  IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS=name, AWS_ENDPOINT_URL_S3=endpoint)
    shown = run(env, "show", "orders#z", "--result", "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)["records"][0]
    assert record["result"] == {"value": report}
    assert record["result_object"] == {"bucket": name, "key": _object(store, "orders#z"),
                                       "size": record["result_object"]["size"],
                                       "sha256": record["result_object"]["sha256"]}
    text = run(env, "show", "orders#z", "--result")
    assert text.returncode == 0 and f'result value:      {{"report": "{report["report"]}"}}' in text.stdout
    assert f"result object:     s3://{name}/{_object(store, 'orders#z')} (" in text.stdout
    import base64

    shown = run(env, "show", "orders#raw", "--result", "--json")
    assert json.loads(shown.stdout)["records"][0]["result"] == {"value": {"$bytes": base64.b64encode(raw).decode()}}


def test_show_result_names_a_missing_changed_or_denied_object_and_prints_no_content(layer_env: Any, table: str,
                                                                                   bucket: Any) -> None:
    name, endpoint, client = bucket
    store = _store(table)
    ours = _bucket(name, endpoint)
    secret = "SECRET-" + os.urandom(600_000).hex()
    Cycle(store, ttl_seconds=3600, bucket=ours).run(Invocation(60_000), "orders#s", lambda: {"card": secret})
    object_key = _object(store, "orders#s")
    env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name, AWS_ENDPOINT_URL_S3=endpoint)

    def shown(env: dict[str, str]) -> tuple[dict[str, Any], str]:
        as_json, as_text = run(env, "show", "orders#s", "--result", "--json"), run(env, "show", "orders#s", "--result")
        assert as_json.returncode == as_text.returncode == 0, as_json.stderr
        for out in (as_json.stdout, as_json.stderr, as_text.stdout, as_text.stderr):
            assert "SECRET" not in out and "card" not in out
        line = next(x for x in as_text.stdout.splitlines() if x.startswith("result value:"))
        return json.loads(as_json.stdout)["records"][0]["result"], line

    client.put_object(Bucket=name, Key=object_key, Body=b"SECRET-but-another-object")
    result, line = shown(env)
    assert result["error"] == "Different" and f"s3://{name}/{object_key} is not the one written" in result["none"]
    assert f"s3://{name}/{object_key} is not the one written" in line
    client.delete_object(Bucket=name, Key=object_key)
    result, line = shown(env)
    assert result["error"] == "Missing" and f"s3://{name}/{object_key} is missing" in line
    with Denying() as denying:
        result, line = shown({**env, "AWS_ENDPOINT_URL_S3": denying.endpoint})
    assert result["error"] == "AccessDenied" and "HTTP 403 AccessDenied" in line
    result, line = shown(cli_env(layer_env.endpoint, table))  # no bucket setting here
    assert result["error"] == "NoBucket" and "IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set" in line


# -- purge of a record kept in S3 (issue 42, item 5) -----------------------------------------------------------

def test_purge_deletes_the_object_in_the_bucket_its_pointer_names(layer_env: Any, table: str, bucket: Any) -> None:
    name, endpoint, client = bucket
    store = _store(table)
    Cycle(store, ttl_seconds=3600, bucket=_bucket(name, endpoint)).run(Invocation(60_000), "orders#old",
                                                                       lambda: os.urandom(600_000))
    object_key = _object(store, "orders#old")
    client.create_bucket(Bucket=name + "-new")
    env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name + "-new",
                  IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS=name, AWS_ENDPOINT_URL_S3=endpoint)
    done = run(env, "purge", "orders#old", "--yes")
    assert done.returncode == 0, done.stderr
    assert client.list_objects_v2(Bucket=name).get("KeyCount") == 0 and store.get("orders#old") is None
    assert done.stdout == (f"deleted the record of key orders#old (it was completed); its result: deleted "
                           f"s3://{name}/{object_key}\n")
    Cycle(store, ttl_seconds=3600, bucket=_bucket(name, endpoint)).run(Invocation(60_000), "orders#old",
                                                                       lambda: os.urandom(600_000))
    object_key = _object(store, "orders#old")
    done = run(env, "purge", "orders#old", "--yes", "--json")
    assert json.loads(done.stdout)["deleted"][0]["object"] == {"bucket": name, "key": object_key, "deleted": True}
    assert client.list_objects_v2(Bucket=name).get("KeyCount") == 0


def _pointing(store: DynamoDBStore, key: str, data: str, owner: str = "o-1") -> None:
    now = time.time()
    assert store.claim(key, owner, now, int((now + 300) * 1000), int(now + 3600)) is None
    assert store.complete(key, owner, codec.Encoded(codec.STORED + codec.JSON, data), int(now + 3600))


def test_purge_refuses_a_pointer_outside_the_layers_prefix_or_malformed(layer_env: Any, table: str,
                                                                       bucket: Any) -> None:
    name, endpoint, client = bucket
    store = _store(table)
    for key in ("other/private.csv", "idempotency-results/orders#victim/o-2"):
        client.put_object(Bucket=name, Key=key, Body=b"x")
    env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name, AWS_ENDPOINT_URL_S3=endpoint)
    sha = "0" * 64
    cases = {
        "orders#a": json.dumps({"bucket": name, "key": "other/private.csv", "size": 1, "sha256": sha}),
        "orders#b": json.dumps({"bucket": name, "key": "idempotency-results/orders#victim/o-2", "size": 1,
                                "sha256": sha}),  # another record's object
        "orders#c": json.dumps({"bucket": "../" + name, "key": "idempotency-results/orders#c/o-1", "size": 1,
                                "sha256": sha}),
        "orders#d": "not a pointer",
        "orders#e": json.dumps({"bucket": name, "key": "idempotency-results/orders#e/o-1", "size": "1",
                                "sha256": sha}),
    }
    for key, data in cases.items():
        _pointing(store, key, data)
        done = run(env, "purge", key, "--yes")
        assert done.returncode == 1 and done.stdout == "", (key, done.stdout)
        line = one_line(done)
        assert "nothing was deleted" in line and store.get(key) is not None, (key, line)
    assert sorted(o["Key"] for o in client.list_objects_v2(Bucket=name)["Contents"]) == sorted(
        ["other/private.csv", "idempotency-results/orders#victim/o-2"])
    forced = run(env, "purge", "orders#a", "--yes", "--force", "--json")  # the record alone, the object left
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["deleted"][0]["object"]["deleted"] is False
    assert store.get("orders#a") is None and client.list_objects_v2(Bucket=name)["KeyCount"] == 2


def test_purge_whose_object_s3_will_not_delete_deletes_the_record_and_says_so(layer_env: Any, table: str,
                                                                             bucket: Any) -> None:
    name, endpoint, client = bucket
    store = _store(table)
    ours = _bucket(name, endpoint)
    env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name, AWS_ENDPOINT_URL_S3=endpoint)
    for key, s3 in (("orders#down", "http://127.0.0.1:9"), ("orders#denied", None)):
        Cycle(store, ttl_seconds=3600, bucket=ours).run(Invocation(60_000), key, lambda: os.urandom(600_000))
        object_key = _object(store, key)
        with Denying() as denying:
            done = run({**env, "AWS_ENDPOINT_URL_S3": s3 or denying.endpoint}, "purge", key, "--yes")
        assert done.returncode == 1 and store.get(key) is None, done.stderr
        assert done.stdout.startswith(f"deleted the record of key {key} (it was completed); its result: NOT "
                                      f"deleted (S3 DELETE s3://{name}/{object_key} "), done.stdout
        line = one_line(done)
        assert f"s3://{name}/{object_key}" in line and ("AccessDenied" in line if s3 is None else True), line
    assert client.list_objects_v2(Bucket=name)["KeyCount"] == 2  # left, and said so


def test_purge_and_show_follow_only_the_layers_own_objects_and_s3_sees_no_request(layer_env: Any, table: str,
                                                                                   bucket: Any) -> None:
    """Review R-M3.3 / T-M3.3: a pointer to another bucket, outside `<prefix><record key>/`, of another owner form,
    with `..` segments or of 5 GiB: purge refuses it ("pointer outside the layer's prefix") and show --result does
    not follow it; requests are counted by a proxy in front of moto's S3: none at all."""
    from tests.support.counting_proxy import CountingProxy

    name, endpoint, client = bucket
    host, port = endpoint.rsplit("//", 1)[1].rsplit(":", 1)
    proxy = CountingProxy(host, int(port))
    store = _store(table)
    owner = "0123456789abcdef" * 2
    sha = "0" * 64
    prefix = "idempotency-results/orders/"
    cases = {
        "orders#b1": {"bucket": "tenant-b-private", "key": f"{prefix}orders#b1/{owner}", "size": 1},
        "orders#b2": {"bucket": name, "key": "payroll/2026-12.json", "size": 1},
        "orders#b3": {"bucket": name, "key": f"{prefix}orders#b3/o-1", "size": 1},
        "orders#b4": {"bucket": name, "key": f"{prefix}orders#b4/../../payroll/{owner}", "size": 1},
        "orders#b5": {"bucket": name, "key": f"{prefix}orders#b5/{owner}", "size": 5 * 1024 ** 3},
    }
    try:
        env = cli_env(layer_env.endpoint, table, IDEMPOTENCY_LARGE_RESULTS_BUCKET=name,
                      AWS_ENDPOINT_URL_S3=proxy.endpoint)
        for key, pointer in cases.items():
            client.put_object(Bucket=name, Key=pointer["key"], Body=b"x")
            _pointing(store, key, json.dumps({**pointer, "sha256": sha}), owner)
            proxy.reset()
            done = run(env, "purge", key, "--yes")
            assert done.returncode == 1 and done.stdout == "" and store.get(key) is not None, (key, done.stdout)
            line = one_line(done)
            assert "pointer outside the layer's prefix" in line and "nothing was deleted" in line, (key, line)
            shown = run(env, "show", key, "--result", "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["records"][0]["result"]["error"] == "Confined", key
            forced = run(env, "purge", key, "--yes", "--force")
            assert forced.returncode == 0 and "left in place (pointer outside the layer's prefix" in forced.stdout
            assert store.get(key) is None and proxy.total() == 0 and proxy.bytes_sent == 0, key
        assert client.list_objects_v2(Bucket=name)["KeyCount"] == 5  # every object left in place
    finally:
        proxy.close()
