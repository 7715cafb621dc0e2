"""aws.secrets.read_secret, the record-MAC key's reader: against moto's server mode (Secrets Manager and SSM,
SecretString and SecretBinary, SecureString, not found), a scripted server on loopback (access denied, throttling,
5xx, oversized and stalled answers, TLS with a CA of our own), botocore's signer and serializer for the same
request, and root logging at DEBUG, which must capture no value, key, token or signature."""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.aws import secrets, sigv4
from idempotency_layer.aws.secrets import MAX_ANSWER, read_secret
from idempotency_layer.errors import IdempotencyConfigurationError
from tests.support.scripted_dynamodb import ScriptedDynamoDB, answer, unused_port

ROOT = Path(__file__).resolve().parents[2]
SETTING = "IDEMPOTENCY_RECORD_MAC_KEY"
ACCESS_KEY = "AKIDSECRETSTEST01"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/secret-access-key-77"
TOKEN = "IQoJb3JpZ2luX2VjEsession-token-of-the-test/AAAA=="
KEY = "k3y-of-the-records-0123456789-abcdefghijklmnop"  # what the secret holds
BINARY = bytes(range(256))[::-1] + b"\x00binary-key"


def environment(endpoint: str | None, **extra: str) -> dict[str, str]:
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_SESSION_TOKEN": TOKEN,
           "AWS_REGION": "eu-west-1", **extra}
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def within(seconds: float) -> float:
    return time.monotonic() + seconds


# -- moto's server mode ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[dict[str, str]]:
    """moto's server on a free loopback port, holding the secrets and parameters the tests read."""
    pytest.importorskip("moto")
    import boto3
    from moto.server import ThreadedMotoServer

    port = unused_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        options = {"endpoint_url": endpoint, "region_name": "eu-west-1", "aws_access_key_id": "a",
                   "aws_secret_access_key": "b"}
        manager = boto3.client("secretsmanager", **options)
        arn = manager.create_secret(Name="orders/record-mac", SecretString=KEY)["ARN"]
        manager.create_secret(Name="orders/record-mac-binary", SecretBinary=BINARY)
        ssm = boto3.client("ssm", **options)
        ssm.put_parameter(Name="/orders/record-mac", Value=KEY, Type="SecureString")
        ssm.put_parameter(Name="/orders/plain", Value=KEY, Type="String")
        yield {"endpoint": endpoint, "arn": arn}
    finally:
        server.stop()


def test_a_secret_string_is_read_by_name_and_by_arn(moto_endpoint):
    env = environment(moto_endpoint["endpoint"])
    assert read_secret("secretsmanager:orders/record-mac", env, within(5)) == KEY.encode()
    assert read_secret("secretsmanager:" + moto_endpoint["arn"], env, within(5)) == KEY.encode()


def test_a_secret_binary_is_its_bytes(moto_endpoint):
    env = environment(moto_endpoint["endpoint"])
    assert read_secret("secretsmanager:orders/record-mac-binary", env, within(5)) == BINARY


def test_a_secure_string_parameter_is_read_decrypted(moto_endpoint):
    # The service-specific variable wins over AWS_ENDPOINT_URL, as botocore has it.
    env = environment("http://127.0.0.1:9", AWS_ENDPOINT_URL_SSM=moto_endpoint["endpoint"])
    assert read_secret("ssm:/orders/record-mac", env, within(5)) == KEY.encode()


def test_a_plain_string_parameter_is_refused(moto_endpoint):
    env = environment(moto_endpoint["endpoint"])
    with pytest.raises(IdempotencyConfigurationError) as raised:
        read_secret("ssm:/orders/plain", env, within(5))
    message = str(raised.value)
    assert message.startswith(f"{SETTING}: the SSM parameter '/orders/plain' could not be read: it is a String "
                              "parameter, not a SecureString")
    assert KEY not in message


