"""The transports without DynamoDB: body encoding, error parsing, CRC32, retry decisions, region and endpoint
resolution, and the lean transport's retries against a scripted local HTTP server that counts what it saw."""

from __future__ import annotations

import base64
import datetime
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import zlib

import boto3
import orjson
import pytest
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import EndpointConnectionError, NoRegionError, ReadTimeoutError
from botocore.loaders import create_loader
from botocore.retries import standard
from botocore.session import Session

from idempotency_layer import botocore_transport, transport
from idempotency_layer.botocore_transport import Boto3Transport, LeanTransport, parse_error
from idempotency_layer.transport import (
    DEADLINE,
    LAST_CHANCE_S,
    DynamoDBError,
    condition_item,
    crc32_ok,
    encode_body,
    make_transport,
)

PREFIX = "com.amazonaws.dynamodb.v20120810#"


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """A clean AWS environment: test credentials and region, no config files, no metadata service."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower() in ("http_proxy", "https_proxy", "no_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # boto3's default session keeps the credentials and config it first found.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    return monkeypatch


# -- request body --------------------------------------------------------------------------------------------


def test_body_is_the_request_shape_with_binary_in_base64():
    params = {
        "TableName": "t",
        "Item": {
            "id": {"S": "k"},
            "n": {"N": "12.50"},
            "b": {"B": b"\x00\xff zip"},
            "ba": {"B": bytearray(b"\x01")},
            "mv": {"B": memoryview(b"\x02")},
            "bs": {"BS": {b"\x03"}},
            "ss": {"SS": frozenset({"x"})},
        },
    }
    body = orjson.loads(encode_body(params))
    item = body["Item"]
    assert item["id"] == {"S": "k"} and item["n"] == {"N": "12.50"}
    assert base64.b64decode(item["b"]["B"]) == b"\x00\xff zip"
    assert item["ba"] == {"B": "AQ=="} and item["mv"] == {"B": "Ag=="}
    assert item["bs"] == {"BS": ["Aw=="]} and item["ss"] == {"SS": ["x"]}
    # Nothing copied into or changed in the caller's params.
    assert params["Item"]["b"]["B"] == b"\x00\xff zip"


def test_body_refuses_what_dynamodb_cannot_take():
    with pytest.raises(TypeError, match="complex"):
        encode_body({"Item": {"x": {"N": 1j}}})


# -- responses -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        (
            400,
            {"__type": PREFIX + "ResourceNotFoundException", "message": "no table"},
            "ResourceNotFoundException",
            "no table",
        ),
        (400, {"__type": PREFIX + "ValidationException", "Message": "bad"}, "ValidationException", "bad"),
        (400, {"__type": "ThrottlingException"}, "ThrottlingException", ""),
        (500, {"__type": PREFIX + "InternalServerError", "message": "oops"}, "InternalServerError", "oops"),
    ],
)
def test_error_code_and_message_from_the_json_body(status, body, code, message):
    error = parse_error(status, {}, orjson.dumps(body))["Error"]
    assert (error["Code"], error["Message"]) == (code, message)


@pytest.mark.parametrize(("status", "body"), [(503, b"<html><body>Service Unavailable</body></html>"), (502, b"")])
def test_an_html_or_empty_5xx_gets_the_status_as_code(status, body):
    error = parse_error(status, {}, body)["Error"]
    assert error["Code"] == str(status)
    assert error["Message"] in ("Service Unavailable", "Bad Gateway")


def test_a_4xx_that_is_not_json_keeps_its_text():
    error = parse_error(403, {}, b"Forbidden by proxy")["Error"]
    assert (error["Code"], error["Message"]) == ("403", "Forbidden by proxy")


def test_condition_item_only_from_a_failed_condition():
    old = {"id": {"S": "k"}, "b": {"B": "AAE="}}
    body = orjson.dumps({"__type": PREFIX + "ConditionalCheckFailedException", "message": "m", "Item": old})
    assert condition_item("ConditionalCheckFailedException", body) == old
    assert condition_item("ConditionalCheckFailedException", b'{"__type": "x"}') is None
    assert condition_item("ValidationException", body) is None
    assert condition_item("ConditionalCheckFailedException", b"not json") is None


def test_crc32():
    body = b'{"Item": {}}'
    assert crc32_ok({}, body)
    assert crc32_ok({"x-amz-crc32": str(zlib.crc32(body))}, body)
    assert not crc32_ok({"x-amz-crc32": str(zlib.crc32(body) ^ 1)}, body)
    assert not crc32_ok({"x-amz-crc32": "garbage"}, body)


# -- retry decisions -----------------------------------------------------------------------------------------


class Answer:
    """Just what botocore's retry checkers read from a response."""

    def __init__(self, status, body=b"{}", headers=None):
        self.status_code = status
        self.content = body
        self.headers = headers or {}


