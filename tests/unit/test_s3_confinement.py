"""`s3.confinement`, the pure rule a pointer to a stored result must meet before it is followed (review R2.2): the
setting's bucket or one on the read allow-list, the object `<prefix><record key>/<32 lowercase hex>` (or the same
under the legacy prefix, when the bucket has one), a size of at most MAX_OBJECT_BYTES. And the bucket's own
checks before a request: `get` over the cap, `where` for an unlisted bucket, `named` for a bad name, `write` of
too much. A stand-in for `_request` records every request: none is made."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.stores.s3 import MAX_OBJECT_BYTES, Bucket, Pointer, S3Error, confinement

SHA = "ab" * 32
PREFIX = "idempotency-results/fn/"
LEGACY = "idempotency-results/"
HEX = "0123456789abcdef"

keys = st.text(string.ascii_letters + string.digits + "#-_./", min_size=1, max_size=80)
owners = st.text(HEX, min_size=32, max_size=32)
sizes = st.integers(0, MAX_OBJECT_BYTES)


def _confined(pointer: Pointer, key: str, legacy: str | None = LEGACY) -> str | None:
    return confinement(pointer, key, bucket="results-1", prefix=PREFIX, legacy_prefix=legacy,
                       read_buckets=("results-old",))


@settings(max_examples=50, deadline=None)
@given(key=keys, owner=owners, size=sizes, bucket=st.sampled_from([None, "results-1", "results-old"]),
       base=st.sampled_from([PREFIX, LEGACY]))
def test_the_layers_own_object_is_followed(key: str, owner: str, size: int, bucket: str | None, base: str) -> None:
    assert _confined(Pointer(f"{base}{key}/{owner}", size, SHA, bucket), key) is None


@settings(max_examples=50, deadline=None)
@given(key=keys, owner=owners, other=keys, tail=st.text(string.printable, min_size=1, max_size=8))
def test_any_other_object_is_not(key: str, owner: str, other: str, tail: str) -> None:
    forms = [f"{PREFIX}{key}/{owner}{tail}", f"{PREFIX}{key}/{owner.upper()}x", f"{PREFIX}{key}/{owner[:-1]}",
             f"{PREFIX}../{key}/{owner}", f"other/{key}/{owner}", f"{key}/{owner}"]
    if other != key:
        forms.append(f"{PREFIX}{other}/{owner}")  # another record's object
    for object_key in forms:
        if object_key in (f"{PREFIX}{key}/{owner}", f"{LEGACY}{key}/{owner}"):
            continue  # (a key that makes the form the layer's own after all)
        problem = _confined(Pointer(object_key, 1, SHA), key)
        assert problem is not None and "object key is not" in problem, object_key
        assert object_key not in problem  # the pointer's content is not repeated


@settings(max_examples=50, deadline=None)
@given(key=keys, owner=owners, size=st.integers(MAX_OBJECT_BYTES + 1, 2 ** 62))
def test_a_size_over_the_cap_is_not(key: str, owner: str, size: int) -> None:
    problem = _confined(Pointer(f"{PREFIX}{key}/{owner}", size, SHA), key)
    assert problem is not None and f"its size ({size} bytes) is over" in problem


def test_the_bucket_must_be_the_settings_or_listed_and_the_legacy_form_needs_the_default_prefix() -> None:
    owner = HEX * 2
    problem = _confined(Pointer(f"{PREFIX}fn#k/{owner}", 1, SHA, "tenant-b-private"), "fn#k")
    assert problem is not None and "names the bucket 'tenant-b-private'" in problem
    assert "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS" in problem
    assert _confined(Pointer(f"{LEGACY}fn#k/{owner}", 1, SHA), "fn#k", legacy=None) is not None
    assert _confined(Pointer(f"{PREFIX}fn#k/{owner}", MAX_OBJECT_BYTES, SHA), "fn#k") is None


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    made: list[Any] = []
    monkeypatch.setattr(Bucket, "_request", lambda *args, **named: made.append(args) or (200, b""))
    return made


def test_the_bucket_refuses_before_any_request(requests: list[Any]) -> None:
    ours = Bucket("results-1", PREFIX, region="us-east-1", credentials=("a", "b", None), connect_timeout=1,
                  read_timeout=1, read_buckets=("results-old",))
    owner = HEX * 2
    for pointer, said in ((Pointer(f"{PREFIX}k/{owner}", 5 * 1024 ** 3, SHA), "is over the"),
                          (Pointer(f"{PREFIX}k/{owner}", 1, SHA, "tenant-b-private"), "neither")):
        with pytest.raises(S3Error, match=said) as raised:
            ours.get(pointer)
        assert raised.value.code == "Confined"
    with pytest.raises(IdempotencyPersistenceLayerError, match="neither"):  # purge's delete, in the layer's words
        ours.discard(Pointer(f"{PREFIX}k/{owner}", 1, SHA, "tenant-b-private"))
    with pytest.raises(S3Error, match="no S3 bucket this layer can reach"):
        ours.named("Results.Example")
    with pytest.raises(S3Error, match="not written"):
        ours.put("k", owner, b"x" * (MAX_OBJECT_BYTES + 1))
    assert requests == []
    ours.get(Pointer(f"{PREFIX}k/{owner}", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                     "results-old"))  # the listed bucket: read
    assert len(requests) == 1