@pytest.mark.parametrize(("source", "said"), [
    ("secretsmanager:orders/absent", "the Secrets Manager secret 'orders/absent' could not be read: "
                                     "ResourceNotFoundException (no secret of that name"),
    ("ssm:/orders/absent", "the SSM parameter '/orders/absent' could not be read: ParameterNotFound (no parameter"),
])
def test_a_missing_secret_names_the_setting_the_source_and_the_code(moto_endpoint, source, said):
    env = environment(moto_endpoint["endpoint"])
    with pytest.raises(IdempotencyConfigurationError) as raised:
        read_secret(source, env, within(5))
    assert str(raised.value).startswith(f"{SETTING}: {said}")
    # Nothing holding the answer is chained to it (a traceback prints a chained exception's text).
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None or raised.value.__suppress_context__


def test_root_logging_at_debug_captures_no_value_credential_or_signature(moto_endpoint, capfd):
    # E6 of the review: the root logger at DEBUG (awslambdaric's AWS_LAMBDA_LOG_LEVEL=DEBUG), everything captured.
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    seen: list[dict] = []
    real_sign = sigv4.Signer.sign

    def sign(self: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
        signed = real_sign(self, *args, **kwargs)
        seen.append(signed)
        return signed

    try:
        with mock.patch.object(sigv4.Signer, "sign", sign):
            env = environment(moto_endpoint["endpoint"])
            assert read_secret("secretsmanager:orders/record-mac", env, within(5)) == KEY.encode()
            assert read_secret("ssm:/orders/record-mac", env, within(5)) == KEY.encode()
            logging.getLogger("probe").debug("the handler is live")  # the capture cannot pass by capturing nothing
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out, err = capfd.readouterr()
    text = captured.getvalue() + out + err
    assert "probe DEBUG the handler is live" in text
    signatures = [signed["Authorization"].rpartition("Signature=")[2] for signed in seen]
    assert len(signatures) == 2 and all(len(s) == 64 for s in signatures)
    for secret in (KEY, SECRET_KEY, TOKEN, "Signature=", *signatures):
        assert secret not in text


def test_no_botocore_is_imported_for_a_read(moto_endpoint):
    # The point of the reader: at init, a read costs no botocore import (measured in bench/secret_read.py).
    code = ("import os, sys, time\n"
            "from idempotency_layer.aws.secrets import read_secret\n"
            "value = read_secret('secretsmanager:orders/record-mac', os.environ, time.monotonic() + 5)\n"
            "print(len(value), sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'boto3')))\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{ROOT / 'layer'}{os.pathsep}{ROOT}",
           **environment(moto_endpoint["endpoint"])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(len(KEY)), "[]"]


# -- a scripted server: what moto does not play ------------------------------------------------------------------


def aws_error(status: int, code: str, message: str = "no") -> tuple:
    return answer(status, {"__type": code, "Message": message}, crc=None,
                  headers={"Content-Type": "application/x-amz-json-1.1"})


def secret_answer(value: str = KEY) -> tuple:
    return answer(200, {"ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x-AbCdEf", "Name": "x",
                        "SecretString": value, "VersionStages": ["AWSCURRENT"]}, crc=None)


@pytest.fixture
def scripted_server() -> Iterator[Any]:
    servers: list[ScriptedDynamoDB] = []

    def start(*script: tuple, tls: Any = None) -> ScriptedDynamoDB:
        server = ScriptedDynamoDB(list(script), tls)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def test_access_denied_is_said_with_the_permission_and_tried_once(scripted_server):
    message = f"User: arn:aws:sts::1:assumed-role/fn is not authorized; token {TOKEN}"
    server = scripted_server(aws_error(400, "AccessDeniedException", message))
    with pytest.raises(IdempotencyConfigurationError) as raised:
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5))
    said = str(raised.value)
    assert said == (f"{SETTING}: the Secrets Manager secret 'orders/record-mac' could not be read: "
                    "AccessDeniedException (the function's role needs secretsmanager:GetSecretValue on this secret "
                    "(and kms:Decrypt on its key when that is a customer managed key))")
    assert server.count == 1
    for secret in (TOKEN, SECRET_KEY, "not authorized"):
        assert secret not in said