def decide(status=None, code=None, exc=None, attempt=1, max_attempts=3, operation="PutItem", headers=None, body=b"{}"):
    policy = botocore_transport._RetryPolicy(max_attempts, random=lambda: 1.0)  # no jitter: the top of the range
    response = None if status is None else Answer(status, body, headers)
    parsed = None if code is None else {"Error": {"Code": code, "Message": ""}}
    context = policy.context(
        operation, attempt, {}, http_response=response, parsed_response=parsed, caught_exception=exc
    )
    return policy.delay(context)


@pytest.mark.parametrize(
    "code",
    ["ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded", "Throttling"],
)
def test_throttles_retry_from_a_one_second_base(code):
    assert decide(400, code, attempt=1) == 1.0
    assert decide(400, code, attempt=2) == 2.0


@pytest.mark.parametrize(("status", "code"), [(500, "InternalServerError"), (503, "503"), (502, "502"), (504, "504")])
def test_server_errors_retry_from_dynamodbs_25ms_base(status, code):
    assert decide(status, code, attempt=1) == pytest.approx(0.025)
    assert decide(status, code, attempt=3, max_attempts=4) == pytest.approx(0.1)


def test_backoff_is_capped_at_20_seconds():
    assert decide(400, "ThrottlingException", attempt=9, max_attempts=10) == 20


def test_retry_after_header_raises_the_delay():
    assert decide(500, "InternalServerError", headers={"x-amz-retry-after": "1500"}) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="http://x", error="refused"),
        ReadTimeoutError(endpoint_url="http://x", error="slow"),
    ],
)
def test_connection_errors_retry(exc):
    assert decide(exc=exc) == pytest.approx(0.025)


@pytest.mark.parametrize(
    "code",
    ["ConditionalCheckFailedException", "ValidationException", "ResourceNotFoundException", "AccessDeniedException"],
)
def test_client_errors_do_not_retry(code):
    assert decide(400, code) is None


def test_a_modeled_retryable_error_retries_on_writes():
    assert decide(400, "ReplicatedWriteConflictException", operation="UpdateItem") == pytest.approx(0.025)


def test_429_retries_as_a_throttle_unless_its_code_is_modeled():
    assert decide(429, "SomethingNew") == 1.0
    assert decide(429, "ResourceNotFoundException") is None


def test_crc32_mismatch_retries():
    body = b"{}"
    assert decide(200, headers={"x-amz-crc32": str(zlib.crc32(body) ^ 1)}, body=body) == pytest.approx(0.025)
    assert decide(200, headers={"x-amz-crc32": str(zlib.crc32(body))}, body=body) is None


def test_max_attempts_counts_the_first_attempt():
    assert decide(500, "InternalServerError", attempt=2, max_attempts=3) is not None
    assert decide(500, "InternalServerError", attempt=3, max_attempts=3) is None
    assert decide(500, "InternalServerError", attempt=1, max_attempts=1) is None


def test_the_retry_quota_stops_retries_after_sustained_failure():
    policy = botocore_transport._RetryPolicy(10, random=lambda: 0.0)
    granted = 0
    for _ in range(100):
        context = policy.context(
            "GetItem", 1, {}, http_response=Answer(500), parsed_response={"Error": {"Code": "InternalServerError"}}
        )
        granted += policy.delay(context) is not None
    assert granted == 500 // 14  # botocore's quota: 500 tokens, 14 a transient retry


def test_the_error_model_matches_botocores_dynamodb_model():
    # The lean transport carries the few facts of the service model that the retry checkers read.
    model = create_loader().load_service_model("dynamodb", "service-2")

    def facts(name, metadata):
        return name, orjson.dumps([metadata.get("retryable"), metadata.get("error", {}).get("code")])

    for name, ours in botocore_transport._OPERATIONS.items():
        theirs = {facts(e["shape"], model["shapes"][e["shape"]]) for e in model["operations"][name].get("errors", [])}
        assert {facts(s.name, s.metadata) for s in ours.error_shapes} == theirs, name


def test_our_stub_feeds_botocores_checkers():
    # The special DynamoDB checksum checker reaches through operation_model.service_model.service_name.
    context = standard.RetryContext(
        attempt_number=1, operation_model=botocore_transport._OPERATIONS["GetItem"], http_response=Answer(200)
    )
    assert standard.StandardRetryConditions(max_attempts=3).is_retryable(context) is False


# -- region and endpoint -------------------------------------------------------------------------------------


def lean(**kwargs):
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 1, **kwargs}
    return LeanTransport(**options)


def bounded(path: str, **options):
    """A lean transport on one of its two paths: `lean` (botocore's urllib3 pool) or `fast` (botocore-free)."""
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 1, **options}
    sleep = options.pop("sleep", None)
    t = make_transport("lean", fast=path == "fast", **options)
    if sleep is not None:
        if path == "fast":
            t._sleep = sleep
        else:
            t.retry._sleep = sleep
    return t


