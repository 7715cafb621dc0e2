"""Results in the large-results bucket as the CLI reads and purges them (issue 42, items 4 and 5), without a
network: the one pointer reader (`s3.Pointer.read`, `s3.pointer`) and the one way back to the result
(`s3.fetch`), which replays and `show --result` share; and `purge`'s choice of what to delete: the object the
pointer names, in the bucket it names, only when it is this record's own object under the layer's prefix."""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.cli import records
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.stores.protocol import COMPLETED, Record
from idempotency_layer.stores.s3 import Bucket, Pointer, S3Error, fetch, pointer, stored

SHA = "ab" * 32
O1, O2 = "0123456789abcdef" * 2, "fedcba9876543210" * 2  # owner tokens, as a claim makes them


class Objects:
    """A stand-in for S3 behind `Bucket._request` (patched on the class, so a client `named` for another bucket
    uses it too): objects by (bucket, key), every request recorded; `denied`: every request answered 403."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.requests: list[tuple[str, str, str]] = []
        self.denied = False
        stand_in = self

        def request(bucket: Bucket, method: str, object_key: str, body: bytes, deadline: Any,
                    *rest: Any, **named: Any) -> tuple[int, bytes]:
            stand_in.requests.append((method, bucket.name, object_key))
            if stand_in.denied:
                raise S3Error(f"S3 {method} s3://{bucket.name}/{object_key} failed: HTTP 403 AccessDenied",
                              code="AccessDenied")
            if method == "DELETE":
                stand_in.objects.pop((bucket.name, object_key), None)
                return 204, b""
            found = stand_in.objects.get((bucket.name, object_key))
            return (404, b"") if found is None else (200, found)

        monkeypatch.setattr(Bucket, "_request", request)

    def put(self, bucket: str, object_key: str, data: bytes) -> Pointer:
        self.objects[(bucket, object_key)] = data
        return Pointer(object_key, len(data), hashlib.sha256(data).hexdigest(), bucket)


def _bucket(name: str, prefix: str = "idempotency-results/", read: tuple[str, ...] = ("results-old",)) -> Bucket:
    """The setting's bucket `name`; `read`: the read allow-list (the bucket the setting moved from)."""
    return Bucket(name, prefix, region="us-east-1", credentials=("a", "b", None), connect_timeout=1,
                  read_timeout=1, endpoint="http://127.0.0.1:1", read_buckets=read)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Objects:
    return Objects(monkeypatch)


# -- the pointer ---------------------------------------------------------------------------------------------

def test_a_pointer_reads_back_what_it_writes_and_nothing_else() -> None:
    written = Pointer(f"idempotency-results/fn#k/{O1}", 12, SHA, "results-1")
    assert Pointer.read(written.text()) == written
    assert Pointer.read(written.text().encode()) == written
    assert pointer(stored(written, codec.JSON + codec.COMPRESSED)) == (written, "json+z")
    assert json.loads(written.text()) == {"bucket": "results-1", "key": f"idempotency-results/fn#k/{O1}", "size": 12,
                                          "sha256": SHA}
    no_bucket = {"key": "k", "size": 1, "sha256": SHA}
    assert Pointer.read(json.dumps(no_bucket)).bucket is None  # the setting's bucket, as replays have read it
    assert Pointer.read(json.dumps({**no_bucket, "bucket": ""})).bucket is None
    malformed = [None, "", "not json", "[]", "1", json.dumps({**no_bucket, "size": "1"}),
                 json.dumps({**no_bucket, "size": True}), json.dumps({**no_bucket, "size": -1}),
                 json.dumps({**no_bucket, "size": 1.0}), json.dumps({**no_bucket, "sha256": "AB" * 32}),
                 json.dumps({**no_bucket, "sha256": "ab"}), json.dumps({**no_bucket, "key": ""}),
                 json.dumps({**no_bucket, "key": 7}), json.dumps({**no_bucket, "key": "k" * 1025}),
                 json.dumps({k: v for k, v in no_bucket.items() if k != "sha256"})]
    for bucket in ("../results", "a/b", "Results", "res.ults", "evil.example.com:443", "x" * 64, "ab", 7, True):
        malformed.append(json.dumps({**no_bucket, "bucket": bucket}))
    for data in malformed:
        with pytest.raises(S3Error) as raised:
            Pointer.read(data)
        assert raised.value.code == "Malformed", data
        assert "SECRET" not in str(raised.value)


