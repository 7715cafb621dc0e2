"""The large-results bucket behind an endpoint with a path (issue 42's hostile round): every request goes to the
path boto3 sends to for the same AWS_ENDPOINT_URL_S3 (the endpoint's own path, then the bucket, path style),
signed as botocore's S3SigV4Auth signs that URL; and a 404 is an object that is not there only when S3 says
NoSuchKey (a bucket that is gone, or a path no S3 serves, is a failure, never "deleted")."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

import pytest

from idempotency_layer.stores.s3 import Bucket, Pointer, S3Error

BUCKET = "orders-results"
KEY = "idempotency-results/orders#ep/0123456789abcdef0123456789abcdef"
BODY = b'{"report": "r"}'


class Recorder(ThreadingHTTPServer):
    """A loopback S3 stand-in: records each request (method, path, headers, body) and answers `answer(method)`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.answers: dict[str, tuple[int, bytes]] = {}
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.requests.append((self.command, self.path, dict(self.headers.items()), body))
                status, payload = recorder.answers.get(self.command, (200, BODY if self.command == "GET" else b""))
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        server.thread.join(5)


def _bucket(endpoint: str, name: str = BUCKET) -> Bucket:
    return Bucket(name, "idempotency-results/", region="us-east-1", credentials=("AKIDEXAMPLE", "secret", None),
                  connect_timeout=2, read_timeout=5, endpoint=endpoint)


def _boto3_paths(endpoint: str, recorder: Recorder) -> list[str]:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="AKIDEXAMPLE",
                          aws_secret_access_key="secret", config=Config(retries={"max_attempts": 1}))
    start = len(recorder.requests)
    client.put_object(Bucket=BUCKET, Key=KEY, Body=BODY)
    client.get_object(Bucket=BUCKET, Key=KEY)
    client.delete_object(Bucket=BUCKET, Key=KEY)
    return [path for _, path, _, _ in recorder.requests[start:]]


@pytest.mark.parametrize("path", ["", "/", "/s3gw", "/s3gw/", "/a/b/c/", "/with%20space/", "/a b", "/%7Ex", "/~x",
                                  "/é", "/a+b=c&d", "/!$'()*,", "/a:b@c", "/x/../y/", "//d//", "/./e/."])
def test_every_request_goes_where_boto3_sends_it_and_is_signed_as_botocore_signs_it(recorder: Recorder,
                                                                                     path: str) -> None:
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    endpoint = recorder.endpoint + path
    theirs = _boto3_paths(endpoint, recorder)
    start = len(recorder.requests)
    bucket = _bucket(endpoint)
    pointer = bucket.put("orders#ep", "0123456789abcdef0123456789abcdef", BODY)
    assert bucket.get(pointer) == BODY
    bucket.delete(pointer.object_key)
    ours = recorder.requests[start:]
    assert [p for _, p, _, _ in ours] == theirs  # byte for byte, the endpoint's path included
    for method, sent, headers, body in ours:
        when = datetime.datetime.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
        kept = {k: v for k, v in headers.items() if k.lower() in ("host", "x-amz-content-sha256",
                                                                  "x-amz-server-side-encryption")}
        request = AWSRequest(method=method, url=recorder.endpoint + sent, data=body, headers=kept)
        with mock.patch.object(botocore.auth, "get_current_datetime", lambda when=when: when):
            botocore.auth.S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "s3", "us-east-1").add_auth(request)
        assert headers["Authorization"] == request.headers["Authorization"], (method, sent)


def test_a_client_for_an_older_bucket_keeps_the_endpoints_path(recorder: Recorder) -> None:
    bucket = _bucket(recorder.endpoint + "/s3gw/")
    bucket.named("orders-results-old").delete("k")
    assert recorder.requests[-1][:2] == ("DELETE", "/s3gw/orders-results-old/k")


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9/s3gw?x=1", "http://127.0.0.1:9/#f",
                                      "http://user:SECRET@127.0.0.1:9/", "http://127.0.0.1:9/a;b/"])
def test_an_endpoint_with_a_query_a_fragment_or_a_user_is_refused_naming_the_variable(endpoint: str) -> None:
    with pytest.raises(ValueError, match="AWS_ENDPOINT_URL_S3") as refused:
        _bucket(endpoint)
    assert "SECRET" not in str(refused.value)


NO_SUCH_BUCKET = b"<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>"
NO_SUCH_KEY = b"<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"


@pytest.mark.parametrize("answer", [NO_SUCH_BUCKET, b"", b"<html>not found</html>"])
def test_a_404_that_is_not_s3_saying_no_such_key_is_a_failure(recorder: Recorder, answer: bytes) -> None:
    bucket = _bucket(recorder.endpoint)
    recorder.answers = {"GET": (404, answer), "DELETE": (404, answer)}
    code = "NoSuchBucket" if answer == NO_SUCH_BUCKET else "?"
    with pytest.raises(S3Error, match=f"HTTP 404 {code}") as deleting:
        bucket.delete(KEY)  # never "deleted": S3 answers a DELETE of a missing object 204
    with pytest.raises(S3Error, match=f"HTTP 404 {code}") as reading:
        bucket.get(Pointer(KEY, len(BODY), "0" * 64))
    assert deleting.value.code == reading.value.code == code


def test_a_404_no_such_key_is_a_missing_object(recorder: Recorder) -> None:
    recorder.answers = {"GET": (404, NO_SUCH_KEY)}
    with pytest.raises(S3Error, match="is missing") as missing:
        _bucket(recorder.endpoint).get(Pointer(KEY, len(BODY), "0" * 64))
    assert missing.value.code == "Missing"


def test_the_function_and_the_cli_fail_on_such_an_endpoint_as_on_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotency_layer.errors import IdempotencyConfigurationError
    from idempotency_layer.stores.s3 import from_environment

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9/gw;v=1/")
    with pytest.raises(IdempotencyConfigurationError, match=r"IDEMPOTENCY_LARGE_RESULTS_BUCKET: .*holds ';'"):
        from_environment(BUCKET, "idempotency-results/", connect_timeout=1, read_timeout=1)
