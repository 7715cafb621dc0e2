"""The record protocol against DynamoDB Local, over both transports."""

import time

import pytest

from idempotency_layer import codec
from idempotency_layer.config import Attributes
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED, INPROGRESS

KEY = "fn#abc"


def claim(store, owner="me", now=None, until_ms=None, expires_at=None):
    now = time.time() if now is None else now
    until_ms = int(now * 1000) + 60_000 if until_ms is None else until_ms
    expires_at = int(now) + 3600 if expires_at is None else expires_at
    return store.claim(KEY, owner, now, until_ms, expires_at)


def raw(ddb_client, table, key=KEY):
    return ddb_client.get_item(TableName=table, Key={"id": {"S": key}}, ConsistentRead=True).get("Item")


def test_claim_writes_an_in_progress_record(store, ddb_client, table_name):
    now = time.time()
    assert claim(store, now=now, until_ms=int(now * 1000) + 5000) is None
    item = raw(ddb_client, table_name)
    assert item["status"] == {"S": INPROGRESS}
    assert item["owner"] == {"S": "me"}
    assert int(item["in_progress_until"]["N"]) == int(now * 1000) + 5000
    assert int(item["expires_at"]["N"]) == int(now) + 3600


def test_second_claim_gets_the_live_record(store):
    assert claim(store, owner="first") is None
    record = claim(store, owner="second")
    assert record is not None
    assert record.status == INPROGRESS and record.owner == "first" and record.key == KEY


def test_claim_by_the_same_owner_returns_our_own_record(store):
    # What the cycle sees when the transport retried its own successful write.
    assert claim(store, owner="me") is None
    assert claim(store, owner="me").owner == "me"


def test_expired_in_progress_claim_can_be_taken(store, ddb_client, table_name):
    now = time.time()
    assert claim(store, owner="dead", now=now, until_ms=int(now * 1000) - 1) is None
    assert claim(store, owner="next") is None
    assert raw(ddb_client, table_name)["owner"] == {"S": "next"}


def test_expired_completed_record_can_be_claimed_although_ttl_has_not_deleted_it(transport, ddb_client, table_name):
    # The expiry in an attribute DynamoDB Local's TTL sweep does not watch: the record is surely still there.
    store = DynamoDBStore(transport, table_name, Attributes(expires_at="kept_until"), key_prefix="fn")
    now = time.time()
    assert claim(store, owner="old", now=now) is None
    assert store.complete(KEY, "old", codec.encode({"v": 1}), expires_at=int(now) - 10)
    assert raw(ddb_client, table_name)["status"] == {"S": COMPLETED}
    assert claim(store, owner="new", now=now) is None
    assert raw(ddb_client, table_name)["status"] == {"S": INPROGRESS}


def test_live_completed_record_is_returned_with_its_result(store):
    assert claim(store) is None
    assert store.complete(KEY, "me", codec.encode({"v": [1, None]}), int(time.time()) + 60)
    record = claim(store, owner="other")
    assert record.status == COMPLETED
    assert codec.decode(record.result) == {"v": [1, None]}


def test_complete_stores_text_for_json_and_binary_for_compressed(store, ddb_client, table_name):
    assert claim(store) is None
    small = codec.encode({"v": 1})
    assert store.complete(KEY, "me", small, int(time.time()) + 60)
    item = raw(ddb_client, table_name)
    assert item["result"] == {"S": '{"v":1}'} and item["result_format"] == {"S": "json"}

    big_value = {"rows": [{"n": i} for i in range(5000)]}
    big = codec.encode(big_value)
    assert big.format == "json+z"
    store.release(KEY, "me")
    assert claim(store) is None
    assert store.complete(KEY, "me", big, int(time.time()) + 60)
    item = raw(ddb_client, table_name)
    assert "B" in item["result"]
    assert codec.decode(store.get(KEY).result) == big_value


def test_too_large_completes_without_a_result(store, ddb_client, table_name):
    assert claim(store) is None
    assert store.complete(KEY, "me", codec.Encoded(codec.TOO_LARGE, None), int(time.time()) + 60)
    item = raw(ddb_client, table_name)
    assert item["status"] == {"S": COMPLETED}
    assert "result" not in item and item["result_format"] == {"S": "too_large"}