def test_a_bucket_owns_only_the_object_it_writes_for_the_record() -> None:
    ours = Bucket("results-1", "idempotency-results/", region="us-east-1", credentials=("a", "b", None),
                  connect_timeout=1, read_timeout=1)
    assert ours.owns(Pointer(f"idempotency-results/fn#k/{O1}", 1, SHA, "results-old"), "fn#k", f"{O1}")
    for key in (f"idempotency-results/fn#other/{O1}", f"idempotency-results/fn#k/{O2}", f"other/fn#k/{O1}",
                f"idempotency-results/fn#k/{O1}/x", f"idempotency-results/../fn#k/{O1}", f"fn#k/{O1}"):
        assert not ours.owns(Pointer(key, 1, SHA, "results-1"), "fn#k", f"{O1}"), key
    assert not ours.owns(Pointer("idempotency-results/fn#k/None", 1, SHA), "fn#k", None)
    bare = Bucket("results-1", "", region="us-east-1", credentials=("a", "b", None), connect_timeout=1,
                  read_timeout=1)  # an empty prefix still limits purge to <key>/<owner>
    assert bare.owns(Pointer(f"fn#k/{O1}", 1, SHA), "fn#k", f"{O1}")
    assert not bare.owns(Pointer(f"secrets/fn#k/{O1}", 1, SHA), "fn#k", f"{O1}")


def test_where_is_the_bucket_the_pointer_names_virtual_hosted_or_path_style() -> None:
    hosted = Bucket("results-new", "p/", region="eu-west-1", credentials=("a", "b", None), connect_timeout=1,
                    read_timeout=1, read_buckets=("results-old",))
    old = hosted.where(Pointer("p/k/o", 1, SHA, "results-old"))
    assert (old.name, old.host, old.base) == ("results-old", "results-old.s3.eu-west-1.amazonaws.com", "")
    assert hosted.where(Pointer("p/k/o", 1, SHA)) is hosted
    local = Bucket("results-new", "p/", region="eu-west-1", credentials=("a", "b", None), connect_timeout=1,
                   read_timeout=1, endpoint="http://127.0.0.1:4566", read_buckets=("results-old",))
    old = local.where(Pointer("p/k/o", 1, SHA, "results-old"))
    assert (old.name, old.host, old.base) == ("results-old", "127.0.0.1:4566", "/results-old")
    for other in (hosted, local):  # a bucket neither the setting's nor on the read allow-list
        with pytest.raises(S3Error, match="neither IDEMPOTENCY_LARGE_RESULTS_BUCKET nor on") as raised:
            other.where(Pointer("p/k/o", 1, SHA, "tenant-b-private"))
        assert raised.value.code == "Confined"
    with pytest.raises(S3Error, match="no S3 bucket this layer can reach"):
        local.named("evil.example.com")


# -- fetch: the one way back from a pointer to the result, for replays and show --result -----------------------

def test_fetch_reads_the_pointers_bucket_and_checks_size_and_digest(s3: Objects) -> None:
    text = json.dumps({"report": "x" * 50_000}).encode()
    kept = s3.put("results-old", f"idempotency-results/fn#k/{O1}", zlib.compress(text))
    result = stored(kept, codec.JSON + codec.COMPRESSED)
    fetched = fetch(_bucket("results-new"), "fn#k", result)  # the setting moved since: the pointer's bucket is read
    assert fetched == codec.Encoded("json+z", zlib.compress(text)) and codec.decode(fetched) == json.loads(text)
    assert s3.requests == [("GET", "results-old", f"idempotency-results/fn#k/{O1}")]
    s3.objects[("results-old", kept.object_key)] = b"SECRET another object"
    with pytest.raises(S3Error, match=f"s3://results-old/idempotency-results/fn#k/{O1} is not the one written") as e:
        fetch(_bucket("results-new"), "fn#k", result)
    assert e.value.code == "Different" and "SECRET" not in str(e.value)
    del s3.objects[("results-old", kept.object_key)]
    with pytest.raises(S3Error, match="is missing") as e:
        fetch(_bucket("results-new"), "fn#k", result)
    assert e.value.code == "Missing"
    with pytest.raises(S3Error, match="IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set here") as e:
        fetch(None, "fn#k", result)
    assert e.value.code == "NoBucket" and len(s3.requests) == 3
    with pytest.raises(S3Error) as e:
        fetch(_bucket("results-new"), "fn#k", codec.Encoded("s3:json", "SECRET"))
    assert e.value.code == "Malformed" and "SECRET" not in str(e.value) and len(s3.requests) == 3