LEAN_PATHS = ["lean", "fast"]


class Sent(Exception):
    pass


def boto3_url(t: Boto3Transport) -> str:
    """Where the boto3 client really sends a request (its endpoint rules run per request)."""

    def stop(request, **kwargs):
        raise Sent(request.url)

    t.client.meta.events.register("before-send", stop)
    with pytest.raises(Sent) as sent:
        t.client.get_item(TableName="t", Key={"id": {"S": "k"}})
    return sent.value.args[0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "https://dynamodb.eu-west-1.amazonaws.com"),
        ({"AWS_DEFAULT_REGION": "cn-north-1"}, "https://dynamodb.cn-north-1.amazonaws.com.cn"),
        ({"AWS_DEFAULT_REGION": "us-gov-west-1"}, "https://dynamodb.us-gov-west-1.amazonaws.com"),
        ({"AWS_USE_FIPS_ENDPOINT": "true"}, "https://dynamodb-fips.eu-west-1.amazonaws.com"),
        ({"AWS_USE_DUALSTACK_ENDPOINT": "true"}, "https://dynamodb.eu-west-1.api.aws"),
        ({"AWS_ACCOUNT_ID": "123456789012"}, "https://123456789012.ddb.eu-west-1.amazonaws.com"),
        (
            {"AWS_ACCOUNT_ID": "123456789012", "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled"},
            "https://dynamodb.eu-west-1.amazonaws.com",
        ),
        # The template declares it empty so `sam local --env-vars` can set it: empty means unset, for both.
        ({"AWS_ENDPOINT_URL_DYNAMODB": ""}, "https://dynamodb.eu-west-1.amazonaws.com"),
        ({"AWS_ENDPOINT_URL_DYNAMODB": "", "AWS_ENDPOINT_URL": "http://global:1"}, "http://global:1"),
        ({"AWS_ENDPOINT_URL": "http://global:1"}, "http://global:1"),
        ({"AWS_ENDPOINT_URL": "http://global:1", "AWS_ENDPOINT_URL_DYNAMODB": "http://ddb:2"}, "http://ddb:2"),
        (
            {"AWS_ENDPOINT_URL_DYNAMODB": "http://ddb:2", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
            "https://dynamodb.eu-west-1.amazonaws.com",
        ),
    ],
)
def test_endpoint_is_the_one_boto3_would_use(aws_env, env, expected):
    for name, value in env.items():
        aws_env.setenv(name, value)
    assert lean().endpoint == expected
    url = boto3_url(Boto3Transport(connect_timeout=1, read_timeout=1, max_attempts=1))
    assert url.rstrip("/") == expected


def test_endpoint_from_the_config_files_services_section(aws_env, tmp_path):
    (tmp_path / "config").write_text(
        "[default]\nservices = local\n\n[services local]\ndynamodb =\n  endpoint_url = http://from-config:9\n"
    )
    assert lean().endpoint == "http://from-config:9"
    assert boto3_url(Boto3Transport(connect_timeout=1, read_timeout=1, max_attempts=1)) == "http://from-config:9/"
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://env:1")
    assert lean().endpoint == "http://env:1"


def test_region_from_aws_region_when_botocore_finds_none(aws_env):
    # Lambda sets AWS_REGION; botocore reads only AWS_DEFAULT_REGION and the config file.
    aws_env.delenv("AWS_DEFAULT_REGION")
    aws_env.setenv("AWS_REGION", "ap-south-1")
    assert lean().region == "ap-south-1"
    assert Boto3Transport(connect_timeout=1, read_timeout=1, max_attempts=1).client.meta.region_name == "ap-south-1"


def test_no_region_fails_at_build_for_both(aws_env):
    aws_env.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(NoRegionError):
        make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1)
    with pytest.raises(NoRegionError):
        make_transport("boto3", connect_timeout=1, read_timeout=1, max_attempts=1)


def test_make_transport_checks_its_arguments(aws_env):
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("http2", connect_timeout=1, read_timeout=1, max_attempts=1)
    with pytest.raises(ValueError, match="max_attempts"):
        make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=0)
    built = make_transport("lean", fast=False, connect_timeout=1, read_timeout=1, max_attempts=1)
    assert isinstance(built, LeanTransport)


def test_boto3_counts_the_first_attempt_too(aws_env):
    t = make_transport("boto3", connect_timeout=1, read_timeout=1, max_attempts=4)
    assert t.client.meta.config.retries == {"total_max_attempts": 4, "mode": "standard"}


def test_an_endpoint_behind_a_proxy_goes_through_botocores_http_session(aws_env):
    aws_env.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert isinstance(lean()._http, botocore_transport._SessionHTTP)
    aws_env.setenv("NO_PROXY", ".amazonaws.com")
    assert isinstance(lean()._http, botocore_transport._PoolHTTP)


