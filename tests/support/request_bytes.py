"""The exact bytes the layer's DynamoDB client writes for a fixed set of requests at a fixed instant, as JSON.

    python -m tests.support.request_bytes      (the layer importable as idempotency_layer)

tests/unit/test_request_bytes.py compares them with tests/data/request_bytes.json, written by the code before
the client's CPU savings of issue 34: a saving must not change one byte of any request. Each request is answered
`{}` with its CRC32 by a loopback server of this module's own that keeps what it read, unparsed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import zlib

FIXED = 1_767_225_600.25  # 2026-01-01T00:00:00.25Z: every X-Amz-Date, and so every signature, is this instant's
REQUESTS = (
    ("GetItem", {"TableName": "orders", "Key": {"id": {"S": "k#1"}}, "ConsistentRead": True}),
    ("PutItem", {"TableName": "orders", "Item": {"id": {"S": "k#2"}, "status": {"S": "INPROGRESS"},
                                                 "expires_at": {"N": "1767229200"}},
                 "ConditionExpression": "attribute_not_exists(#id) OR #e < :now",
                 "ExpressionAttributeNames": {"#id": "id", "#e": "expires_at"},
                 "ExpressionAttributeValues": {":now": {"N": "1767225600"}},
                 "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}),
    ("UpdateItem", {"TableName": "orders", "Key": {"id": {"S": "k#2"}}, "UpdateExpression": "SET #r = :r",
                    "ExpressionAttributeNames": {"#r": "result"},
                    "ExpressionAttributeValues": {":r": {"B": b"\x00\x01 result \xff"}}}),
    ("DeleteItem", {"TableName": "orders", "Key": {"id": {"S": "k#2"}}}),
    ("BatchGetItem", {"RequestItems": {"orders": {"Keys": [{"id": {"S": "k#1"}}, {"id": {"S": "k#2"}}]}}}),
    ("GetItem", {"TableName": "orders", "Key": {"id": {"S": "k#1"}}}),  # again: what a signer kept is reused
)


def _serve(listener: socket.socket, seen: list[bytes]) -> None:
    connection, _ = listener.accept()
    with connection:
        buffered = b""
        while True:
            while b"\r\n\r\n" not in buffered:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                buffered += chunk
            head, _, rest = buffered.partition(b"\r\n\r\n")
            length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(rest) < length:
                rest += connection.recv(65536)
            seen.append(head + b"\r\n\r\n" + rest[:length])
            buffered = rest[length:]
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-amz-crc32: %d\r\n\r\n{}"
                               % zlib.crc32(b"{}"))


def capture(token: str | None) -> list[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    thread = threading.Thread(target=_serve, args=(listener, seen), daemon=True)
    thread.start()
    environ = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
               "AWS_REGION": "eu-west-1", "AWS_LAMBDA_FUNCTION_NAME": "f",
               "AWS_ENDPOINT_URL_DYNAMODB": "http://dynamodb.test:8000"}
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(environ)
    if token is not None:
        os.environ["AWS_SESSION_TOKEN"] = token
    from idempotency_layer.stores.dynamodb import make_transport

    client = make_transport("lean", connect_timeout=2, read_timeout=2, max_attempts=1, source="environment")
    # Host (and so every signature) names the endpoint; the connections go to this module's server, on a free port.
    client.pool._address = listener.getsockname()
    for operation, params in REQUESTS:
        client.call(operation, params)
    client.pool.close()
    thread.join(5)
    listener.close()
    return [data.decode("latin-1") for data in seen]


def main() -> int:
    time.time = lambda: FIXED  # the signer's one clock
    print(json.dumps({"no token": capture(None), "session token": capture("IQoJb3JpZ2luX2VjE" + "t0k3n" * 40)},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