def test_a_replay_reads_through_fetch_and_says_each_failure_as_before(s3: Objects) -> None:
    cycle = Cycle(store=None, ttl_seconds=60, bucket=_bucket("results-new"))
    kept = s3.put("results-old", f"idempotency-results/fn#k/{O1}", b'{"a":1}')
    assert cycle.keeper.decode("fn#k", stored(kept, codec.JSON)) == {"a": 1}
    with pytest.raises(IdempotencyPersistenceLayerError, match="in a form this layer cannot read"):
        cycle.keeper.decode("fn#k", codec.Encoded("s3:json", "not a pointer"))
    with pytest.raises(IdempotencyPersistenceLayerError, match="is not set here") as raised:
        Cycle(store=None, ttl_seconds=60).keeper.decode("fn#k", stored(kept, codec.JSON))
    assert raised.value.permanent
    del s3.objects[("results-old", kept.object_key)]
    with pytest.raises(IdempotencyPersistenceLayerError, match="is missing") as raised:
        cycle.keeper.decode("fn#k", stored(kept, codec.JSON))
    assert raised.value.permanent


def _record(result: codec.Encoded | None, key: str = "fn#k", owner: str = f"{O1}") -> Record:
    return Record(key, COMPLETED, int(time.time()) + 3600, None, owner, result)


def test_show_result_is_the_result_the_pointer_stands_for_compressed_or_not(s3: Objects) -> None:
    value = {"card": "4111", "total": 12}
    plain = s3.put("results-old", f"idempotency-results/fn#k/{O1}", json.dumps(value).encode())
    packed = s3.put("results-old", f"idempotency-results/fn#z/{O1}", zlib.compress(json.dumps(value).encode()))
    raw = s3.put("results-old", f"idempotency-results/fn#b/{O1}", b"\x00\xffraw")
    for key, result in (("fn#k", stored(plain, codec.JSON)), ("fn#z", stored(packed, codec.JSON + codec.COMPRESSED)),
                        ("fn#k", stored(plain, codec.TAGGED))):
        shown = records.facts(_record(result, key), time.time(), True, _bucket("results-new"))
        assert shown["result"] == {"value": value}, result.format
        assert shown["result_object"]["bucket"] == "results-old"
    shown = records.facts(_record(stored(raw, codec.BYTES), "fn#b"), time.time(), True, _bucket("results-new"))
    assert shown["result"] == {"value": b"\x00\xffraw"}
    lines = records.show_text(records.facts(_record(stored(packed, "json+z")), time.time(), False))
    assert f"result object:     s3://results-old/idempotency-results/fn#z/{O1} ({packed.size} bytes, sha256 " \
           f"{packed.sha256})" in lines and not any("4111" in line for line in lines)
    assert s3.requests == [("GET", "results-old", k) for k in (plain.object_key, packed.object_key,
                                                                plain.object_key, raw.object_key)]


def test_show_result_names_what_is_wrong_and_never_the_content(s3: Objects) -> None:
    kept = s3.put("results-old", f"idempotency-results/fn#k/{O1}", b'{"card":"SECRET"}')
    result = stored(kept, codec.JSON)
    s3.objects[("results-old", kept.object_key)] = b'{"card":"SECRET-2"}'
    cases: list[tuple[Any, str, str]] = [(_bucket("results-new"), "Different", "is not the one written")]
    cases.append((None, "NoBucket", "IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set here"))
    for bucket, code, said in cases:
        shown = records.facts(_record(result), time.time(), True, bucket)
        assert shown["result"]["error"] == code and said in shown["result"]["none"]
        assert not any("SECRET" in line for line in records.show_text(shown))
    s3.denied = True
    shown = records.facts(_record(result), time.time(), True, _bucket("results-new"))
    assert shown["result"]["error"] == "AccessDenied" and "HTTP 403 AccessDenied" in shown["result"]["none"]
    shown = records.facts(_record(codec.Encoded("s3:json+z", "SECRET")), time.time(), True, _bucket("r-1"))
    assert shown["result"]["error"] == "Malformed" and shown["result_object"] is None
    assert not any("SECRET" in line for line in records.show_text(shown))