# -- against a scripted local server -------------------------------------------------------------------------


def answer(status=200, body=None, crc=True, delay=0.0, headers=None):
    data = orjson.dumps({} if body is None else body)
    head = {"Content-Type": "application/x-amz-json-1.0", **(headers or {})}
    if crc is True:
        head["x-amz-crc32"] = str(zlib.crc32(data))
    elif crc is not None:
        head["x-amz-crc32"] = str(crc)
    return status, head, data, delay


def throttle():
    return answer(400, {"__type": PREFIX + "ThrottlingException", "message": "Rate exceeded"})


def server_error():
    return answer(500, {"__type": PREFIX + "InternalServerError", "message": "Internal server error"})


class ScriptedDynamoDB:
    """Plays a list of answers, one a request, the last one for good; records requests and connections."""

    def __init__(self, script, tls=None):
        self.script = list(script)
        self.requests: list[tuple[dict, bytes]] = []
        self.paths: list[str] = []
        self.peers: set = set()
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive
            timeout = 5  # a stuck client cannot hold a server thread

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer._lock:
                    outer.paths.append(self.path)
                    outer.requests.append((dict(self.headers.items()), body))
                    outer.peers.add(self.client_address)
                    index = min(len(outer.requests), len(outer.script)) - 1
                    status, head, data, delay = outer.script[index]
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for name, value in head.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (read timeout)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        scheme = "http"
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.endpoint = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


def serving(aws_env, make):
    """A fixture's body: `start(...)` makes a server with `make(...)` and points the endpoint at it; every server
    started is closed after the test."""
    servers = []

    def start(*args, **kwargs):
        server = make(*args, **kwargs)
        servers.append(server)
        aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def scripted(aws_env):
    yield from serving(aws_env, lambda *script, tls=None: ScriptedDynamoDB(script, tls))


class Sleeps(list):
    def __call__(self, seconds):
        self.append(seconds)


def test_the_wire_request(scripted):
    server = scripted(answer(body={"Item": {"b": {"B": "AAE="}}}))
    t = lean()
    params = {"TableName": "t", "Key": {"id": {"S": "k"}}, "ConsistentRead": True}
    assert t.call("GetItem", params) == {"Item": {"b": {"B": "AAE="}}}
    headers, body = server.requests[0]
    headers = {k.lower(): v for k, v in headers.items()}
    assert headers["x-amz-target"] == "DynamoDB_20120810.GetItem"
    assert headers["content-type"] == "application/x-amz-json-1.0"
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "/eu-west-1/dynamodb/aws4_request" in headers["authorization"]
    assert "x-amz-target" in headers["authorization"]  # signed
    assert orjson.loads(body) == params


def test_throttled_twice_then_success(scripted):
    server = scripted(throttle(), throttle(), answer())
    sleeps = Sleeps()
    assert lean(max_attempts=3, sleep=sleeps).call("PutItem", {"TableName": "t", "Item": {}}) == {}
    assert server.count == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 1 and 0 <= sleeps[1] <= 2


def test_throttled_until_attempts_run_out(scripted):
    server = scripted(throttle())
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        lean(max_attempts=3, sleep=sleeps).call("PutItem", {"TableName": "t", "Item": {}})
    assert server.count == 3 and len(sleeps) == 2
    error = caught.value
    assert (error.operation, error.code, error.message, error.status) == (
        "PutItem",
        "ThrottlingException",
        "Rate exceeded",
        400,
    )


def test_server_errors_retry_then_succeed(scripted):
    server = scripted(server_error(), answer(body={"Attributes": {"n": {"N": "2"}}}))
    result = lean(max_attempts=2, sleep=Sleeps()).call("UpdateItem", {"TableName": "t", "Key": {}})
    assert result == {"Attributes": {"n": {"N": "2"}}} and server.count == 2


def test_a_failed_condition_is_not_retried_and_carries_the_old_item(scripted):
    old = {"id": {"S": "k"}, "status": {"S": "COMPLETED"}}
    server = scripted(
        answer(
            400,
            {
                "__type": PREFIX + "ConditionalCheckFailedException",
                "message": "The conditional request failed",
                "Item": old,
            },
        )
    )
    with pytest.raises(DynamoDBError) as caught:
        lean(max_attempts=3, sleep=Sleeps()).call("PutItem", {"TableName": "t", "Item": {}})
    assert server.count == 1
    assert caught.value.code == "ConditionalCheckFailedException" and caught.value.item == old


