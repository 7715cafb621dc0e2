"""A clean AWS environment and a scripted local DynamoDB for the client's unit tests (tests/unit/test_dynamodb_*).

`ScriptedDynamoDB` is a real HTTP/1.1 server on 127.0.0.1 (keep-alive, optionally TLS) that plays a list of
answers, one a request, the last one for good, and records what it saw. Fixtures here are imported by the test
modules that use them.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import boto3
import orjson
import pytest

PREFIX = "com.amazonaws.dynamodb.v20120810#"
OPTIONS = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 1}
# The two sources of a `lean` transport's target, named as tests/conftest.py's build_transport names them.
SOURCES = {"lean": "environment", "lean-botocore": "botocore"}


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> pytest.MonkeyPatch:
    """A clean AWS environment: test credentials and region, no config files, no proxy, no CA bundle, no
    metadata service. Both sources can serve it."""
    for name in list(os.environ):
        lower = name.lower()
        if name.startswith(("AWS_", "BOTOCORE_")) or lower.endswith("_proxy") or lower in (
            "requests_ca_bundle", "ssl_cert_file", "ssl_cert_dir"
        ):
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


def answer(status: int = 200, body: Any = None, crc: Any = True, delay: float = 0.0,
           headers: dict | None = None) -> tuple:
    """One scripted answer: `crc` True for the right x-amz-crc32, None for none, else the value to send."""
    data = body if isinstance(body, bytes) else orjson.dumps({} if body is None else body)
    head = {"Content-Type": "application/x-amz-json-1.0", **(headers or {})}
    if crc is True:
        head["x-amz-crc32"] = str(zlib.crc32(data))
    elif crc is not None:
        head["x-amz-crc32"] = str(crc)
    return status, head, data, delay


def throttle() -> tuple:
    return answer(400, {"__type": PREFIX + "ThrottlingException", "message": "Rate exceeded"})


def server_error() -> tuple:
    return answer(500, {"__type": PREFIX + "InternalServerError", "message": "Internal server error"})


def failed_condition(item: dict | None = None) -> tuple:
    body = {"__type": PREFIX + "ConditionalCheckFailedException", "message": "The conditional request failed"}
    if item is not None:
        body["Item"] = item
    return answer(400, body)


class ScriptedDynamoDB:
    """Plays a list of answers, one a request, the last one for good; records requests, paths and peers."""

    def __init__(self, script: list, tls: ssl.SSLContext | None = None) -> None:
        self.script = list(script)
        self.requests: list[tuple[dict, bytes]] = []
        self.paths: list[str] = []
        self.peers: set = set()
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive
            timeout = 5  # a stuck client cannot hold a server thread

            def do_POST(self) -> None:
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

            def log_message(self, *args: Any) -> None:
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

    def headers(self, index: int) -> dict[str, str]:
        """The headers of request `index`, names lower-cased."""
        with self._lock:
            return {k.lower(): v for k, v in self.requests[index][0].items()}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


@pytest.fixture
def scripted(aws_env: pytest.MonkeyPatch) -> Iterator[Any]:
    """`scripted(*answers, tls=None)` starts a ScriptedDynamoDB and points AWS_ENDPOINT_URL_DYNAMODB at it; every
    server started is closed after the test."""
    servers: list[ScriptedDynamoDB] = []

    def start(*script: tuple, tls: ssl.SSLContext | None = None) -> ScriptedDynamoDB:
        server = ScriptedDynamoDB(list(script), tls)
        servers.append(server)
        aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
        return server

    yield start
    for server in servers:
        server.close()


class Sleeps(list):
    """A `sleep=` that records what it was asked to wait and waits nothing."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def unused_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def own_ca(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A CA of our own, a server certificate for 127.0.0.1 it signed, a server TLS context, and a second CA
    that signed nothing here."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("ca")

    def openssl(*args: Any) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for name in ("ca", "other"):
        openssl("req", "-x509", *ec, "-days", "2", "-subj", f"/CN=test {name}", "-keyout", folder / f"{name}.key",
                "-out", folder / f"{name}.pem", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", folder / "server.key", "-out", folder / "server.csr")
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", folder / "server.csr", "-CA", folder / "ca.pem", "-CAkey", folder / "ca.key",
            "-CAcreateserial", "-days", "1", "-out", folder / "server.pem", "-extfile", folder / "ext")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    return {"ca": str(folder / "ca.pem"), "other": str(folder / "other.pem"), "context": context}