# -- purge: the object the pointer names, within the layer's prefix, or nothing ---------------------------------

class Store:
    """A store of one record, as the CLI's purge uses it."""

    def __init__(self, record: Record) -> None:
        self.record: Record | None = record
        self.where = "table 't'"

    def get(self, key: str) -> Record | None:
        return self.record

    def purge(self, key: str, status: str, owner: str | None) -> bool:
        self.record = None
        return True


def test_purge_deletes_the_object_where_the_pointer_points(s3: Objects) -> None:
    kept = s3.put("results-old", f"idempotency-results/fn#k/{O1}", b"data")
    store = Store(_record(stored(kept, codec.JSON)))
    done = records.purge(store, "fn#k", yes=True, force=False, bucket=_bucket("results-new"))
    assert done["object"] == {"bucket": "results-old", "key": kept.object_key, "deleted": True}
    assert s3.requests == [("DELETE", "results-old", kept.object_key)] and store.record is None
    assert records.object_said(done["object"]) == f"deleted s3://results-old/{kept.object_key}"


@pytest.mark.parametrize("data", [
    Pointer("other/private.csv", 1, SHA, "results-1").text(),
    Pointer(f"idempotency-results/fn#victim/{O1}", 1, SHA, "results-1").text(),  # another record's object
    Pointer(f"idempotency-results/fn#k/{O2}", 1, SHA, "results-1").text(),  # another run's
    Pointer(f"idempotency-results/fn#k/{O1}", 1, SHA, "results-1").text().replace("results-1", "../etc"),
    "not a pointer",
])
def test_purge_refuses_a_pointer_to_anything_but_its_own_object(s3: Objects, data: str) -> None:
    store = Store(_record(codec.Encoded("s3:json", data)))
    with pytest.raises(records.Refused, match="nothing was deleted") as raised:
        records.purge(store, "fn#k", yes=True, force=False, bucket=_bucket("results-1"))
    assert store.record is not None and s3.requests == []
    assert "\n" not in str(raised.value)
    done = records.purge(store, "fn#k", yes=True, force=True, bucket=_bucket("results-1"))
    assert store.record is None and s3.requests == []  # the record alone
    assert done["object"]["deleted"] is False and done["object"]["forced"] is True
    assert records.object_said(done["object"]).startswith("left in place (")


def test_purge_without_the_bucket_setting_refuses_and_says_where_the_object_is(s3: Objects) -> None:
    store = Store(_record(stored(Pointer(f"idempotency-results/fn#k/{O1}", 1, SHA, "results-1"), codec.JSON)))
    with pytest.raises(records.Refused, match=rf"s3://results-1/idempotency-results/fn#k/{O1}, and "
                                              "IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set here"):
        records.purge(store, "fn#k", yes=True, force=False, bucket=None)
    assert store.record is not None and s3.requests == []


def test_purge_whose_object_s3_refuses_deletes_the_record_and_says_which_object_stays(s3: Objects) -> None:
    kept = s3.put("results-old", f"idempotency-results/fn#k/{O1}", b"data")
    store = Store(_record(stored(kept, codec.JSON)))
    s3.denied = True
    done = records.purge(store, "fn#k", yes=True, force=False, bucket=_bucket("results-new"))
    assert store.record is None and done["object"]["deleted"] is False and "forced" not in done["object"]
    assert records.object_said(done["object"]) == ("NOT deleted (S3 DELETE "
                                                   f"s3://results-old/{kept.object_key} failed: HTTP 403 AccessDenied)")


def test_purge_asks_about_the_object_too(s3: Objects) -> None:
    kept = s3.put("results-old", f"idempotency-results/fn#k/{O1}", b"data")
    store = Store(_record(stored(kept, codec.JSON)))
    asked: list[str] = []
    with pytest.raises(records.Refused, match="not deleted"):
        records.purge(store, "fn#k", yes=False, force=False, ask=lambda q: asked.append(q) or "n",
                      bucket=_bucket("results-new"))
    assert asked == [f"delete the record of key 'fn#k' (completed) and its result s3://results-old/{kept.object_key}"
                     "? [y/N] "] and store.record is not None and s3.requests == []