def test_a_damaged_body_is_retried(scripted):
    server = scripted(answer(body={"Item": {"v": {"S": "x"}}}, crc=12345), answer(body={"Item": {"v": {"S": "x"}}}))
    assert lean(max_attempts=2, sleep=Sleeps()).call("GetItem", {})["Item"] == {"v": {"S": "x"}}
    assert server.count == 2


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_a_body_damaged_every_time_is_a_checksum_error(scripted, path):
    server = scripted(answer(crc=12345))
    with pytest.raises(DynamoDBError) as caught:
        bounded(path, max_attempts=2, sleep=Sleeps()).call("GetItem", {})
    assert server.count == 2 and caught.value.code == "ChecksumError"


def test_a_response_without_crc_is_accepted(scripted):
    scripted(answer(body={"Item": {}}, crc=None))
    assert lean().call("GetItem", {}) == {"Item": {}}


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_read_timeout_is_retried_then_reported(scripted, path):
    server = scripted(answer(delay=0.6))
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        bounded(path, read_timeout=0.2, max_attempts=2, sleep=sleeps).call("GetItem", {})
    assert server.count == 2 and len(sleeps) == 1
    assert caught.value.code == "ReadTimeoutError" and caught.value.status is None


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_connection_refused(aws_env, path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{port}")
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        bounded(path, max_attempts=3, sleep=sleeps).call("GetItem", {})
    assert caught.value.code == "EndpointConnectionError"
    assert f"127.0.0.1:{port}" in caught.value.message
    assert len(sleeps) == 2  # three attempts


def test_connections_are_kept_alive(scripted):
    server = scripted(answer())
    t = lean()
    for _ in range(5):
        t.call("GetItem", {})
    assert server.count == 5 and len(server.peers) == 1


def test_credentials_are_frozen_per_request_so_refreshes_take_effect(scripted):
    server = scripted(answer())
    issued: list[str] = []

    def refresh():
        issued.append(f"AKIDREFRESHED{len(issued)}")
        # Inside botocore's mandatory refresh window, so every request asks for fresh credentials.
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)
        return {"access_key": issued[-1], "secret_key": "s", "token": "tok", "expiry_time": expiry.isoformat()}

    t = LeanTransport(connect_timeout=1, read_timeout=1, max_attempts=1, session=Session())
    t._credentials = RefreshableCredentials.create_from_metadata(refresh(), refresh, "test")
    t.call("GetItem", {})
    t.call("GetItem", {})
    sent = [{k.lower(): v for k, v in h.items()} for h, _ in server.requests]
    used = [h["authorization"].split("Credential=")[1].split("/")[0] for h in sent]
    assert used[0] != used[1] and set(used) <= set(issued)
    assert sent[1]["x-amz-security-token"] == "tok"