def test_complete_and_release_need_the_owner(store, ddb_client, table_name):
    assert claim(store, owner="holder") is None
    assert store.complete(KEY, "stranger", codec.encode(1), int(time.time()) + 60) is False
    assert store.release(KEY, "stranger") is False
    item = raw(ddb_client, table_name)
    assert item["status"] == {"S": INPROGRESS} and item["owner"] == {"S": "holder"}
    assert store.release(KEY, "holder") is True
    assert raw(ddb_client, table_name) is None


def test_get(store):
    assert store.get(KEY) is None
    assert claim(store) is None
    assert store.get(KEY).owner == "me"


def test_missing_table_names_operation_table_and_code(transport):
    store = DynamoDBStore(transport, "no-such-table", Attributes(), key_prefix="fn")
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        claim(store)
    message = str(caught.value)
    assert "PutItem" in message and "'no-such-table'" in message and "ResourceNotFoundException" in message


def test_sort_key_layout(transport, sort_key_table, ddb_client):
    attributes = Attributes(key="pk", sort_key="sk")
    store = DynamoDBStore(transport, sort_key_table, attributes, partition_value="idempotency#fn", key_prefix="fn")
    assert claim(store, owner="a") is None
    assert claim(store, owner="b").owner == "a"
    item = ddb_client.get_item(
        TableName=sort_key_table, Key={"pk": {"S": "idempotency#fn"}, "sk": {"S": KEY}}, ConsistentRead=True
    )["Item"]
    assert item["owner"] == {"S": "a"}
    assert store.complete(KEY, "a", codec.encode(0), int(time.time()) + 60)
    assert codec.decode(store.get(KEY).result) == 0


def test_custom_attribute_names(transport, ddb_client, request):
    from tests.support.dynamodb_local import create_table

    name = create_table(ddb_client, f"attrs-{abs(hash(request.node.nodeid))}", key_attr="pk", ttl_attr="ttl")
    attributes = Attributes(key="pk", status="st", expires_at="ttl", in_progress_until="until", owner="who",
                            result="res", result_format="fmt")
    store = DynamoDBStore(transport, name, attributes, key_prefix="fn")
    assert store.claim(KEY, "me", time.time(), int(time.time() * 1000) + 5000, int(time.time()) + 60) is None
    assert store.complete(KEY, "me", codec.encode({"v": 1}), int(time.time()) + 60)
    item = ddb_client.get_item(TableName=name, Key={"pk": {"S": KEY}}, ConsistentRead=True)["Item"]
    assert set(item) == {"pk", "st", "ttl", "until", "who", "res", "fmt"}
    assert codec.decode(store.get(KEY).result) == {"v": 1}
    ddb_client.delete_table(TableName=name)


def test_a_release_whose_first_copy_landed_is_not_logged_as_a_take_over(store, transport, table_name, caplog,
                                                                        ddb_client):
    # A DeleteItem that landed but whose answer was lost (a dropped connection) is sent again: the record is
    # gone, not taken over. Only another owner's record is a take-over.
    from idempotency_layer.cycle import Cycle

    cycle = Cycle(store, ttl_seconds=3600)
    assert claim(store, owner="me") is None
    transport.call("DeleteItem", {"TableName": table_name, "Key": {"id": {"S": KEY}},
                                  "ConditionExpression": "#o = :me", "ExpressionAttributeNames": {"#o": "owner"},
                                  "ExpressionAttributeValues": {":me": {"S": "me"}}})  # the first copy
    with caplog.at_level("INFO", logger="idempotency_layer"):
        cycle.release(Invocation(60_000), KEY, "me")
    assert store.release(KEY, "me") is True
    assert "taken over" not in caplog.text and "already gone" in caplog.text
    caplog.clear()
    assert claim(store, owner="other") is None
    with caplog.at_level("INFO", logger="idempotency_layer"):
        cycle.release(Invocation(60_000), KEY, "me")
    assert "taken over before release" in caplog.text
    assert raw(ddb_client, table_name)["owner"] == {"S": "other"}  # left alone