def test_ssm_access_denied_names_kms_too(scripted_server):
    server = scripted_server(aws_error(400, "com.amazonaws.ssm#AccessDeniedException"))
    with pytest.raises(IdempotencyConfigurationError, match=r"AccessDeniedException \(the function's role needs "
                       r"ssm:GetParameter on this parameter and kms:Decrypt"):
        read_secret("ssm:/orders/record-mac", environment(server.endpoint), within(5))


def test_an_error_without_a_code_is_said_by_its_status(scripted_server):
    server = scripted_server(answer(403, b"<html>Forbidden " + KEY.encode() + b"</html>", crc=None))
    with pytest.raises(IdempotencyConfigurationError) as raised:
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5))
    assert str(raised.value) == (f"{SETTING}: the Secrets Manager secret 'orders/record-mac' could not be read: "
                                 "HTTP 403")
    assert server.count == 1


def test_throttling_and_a_5xx_are_tried_again_then_the_value_is_read(scripted_server):
    server = scripted_server(aws_error(400, "ThrottlingException"), aws_error(503, "ServiceUnavailable"),
                             secret_answer())
    assert read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5)) == KEY.encode()
    assert server.count == 3
    # Every attempt was signed anew and asked the same thing.
    assert len({server.requests[i][1] for i in range(3)}) == 1
    assert server.headers(0)["x-amz-target"] == "secretsmanager.GetSecretValue"


def test_throttling_without_end_stops_after_the_attempts(scripted_server):
    server = scripted_server(aws_error(400, "ThrottlingException"))
    started = time.monotonic()
    with pytest.raises(IdempotencyConfigurationError, match=r"could not be read: ThrottlingException \(HTTP 400\) "
                       r"\(tried again until the deadline\)"):
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5))
    assert server.count == secrets.ATTEMPTS
    assert time.monotonic() - started < 3


def test_an_oversized_answer_is_refused_unread(scripted_server):
    server = scripted_server(secret_answer("x" * (MAX_ANSWER + 1)))
    with pytest.raises(IdempotencyConfigurationError, match="the answer is larger than 128 KiB") as raised:
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5))
    assert server.count == 1
    assert "xxxx" not in str(raised.value)


def test_an_answer_just_under_the_cap_is_read(scripted_server):
    value = "v" * (MAX_ANSWER - 400)
    server = scripted_server(secret_answer(value))
    assert read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5)) == value.encode()


def test_a_stalled_answer_ends_by_the_deadline(scripted_server):
    server = scripted_server((200, {"Content-Type": "application/x-amz-json-1.1"}, b"{}", 3.0))
    started = time.monotonic()
    with pytest.raises(IdempotencyConfigurationError, match=r"no answer from 127\.0\.0\.1:\d+ \([A-Za-z]+\) \(in a "
                       r"VPC without internet access, the function needs a VPC endpoint for Secrets Manager\)"):
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(0.6))
    assert time.monotonic() - started < 0.6 + 0.25


def test_an_endpoint_that_accepts_and_never_answers_is_a_timeout():
    # The kernel accepts the connection into the backlog; nothing ever reads or answers it. The attempt's timer
    # shuts the socket, and the read it cut is said as what it was: a timeout (not RemoteDisconnected).
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(IdempotencyConfigurationError) as raised:
            read_secret("secretsmanager:orders/record-mac",
                        environment(None, AWS_ENDPOINT_URL_SECRETS_MANAGER=endpoint), within(0.6))
        assert time.monotonic() - started < 0.6 + 0.25
    assert str(raised.value) == (f"{SETTING}: the Secrets Manager secret 'orders/record-mac' could not be read: no "
                                 f"answer from {endpoint[7:]} (TimeoutError) (in a VPC without internet access, the "
                                 "function needs a VPC endpoint for Secrets Manager)")


def test_a_past_deadline_sends_nothing(scripted_server):
    server = scripted_server(secret_answer())
    with pytest.raises(IdempotencyConfigurationError, match="the deadline passed before the first attempt"):
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), time.monotonic())
    assert server.count == 0