def test_no_credentials_is_a_dynamodb_error(aws_env):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:9")
    with pytest.raises(DynamoDBError) as caught:
        lean(max_attempts=3, sleep=Sleeps()).call("GetItem", {})
    assert caught.value.code == "NoCredentialsError"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1, and a server TLS context holding it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=test"
    subprocess.run(
        [*command.split(), "-keyout", key, "-out", cert, "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return cert, context


@pytest.mark.parametrize("kind", ["lean", "boto3"])
def test_https_verifies_against_the_configured_ca_bundle(aws_env, scripted, certificate, kind):
    cert, context = certificate
    server = scripted(answer(body={"Item": {}}), tls=context)
    assert server.endpoint.startswith("https://")
    aws_env.setenv("AWS_CA_BUNDLE", str(cert))
    t = make_transport(kind, connect_timeout=1, read_timeout=2, max_attempts=1)
    assert t.call("GetItem", {"TableName": "tbl", "Key": {"id": {"S": "k"}}})["Item"] == {}
    assert server.count == 1


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_https_refuses_an_unknown_certificate(scripted, certificate, path):
    server = scripted(answer(), tls=certificate[1])
    with pytest.raises(DynamoDBError) as caught:
        bounded(path).call("GetItem", {})
    assert caught.value.code == "SSLError" and "CERTIFICATE_VERIFY_FAILED" in caught.value.message
    assert server.count == 0


def test_through_a_proxy(scripted, aws_env):
    # The scripted server plays the HTTP proxy: it gets the absolute URL, and the Host of the real endpoint.
    proxy = scripted(answer(body={"Item": {}}))
    aws_env.setenv("HTTP_PROXY", proxy.endpoint)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://dynamodb.invalid:8000")
    assert lean().call("GetItem", {}) == {"Item": {}}
    assert proxy.paths == ["http://dynamodb.invalid:8000/"]
    headers = {k.lower(): v for k, v in proxy.requests[0][0].items()}
    assert headers["host"] == "dynamodb.invalid:8000" and "host" in headers["authorization"]


def test_boto3_transport_retries_against_the_same_server(scripted):
    # Its retries are boto3's own; the server's count shows max_attempts counting the first attempt.
    server = scripted(server_error(), server_error(), answer(body={"Item": {"id": {"S": "k"}}}))
    t = make_transport("boto3", connect_timeout=1, read_timeout=2, max_attempts=3)
    assert t.call("GetItem", {"TableName": "tbl", "Key": {"id": {"S": "k"}}})["Item"] == {"id": {"S": "k"}}
    assert server.count == 3


def test_boto3_transport_gives_up_after_max_attempts(scripted):
    server = scripted(server_error())
    t = make_transport("boto3", connect_timeout=1, read_timeout=2, max_attempts=2)
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", {"TableName": "tbl", "Key": {"id": {"S": "k"}}})
    assert server.count == 2
    assert (caught.value.code, caught.value.status) == ("InternalServerError", 500)


def test_lean_signature_is_botocores_own(monkeypatch):
    # The lean path sets Host itself and hashes the body bytes directly; the signature must not change.
    from botocore import auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    fixed = datetime.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.setattr(auth, "get_current_datetime", lambda: fixed)
    credentials = Credentials("AKID", "SECRET", "TOKEN")
    body = b'{"TableName":"t","Key":{"id":{"S":"k"}}}'
    url = "https://dynamodb.eu-west-1.amazonaws.com/"
    base = {"X-Amz-Target": "DynamoDB_20120810.GetItem", "Content-Type": "application/x-amz-json-1.0"}

    ours = AWSRequest(method="POST", url=url, data=body, headers={**base, "Host": "dynamodb.eu-west-1.amazonaws.com"})
    botocore_transport._SigV4Auth(credentials, "dynamodb", "eu-west-1").add_auth(ours)
    reference = AWSRequest(method="POST", url=url, data=body, headers=dict(base))
    auth.SigV4Auth(credentials, "dynamodb", "eu-west-1").add_auth(reference)
    assert ours.headers["Authorization"] == reference.headers["Authorization"]
    assert ours.headers["X-Amz-Date"] == reference.headers["X-Amz-Date"] == "20260102T030405Z"


# -- a deadline cuts a call short ----------------------------------------------------------------------------
# Each test's server answers well within the client's own timeouts, so only the deadline can stop the call.


def soon(seconds: float = 0.3) -> float:
    return time.monotonic() + seconds


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_a_deadline_cuts_the_read_timeout_of_the_lean_pool(scripted, path):
    server = scripted(answer(body={"Item": {}}, delay=1.5))
    t = bounded(path, read_timeout=5, max_attempts=3, sleep=Sleeps())
    with pytest.raises(DynamoDBError) as caught:
        t.call("UpdateItem", {"TableName": "t"}, soon())
    assert caught.value.code == "ReadTimeoutError"
    assert server.count == 1  # no retry once the deadline passed
    assert t.call("GetItem", {}) == {"Item": {}}  # without one, the same server is waited for


@pytest.mark.parametrize("kind", ["lean", "fast", "boto3"])
def test_a_deadline_just_passed_still_gets_one_short_attempt(scripted, kind):
    # A completion that usually takes milliseconds is worth trying; one that is slow is not waited for.
    def build():
        options = {"connect_timeout": 1, "read_timeout": 5, "max_attempts": 3}
        return make_transport(kind, **options) if kind == "boto3" else bounded(kind, **options)

    quick = scripted(answer(body={"Item": {}}))
    t = build()
    params = {"TableName": "t", "Key": {"id": {"S": "k"}}}
    assert t.call("GetItem", params)["Item"] == {}  # warm: a client's first call does work of its own
    assert t.call("GetItem", params, time.monotonic() - 0.01)["Item"] == {} and quick.count == 2
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", params, time.monotonic() - LAST_CHANCE_S)  # its last chance is over: nothing is sent
    assert caught.value.code == DEADLINE and not caught.value.uncertain and quick.count == 2
    slow = scripted(answer(body={"Item": {}}, delay=1.5))
    t = build()
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", params, started - 0.01)
    assert caught.value.code == ("ReadTimeoutError" if kind != "boto3" else DEADLINE) and slow.count == 1
    assert caught.value.uncertain  # sent, and no answer came
    assert time.monotonic() - started < LAST_CHANCE_S + 0.5  # the attempt ended by deadline + LAST_CHANCE_S


def test_the_time_an_attempt_gets_shrinks_smoothly_to_nothing():
    now = time.monotonic()
    given = [transport._time_left(now + left) for left in (1.0, 0.3, 0.05, 0.0, -0.05, -0.09, -0.11)]
    expected = [1.0, 0.3, LAST_CHANCE_S, LAST_CHANCE_S, 0.05, 0.01, None]
    assert given[-1] is None
    assert all(abs(g - e) < 0.005 for g, e in zip(given[:-1], expected[:-1], strict=True)), given


_FAILURES = [
    ("throttled", (throttle(),), False),  # refused: not applied
    ("refused", (answer(400, {"__type": PREFIX + "ValidationException", "message": "bad"}),), False),
    ("5xx", (server_error(),), True),  # a 5xx says nothing of whether it was applied
    ("5xx-then-throttled", (server_error(), throttle()), True),  # an earlier attempt of the call may have been
    ("damaged", (answer(crc=1),), True),  # a damaged answer (boto3 hands it back as an answer: not here)
]


@pytest.mark.parametrize(
    ("kind", "script", "uncertain"),
    [
        pytest.param(kind, script, uncertain, id=f"{name}-{kind}")
        for kind in ("lean", "fast", "boto3")
        for name, script, uncertain in _FAILURES
        if not (kind == "boto3" and name == "damaged")
    ],
)
def test_a_failure_says_whether_the_request_may_have_been_applied(scripted, kind, script, uncertain):
    scripted(*script)
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": len(script)}
    t = make_transport(kind, **options) if kind == "boto3" else bounded(kind, sleep=Sleeps(), **options)
    with pytest.raises(DynamoDBError) as caught:
        t.call("PutItem", {"TableName": "t", "Item": {"id": {"S": "k"}}})
    assert caught.value.uncertain is uncertain, caught.value


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_an_answer_that_cannot_be_read_may_have_been_applied(scripted, path):
    data = b"not json"
    scripted((200, {"Content-Type": "application/x-amz-json-1.0", "x-amz-crc32": str(zlib.crc32(data))}, data, 0.0))
    with pytest.raises(DynamoDBError) as caught:
        bounded(path).call("PutItem", {})
    assert caught.value.code == "ResponseParserError" and caught.value.uncertain


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_no_answer_at_all_may_have_been_applied_and_no_connection_was_not(scripted, aws_env, path):
    scripted(answer(delay=1.5))
    with pytest.raises(DynamoDBError) as caught:
        bounded(path, read_timeout=0.2).call("PutItem", {})
    assert caught.value.code == "ReadTimeoutError" and caught.value.uncertain
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{port}")  # nothing listens there
    with pytest.raises(DynamoDBError) as caught:
        bounded(path, max_attempts=2, sleep=Sleeps()).call("PutItem", {})
    assert caught.value.code == "EndpointConnectionError" and not caught.value.uncertain


@pytest.mark.parametrize("kind", ["lean-proxy", "boto3", "lean", "fast"])
def test_a_call_that_fits_before_its_deadline_needs_no_thread(scripted, aws_env, monkeypatch, kind):
    server = scripted(answer(body={"Item": {}}))
    if kind == "lean-proxy":
        aws_env.setenv("HTTP_PROXY", server.endpoint)
        aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://dynamodb.invalid:8000")
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 3}
    if kind in LEAN_PATHS:
        t = bounded(kind, **options)
    else:
        t = make_transport("lean" if kind == "lean-proxy" else "boto3", **options)
    monkeypatch.setattr(botocore_transport, "_within", lambda *a: pytest.fail("waited on a thread"))
    worst = transport.worst_case_s(1, 1, 3)
    assert worst == 3 * 2 + (1 + 5) + (2 + 5) + 1  # backoff caps, each with a retry-after's 5 s, and a second
    params = {"TableName": "t", "Key": {"id": {"S": "k"}}}
    assert t.call("GetItem", params, time.monotonic() + worst + 1)["Item"] == {}
    if kind in LEAN_PATHS:  # their own timeouts are cut to the deadline: never a thread
        assert t.call("GetItem", params, time.monotonic() + worst - 1)["Item"] == {}
    else:
        with pytest.raises(pytest.fail.Exception):
            t.call("GetItem", params, time.monotonic() + worst - 1)


def test_no_backoff_runs_past_the_deadline(scripted, monkeypatch):
    server = scripted(throttle())
    sleeps = Sleeps()
    t = lean(max_attempts=5, sleep=sleeps)
    decide = t.retry.delay  # botocore's decision, with the backoff it might draw when throttled
    monkeypatch.setattr(t.retry, "delay", lambda context: None if decide(context) is None else 2.0)
    with pytest.raises(DynamoDBError) as caught:
        t.call("UpdateItem", {}, soon(1.0))
    assert caught.value.code == "ThrottlingException" and server.count == 1 and sleeps == []
    with pytest.raises(DynamoDBError):
        t.call("UpdateItem", {})  # without a deadline the same backoff is waited out
    assert sleeps == [2.0] * 4 and server.count == 6


def test_no_backoff_runs_past_the_deadline_on_the_fast_path(scripted, monkeypatch):
    server = scripted(throttle())
    sleeps = Sleeps()
    t = bounded("fast", max_attempts=5, sleep=sleeps)
    decide = t.retry.delay  # the standard mode's decision, with the backoff it might draw when throttled
    monkeypatch.setattr(t.retry, "delay", lambda *a, **k: None if decide(*a, **k) is None else (2.0, 5))
    with pytest.raises(DynamoDBError) as caught:
        t.call("UpdateItem", {}, soon(1.0))
    assert caught.value.code == "ThrottlingException" and server.count == 1 and sleeps == []
    with pytest.raises(DynamoDBError):
        t.call("UpdateItem", {})  # without a deadline the same backoff is waited out
    assert sleeps == [2.0] * 4 and server.count == 6


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_a_deadline_cuts_the_connect_timeout(aws_env, path):
    # A listener whose accept queue is full: the kernel drops further SYNs, so a connect waits for its timeout.
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
            fillers.append(filler)
        aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{listener.getsockname()[1]}")
        t = bounded(path, connect_timeout=30, read_timeout=30, max_attempts=3, sleep=Sleeps())
        started = time.monotonic()
        with pytest.raises(DynamoDBError) as caught:
            t.call("UpdateItem", {}, soon(0.3))
        assert caught.value.code == "ConnectTimeoutError"
        assert time.monotonic() - started < 15  # far below the 30 s the client was configured with
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_a_deadline_bounds_a_call_through_a_proxy(scripted, aws_env):
    # botocore's HTTP session keeps its own timeouts: the call is waited for until the deadline.
    proxy = scripted(answer(body={"Item": {}}, delay=1.5))
    aws_env.setenv("HTTP_PROXY", proxy.endpoint)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://dynamodb.invalid:8000")
    t = lean(read_timeout=5)
    with pytest.raises(DynamoDBError) as caught:
        t.call("UpdateItem", {}, soon())
    assert caught.value.code == DEADLINE and "left" in caught.value.message
    assert t.call("GetItem", {}) == {"Item": {}}


@pytest.mark.parametrize("failing", [False, True], ids=["answer", "error"])
def test_a_deadline_bounds_the_boto3_transport(scripted, failing):
    server = scripted(server_error() if failing else answer(body={"Item": {}}, delay=1.5))
    t = make_transport("boto3", connect_timeout=1, read_timeout=5, max_attempts=1)
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "k"}}}, soon(0.3 if not failing else 5.0))
    # A call that ends in time hands back its own answer or error; one that does not, the deadline's.
    assert caught.value.code == ("InternalServerError" if failing else DEADLINE) and server.count == 1
    if not failing:
        assert t.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "k"}}})["Item"] == {}  # waited for


