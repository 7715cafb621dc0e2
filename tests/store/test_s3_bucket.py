"""The large-results bucket (layer/idempotency_layer/stores/s3.py) on moto's S3 server: objects written with server-side
encryption and read back checked, a missing or changed object refused, deletes, the deadline, an S3 that is down."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from idempotency_layer.deadline import Deadline
from idempotency_layer.stores.s3 import Bucket, S3Error

CREDENTIALS = ("AKIDEXAMPLE", "secret", None)


@pytest.fixture
def bucket(s3_bucket: Any, moto: Any) -> Any:
    name, client = s3_bucket
    ours = Bucket(name, "idempotency-results/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=2,
                  read_timeout=5, endpoint=moto.endpoint)
    return ours, client


@pytest.mark.parametrize("size", [512 * 1024, 1024 * 1024, 5 * 1024 * 1024, int(5.9 * 1024 * 1024)])
def test_a_result_is_written_encrypted_and_read_back_byte_identical(bucket: Any, size: int) -> None:
    ours, client = bucket
    data = os.urandom(size)  # incompressible
    pointer = ours.put("orders#0123abc", "owner-1", data, Deadline.after(30))
    assert pointer.object_key == "idempotency-results/orders#0123abc/owner-1" and pointer.size == size
    head = client.head_object(Bucket=ours.name, Key=pointer.object_key)
    assert head["ServerSideEncryption"] == "AES256" and head["ContentLength"] == size
    assert ours.get(pointer, Deadline.after(30)) == data


def test_a_missing_or_changed_object_is_refused(bucket: Any) -> None:
    ours, client = bucket
    pointer = ours.put("orders#k", "o-1", b"x" * 1000)
    client.put_object(Bucket=ours.name, Key=pointer.object_key, Body=b"y" * 1000)  # same size, other bytes
    with pytest.raises(S3Error, match="is not the one written") as raised:
        ours.get(pointer)
    assert raised.value.code == "Different"
    client.put_object(Bucket=ours.name, Key=pointer.object_key, Body=b"x" * 999)
    with pytest.raises(S3Error, match="is not the one written"):
        ours.get(pointer)
    ours.delete(pointer.object_key)
    with pytest.raises(S3Error, match="is missing") as raised:
        ours.get(pointer)
    assert raised.value.code == "Missing"
    ours.delete(pointer.object_key)  # gone already: fine


def test_a_missing_bucket_and_an_s3_that_is_down(bucket: Any) -> None:
    ours, _ = bucket
    other = Bucket("no-such-bucket", "p/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=2,
                   read_timeout=5, endpoint=ours.scheme + "://" + ours.host)
    with pytest.raises(S3Error, match="NoSuchBucket") as raised:
        other.put("orders#k", "o", b"data")
    assert raised.value.code == "NoSuchBucket" and not raised.value.uncertain
    down = Bucket("b", "p/", region="us-east-1", credentials=CREDENTIALS, connect_timeout=0.2, read_timeout=0.2,
                  endpoint="http://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(S3Error, match="ConnectionRefusedError"):
        down.put("orders#k", "o", b"data", Deadline.after(1))
    assert time.monotonic() - started < 1.5
    with pytest.raises(S3Error, match="the deadline passed"):
        down.put("orders#k", "o", b"data", Deadline(time.monotonic() - 1))
