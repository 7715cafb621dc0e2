"""Both transports against DynamoDB Local: the four operations, the errors the store relies on, the endpoint.

What differs between them, by contract (docs/design.md, "Transport contract"):

* `B` (and `BS`) values: boto3 decodes them to `bytes`; lean returns the wire's base64 `str`. The store's
  normalization (`store._blob`) turns both into the same bytes, so `normalized()` below must agree.
* boto3 adds `ResponseMetadata` to every response; lean returns only what DynamoDB sent.
* `N` values are strings in both, as DynamoDB normalizes them (`"12.50"` comes back `"12.5"`).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import urllib3.util.connection

from idempotency_layer.stores.dynamodb import DynamoDBError, make_transport
from idempotency_layer.stores.dynamodb.store import _blob
from tests.conftest import TRANSPORTS, build_transport

BLOB = b"\x00\x01\xfe\xffbinary"


@pytest.fixture(params=TRANSPORTS)
def kind(request):
    return request.param


@pytest.fixture
def ddb(kind, layer_env):
    """A transport of each kind, built the way the interceptor builds it, straight at DynamoDB Local."""
    return build_transport(kind, connect_timeout=2, read_timeout=5, max_attempts=2)


def normalized(item: dict | None) -> dict | None:
    """An item with `B` values as bytes, whichever transport read it, and no `ResponseMetadata`."""
    if item is None:
        return None
    out = {}
    for name, value in item.items():
        if "B" in value:
            value = {"B": _blob(value["B"])}
        elif "BS" in value:
            value = {"BS": sorted(_blob(v) for v in value["BS"])}
        out[name] = value
    return out


def put(ddb, table_name, key="k", **extra):
    item = {"id": {"S": key}, "n": {"N": "12.50"}, "b": {"B": BLOB}, "s": {"S": "é😀"}, **extra}
    assert ddb.call("PutItem", {"TableName": table_name, "Item": item}) is not None
    return item


def get(ddb, table_name, key="k"):
    response = ddb.call("GetItem", {"TableName": table_name, "Key": {"id": {"S": key}}, "ConsistentRead": True})
    return response.get("Item")


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the four operations -------------------------------------------------------------------------------------


def test_put_and_get_round_trip_with_binary_and_number(ddb, kind, table_name):
    put(ddb, table_name, bs={"BS": [b"\x01", b"\x02"]})
    item = get(ddb, table_name)
    assert normalized(item) == {
        "id": {"S": "k"},
        "n": {"N": "12.5"},
        "b": {"B": BLOB},
        "s": {"S": "é😀"},
        "bs": {"BS": [b"\x01", b"\x02"]},
    }
    assert isinstance(item["b"]["B"], bytes if kind == "boto3" else str)


def test_get_of_a_missing_item_has_no_item(ddb, table_name):
    assert get(ddb, table_name, "absent") is None


def test_update_returns_new_attributes(ddb, table_name):
    put(ddb, table_name)
    response = ddb.call(
        "UpdateItem",
        {
            "TableName": table_name,
            "Key": {"id": {"S": "k"}},
            "UpdateExpression": "SET #b = :b ADD #n :one",
            "ExpressionAttributeNames": {"#b": "b", "#n": "n"},
            "ExpressionAttributeValues": {":b": {"B": b"new\x00"}, ":one": {"N": "1"}},
            "ReturnValues": "ALL_NEW",
        },
    )
    attributes = normalized(response["Attributes"])
    assert attributes["b"] == {"B": b"new\x00"} and attributes["n"] == {"N": "13.5"}
    assert normalized(get(ddb, table_name)) == attributes


def test_delete_returns_old_attributes_and_removes_the_item(ddb, table_name):
    item = put(ddb, table_name)
    response = ddb.call("DeleteItem", {"TableName": table_name, "Key": {"id": {"S": "k"}}, "ReturnValues": "ALL_OLD"})
    assert normalized(response["Attributes"]) == normalized({**item, "n": {"N": "12.5"}})
    assert get(ddb, table_name) is None


# -- errors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "params"),
    [
        ("PutItem", {"Item": {"id": {"S": "k"}}, "ConditionExpression": "attribute_not_exists(id)"}),
        (
            "UpdateItem",
            {"Key": {"id": {"S": "k"}}, "UpdateExpression": "SET x = :x", "ConditionExpression": "n = :x"},
        ),
        ("DeleteItem", {"Key": {"id": {"S": "k"}}, "ConditionExpression": "attribute_not_exists(id)"}),
    ],
)
def test_failed_condition_carries_the_old_item(ddb, table_name, operation, params):
    item = put(ddb, table_name)
    params = {"TableName": table_name, "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **params}
    if operation == "UpdateItem":
        params["ExpressionAttributeValues"] = {":x": {"N": "0"}}
    with pytest.raises(DynamoDBError) as caught:
        ddb.call(operation, params)
    error = caught.value
    assert (error.operation, error.code, error.status) == (operation, "ConditionalCheckFailedException", 400)
    assert error.message == "The conditional request failed"
    assert normalized(error.item) == normalized({**item, "n": {"N": "12.5"}})


def test_failed_condition_without_all_old_has_no_item(ddb, table_name):
    put(ddb, table_name)
    with pytest.raises(DynamoDBError) as caught:
        ddb.call(
            "PutItem",
            {"TableName": table_name, "Item": {"id": {"S": "k"}}, "ConditionExpression": "attribute_not_exists(id)"},
        )
    assert caught.value.code == "ConditionalCheckFailedException" and caught.value.item is None


def test_both_transports_see_the_same_old_item(layer_env, table_name):
    lean = make_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2)
    boto = make_transport("boto3", connect_timeout=2, read_timeout=5, max_attempts=2)
    put(lean, table_name)
    items = []
    for ddb in (lean, boto):
        with pytest.raises(DynamoDBError) as caught:
            ddb.call(
                "PutItem",
                {
                    "TableName": table_name,
                    "Item": {"id": {"S": "k"}},
                    "ConditionExpression": "attribute_not_exists(id)",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                },
            )
        items.append(caught.value.item)
    # The documented difference: base64 text from lean, bytes from boto3; the same after normalization.
    assert isinstance(items[0]["b"]["B"], str) and isinstance(items[1]["b"]["B"], bytes)
    assert normalized(items[0]) == normalized(items[1])


def test_missing_table(layer_env):
    errors = []
    for kind in TRANSPORTS:
        ddb = build_transport(kind, connect_timeout=2, read_timeout=5, max_attempts=2)
        with pytest.raises(DynamoDBError) as caught:
            ddb.call("GetItem", {"TableName": "no-such-table", "Key": {"id": {"S": "k"}}})
        errors.append(caught.value)
    for error in errors:
        assert (error.operation, error.code, error.status) == ("GetItem", "ResourceNotFoundException", 400)
        assert error.message and error.item is None
    assert errors[0].message == errors[1].message


def test_validation_error_is_reported_not_retried(ddb, table_name):
    with pytest.raises(DynamoDBError) as caught:
        ddb.call("PutItem", {"TableName": table_name, "Item": {"id": {"N": "1"}}})  # the key is S
    assert caught.value.code == "ValidationException" and caught.value.message


def test_connection_refused_after_the_configured_attempts(kind, layer_env, monkeypatch):
    port = dead_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{port}")
    # Count connection attempts where both transports open their sockets: urllib3. Only this thread's: the call
    # runs in it, and another test's server thread left in this worker may connect somewhere meanwhile.
    attempts = []
    real = urllib3.util.connection.create_connection
    me = threading.get_ident()

    def counting(address, *args, **kwargs):
        if threading.get_ident() == me:
            attempts.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(urllib3.util.connection, "create_connection", counting)
    monkeypatch.setattr(socket, "create_connection", counting)  # http.client's, for the lean client
    ddb = build_transport(kind, connect_timeout=1, read_timeout=1, max_attempts=3)
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        ddb.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "k"}}})
    assert caught.value.code == "EndpointConnectionError"
    assert f"http://127.0.0.1:{port}" in caught.value.message and caught.value.status is None
    assert [a[1] for a in attempts] == [port] * 3
    assert time.monotonic() - started < 5  # backoff from 25 ms, not seconds


# -- endpoint ------------------------------------------------------------------------------------------------


def test_both_honour_aws_endpoint_url_dynamodb(kind, layer_env, table_name, proxy, monkeypatch):
    # The service-specific variable wins over the global one, which points nowhere.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead_port()}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    proxy.reset()
    ddb = build_transport(kind, connect_timeout=2, read_timeout=5, max_attempts=1)
    put(ddb, table_name)
    assert normalized(get(ddb, table_name))["b"] == {"B": BLOB}
    assert proxy.requests["PutItem"] == 1 and proxy.requests["GetItem"] == 1