@pytest.mark.parametrize("header", ["0xcbf43926", "", "1, 1", "abc"])
@pytest.mark.parametrize("path", LEAN_PATHS)
def test_a_crc32_header_that_is_no_integer_is_a_mismatch_and_retried(scripted, path, header):
    # botocore's own retry check would raise ValueError on it; it is a damaged answer like any other.
    server = scripted(answer(crc=None, headers={"x-amz-crc32": header}), answer(body={"Item": {}}))
    assert bounded(path, max_attempts=2, sleep=Sleeps()).call("GetItem", {}) == {"Item": {}} and server.count == 2
    scripted(answer(crc=None, headers={"x-amz-crc32": header}))
    with pytest.raises(DynamoDBError) as caught:
        bounded(path, max_attempts=2, sleep=Sleeps()).call("GetItem", {})
    assert caught.value.code == "ChecksumError" and caught.value.uncertain


@pytest.mark.parametrize("body", [b"[1, 2]", b'{"__type": 5, "message": 7}', b"\xff\xfe"])
@pytest.mark.parametrize("kind", ["lean", "fast", "boto3"])
def test_a_5xx_whose_body_cannot_be_read_is_retried_and_may_have_been_applied(scripted, kind, body):
    data = body
    server = scripted((500, {"Content-Type": "application/x-amz-json-1.0", "x-amz-crc32": str(zlib.crc32(data))},
                       data, 0.0))
    if kind == "boto3":
        t = make_transport(kind, connect_timeout=1, read_timeout=1, max_attempts=2)
    else:
        t = bounded(kind, max_attempts=2, sleep=Sleeps())
    with pytest.raises(DynamoDBError) as caught:
        t.call("PutItem", {"TableName": "t", "Item": {"id": {"S": "k"}}})
    assert caught.value.uncertain and server.count >= 1
    if kind != "boto3":
        assert caught.value.code == "500" and server.count == 2  # a 5xx, retried as any other


def test_boto3_tripping_on_an_answer_may_have_been_applied(scripted):
    # botocore's retry check raises a bare ValueError on an x-amz-crc32 that is no integer (with one attempt
    # it takes the answer as it is); the request was applied.
    scripted(answer(crc=None, headers={"x-amz-crc32": "abc"}))
    t = make_transport("boto3", connect_timeout=1, read_timeout=1, max_attempts=2)
    with pytest.raises(DynamoDBError) as caught:
        t.call("PutItem", {"TableName": "t", "Item": {"id": {"S": "k"}}})
    assert caught.value.uncertain and caught.value.code == "ValueError"
