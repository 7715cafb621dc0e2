"""examples/durable_dispatcher: boto3's real Lambda client sends its Invoke requests to a loopback endpoint that
records them (no AWS, no mock of boto3): one asynchronous start per record, named after the order."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.events import json_message, sqs_event

APP = Path(__file__).resolve().parents[2] / "examples" / "durable_dispatcher" / "app.py"


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.seen.append((unquote(self.path), dict(self.headers), body))  # type: ignore[attr-defined]
        failing = b"fail-me" in body
        status = 500 if failing else 202
        answer = b'{"Type":"Service","message":"down"}' if failing else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        if failing:
            self.send_header("X-Amzn-ErrorType", "ServiceException")
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def lambda_endpoint(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name, value in {"AWS_ENDPOINT_URL_LAMBDA": f"http://127.0.0.1:{server.server_address[1]}",
                        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x",
                        "AWS_SECRET_ACCESS_KEY": "x", "AWS_MAX_ATTEMPTS": "1",
                        "WORKFLOW_FUNCTION": "orders-workflow:live"}.items():
        monkeypatch.setenv(name, value)
    yield server
    server.shutdown()
    server.server_close()


def _app():
    spec = importlib.util.spec_from_file_location("durable_dispatcher_app", APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # builds its boto3 client now, with the endpoint above
    return module


def test_one_named_start_per_record(lambda_endpoint):
    messages = [json_message({"orderId": "A-1"}), json_message({"orderId": "B-2"}),
                json_message({"orderId": "C-3", "note": "fail-me"})]
    unnamed = [json_message({"orderId": value}) for value in (None, "", 7, [], {})] + [json_message({"sku": "x"})]
    answer = _app().handler(sqs_event(messages + unnamed), None)
    assert answer == {"batchItemFailures": [{"itemIdentifier": m.message_id} for m in [messages[2], *unnamed]]}
    seen = lambda_endpoint.seen
    assert [path for path, _, _ in seen] == ["/2015-03-31/functions/orders-workflow:live/invocations"] * 3
    names = [headers["X-Amz-Durable-Execution-Name"] for _, headers, _ in seen]
    assert names == [hashlib.sha256(order.encode()).hexdigest() for order in ("A-1", "B-2", "C-3")]
    assert all(headers["X-Amz-Invocation-Type"] == "Event" for _, headers, _ in seen)
    assert [json.loads(body)["orderId"] for _, _, body in seen] == ["A-1", "B-2", "C-3"]