class Trickle:
    """A server on loopback that answers every connection with `data`, `chunk` bytes every `pause` seconds,
    with no Content-Length (the answer ends at the close)."""

    def __init__(self, data: bytes, chunk: int, pause: float) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.data, self.chunk, self.pause = data, chunk, pause
        self.stopped = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.05)
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    for start in range(0, len(self.data), self.chunk):
                        if self.stopped.is_set():
                            break
                        conn.sendall(self.data[start:start + self.chunk])
                        time.sleep(self.pause)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def trickle() -> Iterator[Any]:
    servers: list[Trickle] = []

    def start(data: bytes, chunk: int, pause: float) -> Trickle:
        servers.append(Trickle(data, chunk, pause))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_an_answer_trickled_a_byte_at_a_time_ends_by_the_deadline(trickle):
    server = trickle(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.1\r\n\r\n" + b'{"SecretString": "'
                     + b"k" * 500 + b'"}', 1, 0.01)
    started = time.monotonic()
    with pytest.raises(IdempotencyConfigurationError, match="no answer from"):
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(0.8))
    assert time.monotonic() - started < 0.8 + 0.25


def test_an_answer_without_length_is_cut_at_the_cap(trickle):
    body = b'{"SecretString": "' + b"k" * (MAX_ANSWER + 10) + b'"}'
    server = trickle(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body, 65536, 0)
    with pytest.raises(IdempotencyConfigurationError, match="the answer is larger than 128 KiB"):
        read_secret("secretsmanager:orders/record-mac", environment(server.endpoint), within(5))
    assert server.connections == 1


def test_https_with_the_environments_ca_bundle(scripted_server, own_ca):
    server = scripted_server(secret_answer(), tls=own_ca["context"])
    env = environment(server.endpoint, AWS_CA_BUNDLE=own_ca["ca"])
    assert read_secret("secretsmanager:orders/record-mac", env, within(5)) == KEY.encode()
    # A bundle that did not sign the server's certificate: no answer, said with the TLS error's name.
    with pytest.raises(IdempotencyConfigurationError, match=r"no answer from 127\.0\.0\.1:\d+ "
                                                            r"\(SSLCertVerificationError\)"):
        read_secret("secretsmanager:orders/record-mac", {**env, "AWS_CA_BUNDLE": own_ca["other"]}, within(1))


