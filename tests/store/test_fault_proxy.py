"""The chaos soak's fault proxy, checked with both of the layer's transports against DynamoDB Local: each kind
of fault reaches the client as DynamoDB's (or the network's) would, and lands or not as it should."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from idempotency_layer.stores.dynamodb import DynamoDBError, make_transport
from tests.conftest import TRANSPORTS, build_transport
from tests.support.fault_proxy import (
    DROP_REPLY,
    FORWARDED,
    INTERNAL,
    KINDS,
    LATENCY,
    PROVISIONED,
    RESET,
    THROTTLE,
    FaultProxy,
    even_mix,
)

SPIKE = (0.3, 0.4)


@pytest.fixture
def fault_proxy(dynamodb: object, layer_env: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    upstream = urlparse(dynamodb.endpoint)  # type: ignore[attr-defined]
    with FaultProxy(upstream.hostname or "127.0.0.1", upstream.port or 0, seed=7, spike=SPIKE) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
        yield proxy


def _put(kind: str, table: str, marker: str) -> tuple[dict | DynamoDBError, float]:
    transport = build_transport(kind, connect_timeout=2, read_timeout=5, max_attempts=1)  # no retry: see the fault
    started = time.monotonic()
    try:
        answer: dict | DynamoDBError = transport.call("PutItem", {"TableName": table, "Item": {"id": {"S": marker}}})
    except DynamoDBError as error:
        answer = error
    return answer, time.monotonic() - started


def _landed(ddb_client: object, table: str, marker: str) -> bool:
    item = ddb_client.get_item(TableName=table, Key={"id": {"S": marker}}, ConsistentRead=True)  # type: ignore[attr-defined]
    return "Item" in item


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("fault", "code", "status", "lands"), [
    (THROTTLE, "ThrottlingException", 400, False),
    (PROVISIONED, "ProvisionedThroughputExceededException", 400, False),
    (INTERNAL, "InternalServerError", 500, False),
    (RESET, None, None, False),
    (DROP_REPLY, None, None, True),
    (LATENCY, "", 200, True),
])
def test_each_fault_reaches_the_client_as_dynamodb_or_the_network_would_send_it(
        fault_proxy: FaultProxy, ddb_client: object, table: str, transport: str, fault: str, code: str | None,
        status: int | None, lands: bool) -> None:
    fault_proxy.set_rates({fault: 1.0})
    marker = uuid.uuid4().hex
    answer, took = _put(transport, table, marker)
    if code == "":
        assert answer == {} or "ResponseMetadata" in answer  # a plain success, only late
        assert took >= SPIKE[0]
    elif code is not None:
        assert isinstance(answer, DynamoDBError) and (answer.code, answer.status) == (code, status)
    else:  # no answer at all: the connection was reset, before or after DynamoDB took the write
        assert isinstance(answer, DynamoDBError) and answer.status is None
        assert answer.code in ("ConnectionClosedError", "ReadTimeoutError", "EndpointConnectionError")
    assert _landed(ddb_client, table, marker) is lands
    assert fault_proxy.snapshot()[fault] == 1
    assert fault_proxy.operations() == {"PutItem": {fault: 1}}


def test_kept_alive_connections_carry_many_requests_and_faults_follow_the_seeded_rates(
        fault_proxy: FaultProxy, table: str) -> None:
    transport = make_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=1)
    for i in range(50):
        transport.call("PutItem", {"TableName": table, "Item": {"id": {"S": f"plain-{i}"}, "pad": {"S": "x" * 5000}}})
    assert fault_proxy.snapshot()["connections"] == 1  # one kept-alive connection, 50 whole requests on it
    fault_proxy.set_rates(even_mix(0.6, (THROTTLE, PROVISIONED, INTERNAL)))
    failed = 0
    for i in range(300):
        try:
            transport.call("GetItem", {"TableName": table, "Key": {"id": {"S": f"plain-{i % 50}"}}})
        except DynamoDBError:
            failed += 1
    seen = fault_proxy.snapshot()
    assert seen["requests"] == 350 and seen[FORWARDED] == 350 - failed
    assert sum(seen[kind] for kind in KINDS) == failed == fault_proxy.faults()
    assert 0.45 < failed / 300 < 0.75 and all(seen[kind] > 30 for kind in (THROTTLE, PROVISIONED, INTERNAL))
    assert seen["connections"] == 1 and seen["upstream_error"] == 0  # an error answer keeps the connection


def test_faults_can_be_confined_to_some_operations(dynamodb: object, layer_env: object, table: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = urlparse(dynamodb.endpoint)  # type: ignore[attr-defined]
    with FaultProxy(upstream.hostname or "127.0.0.1", upstream.port or 0, {THROTTLE: 1.0},
                    operations={"UpdateItem"}) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
        transport = make_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=1)
        key = {"id": {"S": f"only-{uuid.uuid4().hex}"}}
        transport.call("PutItem", {"TableName": table, "Item": key})
        with pytest.raises(DynamoDBError) as caught:
            transport.call("UpdateItem", {"TableName": table, "Key": key, "UpdateExpression": "SET v = :v",
                                          "ExpressionAttributeValues": {":v": {"S": "x"}}})
        assert caught.value.code == "ThrottlingException"
        assert transport.call("GetItem", {"TableName": table, "Key": key})["Item"] == key
        assert proxy.operations() == {"PutItem": {FORWARDED: 1}, "UpdateItem": {THROTTLE: 1},
                                      "GetItem": {FORWARDED: 1}}


def test_a_request_split_across_many_writes_is_read_whole(fault_proxy: FaultProxy,
                                                            table: str) -> None:
    body = b'{"TableName":"%s","Key":{"id":{"S":"nothing"}}}' % table.encode()
    head = (b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\n"
            b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", fault_proxy.port), timeout=5) as sock:
        for piece in (head[:10], head[10:], body[:5], body[5:]):
            sock.sendall(piece)
            time.sleep(0.02)
        reply = sock.recv(65536)
    # Unsigned, so DynamoDB Local answers with an error of its own; what matters is one whole exchange.
    assert reply.startswith(b"HTTP/1.1 ")
    assert fault_proxy.snapshot()["requests"] == 1
