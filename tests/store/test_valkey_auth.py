"""Where the Valkey store's password comes from, on real servers: an IAM token (IDEMPOTENCY_VALKEY_IAM), checked
against botocore's presigner as the server received it, and a password read from Secrets Manager
(IDEMPOTENCY_VALKEY_SECRET, on moto's server), read again after the secret and the server's password rotate."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest

from idempotency_layer import config
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.valkey import make_store
from tests.support.resp_proxy import RespProxy
from tests.support.valkey_server import Server

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "tok",
               "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1"}


def settings(url: str, **more: str) -> config.Config:
    return config.load({"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "AWS_LAMBDA_FUNCTION_NAME": "orders",
                        "IDEMPOTENCY_STORE": "valkey", "IDEMPOTENCY_VALKEY_URL": url, "IDEMPOTENCY_MAX_ATTEMPTS": "2",
                        **CREDENTIALS, **more})


def botocore_token(user: str, cache: str, service: str, amz_date: str) -> str:
    from unittest import mock

    import botocore.auth
    import botocore.session
    from botocore.credentials import Credentials
    from botocore.model import ServiceId
    from botocore.signers import RequestSigner

    when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ")
    session = botocore.session.get_session()  # held: RequestSigner keeps a weak reference to its emitter
    with mock.patch.object(botocore.auth, "get_current_datetime", lambda: when):
        signer = RequestSigner(ServiceId(service), "eu-west-1", service, "v4",
                               Credentials("AKIDEXAMPLE", "secret", "tok"), session.get_component("event_emitter"))
        url = f"https://{cache}/?{urlencode({'Action': 'connect', 'User': user})}"
        return signer.generate_presigned_url({"method": "GET", "url": url, "body": {}, "headers": {}, "context": {}},
                                             operation_name="connect", expires_in=900,
                                             region_name="eu-west-1").removeprefix("https://")


def test_iam_authentication_sends_the_users_signed_token(monkeypatch: pytest.MonkeyPatch,
                                                         valkey_servers: dict[str, Server]) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    server = valkey_servers["valkey9"]
    server.command("ACL", "SETUSER", "orders-iam", "on", "nopass", "~orders#*", "+@all")  # takes any password
    proxy = RespProxy(server.port)
    try:
        found = settings("rediss://orders-iam@localhost", IDEMPOTENCY_VALKEY_IAM="memorydb:orders-cache")
        store = make_store(found._replace(valkey=found.valkey._replace(tls=False, host="127.0.0.1",
                                                                      port=proxy.port)))  # TLS: test_valkey_store.py
        calls: list[int] = []
        cycle = Cycle(store, ttl_seconds=3600)
        cycle.run(Invocation(60_000), "orders#k", lambda: calls.append(1))
        assert cycle.run(Invocation(60_000), "orders#k", lambda: calls.append(1)).replayed and calls == [1]
        (auth,) = proxy.auths
        user, token = (part.decode() for part in auth)
        assert user == "orders-iam"
        amz_date = parse_qs(token.split("?", 1)[1])["X-Amz-Date"][0]
        assert token == botocore_token("orders-iam", "orders-cache", "memorydb", amz_date)
        assert store.client.url.password is None and "tok" not in repr(found)
    finally:
        proxy.close()
        server.command("ACL", "DELUSER", "orders-iam")


@pytest.fixture
def secret(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    for name, value in {**CREDENTIALS, "AWS_ENDPOINT_URL_SECRETS_MANAGER": moto.endpoint}.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("secretsmanager")
    arn = client.create_secret(Name=f"orders-valkey-{time.time_ns()}",
                               SecretString=json.dumps({"username": "orders", "password": "first-password-1"}))["ARN"]
    return client, arn


def test_a_password_from_secrets_manager_is_read_again_after_a_rotation(secret: Any,
                                                                         valkey_servers: dict[str, Server]) -> None:
    client, arn = secret
    server = valkey_servers["redis7"]
    server.command("ACL", "SETUSER", "orders", "on", ">first-password-1", "~orders#*", "+@all")
    try:
        store = make_store(settings(f"redis://127.0.0.1:{server.port}", IDEMPOTENCY_VALKEY_SECRET=arn))
        cycle = Cycle(store, ttl_seconds=3600)
        calls: list[int] = []
        cycle.run(Invocation(60_000), "orders#r1", lambda: calls.append(1))
        # The secret rotates: the server takes the new password only; the pooled connection is dropped.
        client.put_secret_value(SecretId=arn, SecretString=json.dumps({"username": "orders",
                                                                        "password": "second-password-2"}))
        server.command("ACL", "SETUSER", "orders", "resetpass", ">second-password-2")
        server.command("CLIENT", "KILL", "USER", "orders")
        cycle.run(Invocation(60_000), "orders#r2", lambda: calls.append(1))  # WRONGPASS, the secret read again
        assert cycle.run(Invocation(60_000), "orders#r1", lambda: calls.append(1)).replayed and calls == [1, 1]
        wrong = make_store(settings(f"redis://127.0.0.1:{server.port}",
                                    IDEMPOTENCY_VALKEY_SECRET="arn:aws:secretsmanager:eu-west-1:123456789012:"
                                                              "secret:missing-AbCdEf"))
        with pytest.raises(IdempotencyPersistenceLayerError, match="ResourceNotFoundException") as raised:
            Cycle(wrong, ttl_seconds=3600).run(Invocation(60_000), "orders#r3", lambda: calls.append(1))
        assert "password" not in str(raised.value).replace("Valkey password", "") and calls == [1, 1]
    finally:
        server.command("ACL", "DELUSER", "orders")


def test_secrets_manager_out_of_reach_is_checked_again_and_a_missing_secret_fails_init(
        secret: Any, valkey_servers: dict[str, Server], monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotency_layer.deadline import Deadline
    from idempotency_layer.errors import IdempotencyConfigurationError

    server = valkey_servers["redis7"]
    _, arn = secret
    missing = make_store(settings(f"redis://127.0.0.1:{server.port}",
                                  IDEMPOTENCY_VALKEY_SECRET=arn.replace("orders-valkey", "no-such-secret")))
    with pytest.raises(IdempotencyConfigurationError, match=r"^IDEMPOTENCY_VALKEY_SECRET: .*ResourceNotFoundException"):
        missing.verify(Deadline.after(5))
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", "http://127.0.0.1:9")  # nothing listens
    away = make_store(settings(f"redis://127.0.0.1:{server.port}", IDEMPOTENCY_VALKEY_SECRET=arn,
                               IDEMPOTENCY_CONNECT_TIMEOUT="0.2"))
    away.verify(Deadline.after(5))  # not definite: a warning, checked again before the first claim
    assert away._unverified is not None