# -- the request is botocore's -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "service", "target"), [
    ("secretsmanager:orders/record-mac", "secretsmanager", "secretsmanager.GetSecretValue"),
    ("ssm:/orders/record-mac", "ssm", "AmazonSSM.GetParameter"),
])
def test_the_request_is_signed_and_written_as_botocore_does(scripted_server, source, service, target):
    import boto3
    from botocore import auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    fixed = 1_780_000_000
    reply = secret_answer() if service == "secretsmanager" else answer(
        200, {"Parameter": {"Name": "/orders/record-mac", "Type": "SecureString", "Value": KEY}}, crc=None)
    server = scripted_server(reply)
    clock = types.SimpleNamespace(time=lambda: fixed, strftime=time.strftime, gmtime=time.gmtime)
    with mock.patch.object(sigv4, "time", clock):
        read_secret(source, environment(server.endpoint), within(5))
    ours, body = server.headers(0), server.requests[0][1]
    assert ours["x-amz-target"] == target
    assert ours["content-type"] == "application/x-amz-json-1.1"
    # botocore's signer over the same request at the same instant gives the same Authorization.
    when = datetime.datetime.fromtimestamp(fixed, datetime.timezone.utc).replace(tzinfo=None)
    request = AWSRequest(method="POST", url=server.endpoint + "/", data=body, headers={
        "X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1", "Host": ours["host"]})
    with mock.patch.object(auth, "get_current_datetime", lambda: when):
        auth.SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY, TOKEN), service, "eu-west-1").add_auth(request)
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-date"] == request.headers["X-Amz-Date"]
    assert ours["x-amz-security-token"] == TOKEN
    # And the body is the one botocore's client writes for the same call.
    client = boto3.client(service, endpoint_url=server.endpoint, region_name="eu-west-1",
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    name = source.partition(":")[2]
    if service == "secretsmanager":
        client.get_secret_value(SecretId=name)
    else:
        client.get_parameter(Name=name, WithDecryption=True)
    assert server.requests[1][1] == body
    assert server.headers(1)["x-amz-target"] == target


# -- sources, endpoints, credentials: no server ------------------------------------------------------------------


def test_an_env_source_is_the_variables_bytes():
    assert read_secret("env:MAC_KEY", {"MAC_KEY": KEY}, within(5)) == KEY.encode()
    # Bytes that are not UTF-8 (os.environ keeps them as lone surrogates) come back as they were.
    assert read_secret("env:MAC_KEY", {"MAC_KEY": "k\udcff"}, within(5)) == b"k\xff"


@pytest.mark.parametrize(("source", "said"), [
    ("env:MAC_KEY", "IDEMPOTENCY_RECORD_MAC_KEY: env:MAC_KEY: the variable MAC_KEY is not set or empty"),
    ("env:", "IDEMPOTENCY_RECORD_MAC_KEY: an env: source does not name an environment variable (its text is not "
             "shown): env:<letters, digits and _>"),
    ("vault:x", "IDEMPOTENCY_RECORD_MAC_KEY: a source is not one (the kind 'vault' is unknown; its text is not "
                "shown): write secretsmanager:<arn or name>, ssm:<SecureString parameter name> or env:<VARIABLE>"),
    ("secretsmanager:", "IDEMPOTENCY_RECORD_MAC_KEY: a secretsmanager: source does not name a Secrets Manager "
                        "secret (its text is not shown)"),
    ("ssm:a b", "IDEMPOTENCY_RECORD_MAC_KEY: a ssm: source does not name a SSM parameter"),
    ("secretsmanager:arn:aws:ssm:eu-west-1:1:parameter/x", "could not be read: not an ARN of its kind"),
])
def test_a_bad_source_is_said(source, said):
    with pytest.raises(IdempotencyConfigurationError) as raised:
        read_secret(source, {"AWS_REGION": "eu-west-1"}, within(5))
    assert said in str(raised.value)


@pytest.mark.parametrize("source", [KEY, "k3y:" + KEY, "ssm:" + KEY + " ", "env:" + KEY + "!", "Secret " + KEY])
def test_a_key_written_in_the_setting_by_mistake_is_never_shown(source):
    with pytest.raises(IdempotencyConfigurationError) as raised:
        read_secret(source, {"AWS_REGION": "eu-west-1"}, within(5))
    assert KEY not in str(raised.value) and "its text is not shown" in str(raised.value)


def endpoint_of(source: str, env: dict[str, str]) -> tuple[str, str, str]:
    kind, _, name = source.partition(":")
    where = secrets._where(secrets._SERVICES[kind], name, env)
    return ("https" if where.https else "http") + "://" + where.host_header + where.wire, where.region, \
        where.signed_path


@pytest.mark.parametrize(("source", "env", "expected"), [
    ("secretsmanager:x", {"AWS_REGION": "eu-west-1"}, ("https://secretsmanager.eu-west-1.amazonaws.com/",
                                                       "eu-west-1")),
    ("ssm:/x", {"AWS_REGION": "us-east-2", "AWS_DEFAULT_REGION": "eu-north-1"},
     ("https://ssm.eu-north-1.amazonaws.com/", "eu-north-1")),
    ("secretsmanager:arn:aws:secretsmanager:ap-south-1:123456789012:secret:x-AbCdEf", {"AWS_REGION": "eu-west-1"},
     ("https://secretsmanager.ap-south-1.amazonaws.com/", "ap-south-1")),
    ("ssm:arn:aws-cn:ssm:cn-north-1:123456789012:parameter/x", {}, ("https://ssm.cn-north-1.amazonaws.com.cn/",
                                                                    "cn-north-1")),
    ("secretsmanager:x", {"AWS_REGION": "us-east-1", "AWS_USE_FIPS_ENDPOINT": "true"},
     ("https://secretsmanager-fips.us-east-1.amazonaws.com/", "us-east-1")),
    ("secretsmanager:x", {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://localhost:4566",
                          "AWS_ENDPOINT_URL_SECRETS_MANAGER": "https://vpce-1.secretsmanager.example:8443/base"},
     ("https://vpce-1.secretsmanager.example:8443/base", "eu-west-1")),
    ("ssm:/x", {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_SECRETS_MANAGER": "http://localhost:1",
                "AWS_ENDPOINT_URL": "http://localhost:4566"}, ("http://localhost:4566/", "eu-west-1")),
    ("ssm:/x", {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://localhost:4566",
                "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}, ("https://ssm.eu-west-1.amazonaws.com/", "eu-west-1")),
])
def test_where_a_read_goes(source, env, expected):
    assert endpoint_of(source, env)[:2] == expected


@pytest.mark.parametrize(("env", "said"), [
    ({}, "could not be read: no region (set AWS_REGION, or name the secret by its ARN)"),
    ({"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "ftp://host"}, "the endpoint URL 'ftp://host' is not usable"),
    ({"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://host:99999"}, "is not usable"),
])
def test_an_unusable_region_or_endpoint_is_said(env, said):
    with pytest.raises(IdempotencyConfigurationError, match=said.replace("(", r"\(").replace(")", r"\)")):
        read_secret("secretsmanager:x", env, within(5))


def test_credentials_that_cannot_be_sent_are_refused_without_a_request(scripted_server):
    server = scripted_server(secret_answer())
    env = environment(server.endpoint, AWS_SESSION_TOKEN="tok\r\nX-Injected: 1")
    with pytest.raises(IdempotencyConfigurationError, match="unusable credentials") as raised:
        read_secret("secretsmanager:x", env, within(5))
    assert "X-Injected" not in str(raised.value)
    assert server.count == 0


def test_a_refused_connection_is_tried_again_then_said():
    env = environment(f"http://127.0.0.1:{unused_port()}")
    with pytest.raises(IdempotencyConfigurationError, match=r"no answer from 127\.0\.0\.1:\d+ "
                                                            r"\(ConnectionRefusedError\)"):
        read_secret("ssm:/x", env, within(2))


def test_credentials_from_botocores_chain_are_waited_for_until_the_deadline(scripted_server, tmp_path):
    # Off the plain environment (SnapStart's container credentials), botocore's chain asks the network: a
    # credentials server that never answers fails the read by its deadline, and the secret is never asked for.
    service = scripted_server(secret_answer())
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connections wait in its backlog, unanswered
        env = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": service.endpoint,
               "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"http://127.0.0.1:{silent.getsockname()[1]}/credentials",
               "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
               "AWS_EC2_METADATA_DISABLED": "true"}
        import botocore.session  # noqa: F401 - imported before the clock starts: its import is not the wait

        started = time.monotonic()
        with mock.patch.dict(os.environ, env, clear=True), pytest.raises(
                IdempotencyConfigurationError, match=r"could not be read: no credentials \(TimeoutError\)"):
            read_secret("secretsmanager:orders/record-mac", env, within(0.8))
        assert time.monotonic() - started < 0.8 + 0.25
        silent.settimeout(2)
        asked, _ = silent.accept()  # botocore did connect to it
        asked.close()
    assert service.count == 0


@settings(max_examples=50, deadline=None)
@given(header=st.text(max_size=80), body=st.one_of(st.binary(max_size=200), st.builds(
    lambda t: json.dumps({"__type": t, "Message": KEY}).encode(), st.text(max_size=80))))
def test_an_error_code_is_a_codes_name_or_a_question_mark(header, body):
    # Whatever a broken or hostile peer answers, an error quotes at most a code's name, never its message.
    code = secrets._error_code(header, body)
    assert code == "?" or (secrets._CODE.fullmatch(code) and (code in header or code.encode() in body))
    assert KEY not in code


def test_an_error_code_is_found_in_each_of_awss_forms():
    assert secrets._error_code("ResourceNotFoundException:http://internal.amazon.com/", b"") == \
        "ResourceNotFoundException"
    assert secrets._error_code("", b'{"__type": "com.amazonaws.ssm#ParameterNotFound", "message": "x"}') == \
        "ParameterNotFound"
    assert secrets._error_code("", b"<html>") == "?"
