"""The Valkey store's pure parts, without a server: its settings, the protocol's framing, hash slots. The store on
real servers: tests/store/test_valkey_store.py and every test that takes `store` in tests/store."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer import config
from idempotency_layer.errors import IdempotencyConfigurationError
from idempotency_layer.stores.valkey.client import _slot
from idempotency_layer.stores.valkey.resp import Connection, ProtocolError, ServerError, pack

BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "AWS_LAMBDA_FUNCTION_NAME": "orders",
        "IDEMPOTENCY_STORE": "valkey"}


def load(**env: str) -> config.Config:
    return config.load({**BASE, **env})


@pytest.mark.parametrize(("url", "expected"), [
    ("rediss://cache.example.com", (True, "cache.example.com", 6379, 0, None, None)),
    ("redis://127.0.0.1:7000/3", (False, "127.0.0.1", 7000, 3, None, None)),
    ("valkeys://orders:p%40ss%2Fw0rd@host:6380", (True, "host", 6380, 0, "orders", "p@ss/w0rd")),
    ("REDISS://:secret@host/", (True, "host", 6379, 0, None, "secret")),
    ("rediss://[::1]:6379", (True, "::1", 6379, 0, None, None)),
])
def test_a_valkey_url_is_parsed(url: str, expected: tuple) -> None:
    found = load(IDEMPOTENCY_VALKEY_URL=url)
    assert found.store == "valkey" and tuple(found.valkey)[:6] == expected and found.table == ""


@pytest.mark.parametrize("url", ["http://host", "rediss:///", "rediss://host:0", "rediss://host:65536",
                                 "rediss://host/db1", "rediss://host?ssl_cert_reqs=none", "rediss://host#x",
                                 "rediss://ho st", "unix:///tmp/valkey.sock", "rediss://host:port",
                                 "rediss://user:p#ss@host", "rediss://user:SEC%ZZ@host"])
def test_a_bad_url_fails_init_without_showing_it(url: str) -> None:
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_VALKEY_URL is not accepted") as raised:
        load(IDEMPOTENCY_VALKEY_URL=url)
    assert url not in str(raised.value)  # it may hold a password


def test_the_password_is_never_in_the_settings_repr() -> None:
    found = load(IDEMPOTENCY_VALKEY_URL="rediss://orders:hunter2hunter2@host:6379")
    assert "hunter2" not in repr(found.valkey) and "hunter2" not in repr(found)
    assert repr(found.valkey) == "Valkey(rediss://orders:***@host:6379/0)"
    assert repr(load(IDEMPOTENCY_VALKEY_URL="rediss://:hunter2hunter2@[::1]:6380").valkey) == \
        "Valkey(rediss://:***@[::1]:6380/0)"


@pytest.mark.parametrize("name", ["IDEMPOTENCY_TABLE", "IDEMPOTENCY_TRANSPORT", "IDEMPOTENCY_PARTITION_VALUE",
                                  "IDEMPOTENCY_POWERTOOLS_HANDLER", "IDEMPOTENCY_STATUS_ATTR",
                                  "IDEMPOTENCY_SORT_KEY_ATTR"])
def test_a_dynamodb_setting_with_the_valkey_store_fails_init(name: str) -> None:
    with pytest.raises(IdempotencyConfigurationError, match=f"{name} is set, but it is a setting of the DynamoDB"):
        load(IDEMPOTENCY_VALKEY_URL="rediss://host", **{name: "app.handler" if "HANDLER" in name else "x-y-z"})


def test_the_store_and_its_url_go_together() -> None:
    with pytest.raises(IdempotencyConfigurationError, match="needs IDEMPOTENCY_VALKEY_URL"):
        load()
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_STORE is not valkey"):
        config.load({**BASE, "IDEMPOTENCY_STORE": "dynamodb", "IDEMPOTENCY_TABLE": "t-1",
                     "IDEMPOTENCY_VALKEY_URL": "rediss://host"})
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_STORE='redis' is not accepted"):
        load(IDEMPOTENCY_STORE="redis")
    assert config.load({**BASE, "IDEMPOTENCY_STORE": "DynamoDB", "IDEMPOTENCY_TABLE": "t-1"}).store == "dynamodb"
    assert config.load({**BASE, "IDEMPOTENCY_DISABLED": "true"}).valkey is None  # disabled: nothing needed


# -- the protocol's framing --------------------------------------------------------------------------------------

def answered(data: bytes) -> Connection:
    """A connection whose server has sent `data` and closed."""
    ours, theirs = socket.socketpair()
    theirs.sendall(data)
    theirs.close()
    conn = Connection.__new__(Connection)
    conn.sock, conn.file = ours, ours.makefile("rb")
    return conn


def test_arrays_nest_to_the_bound_and_deeper_is_not_resp() -> None:
    from idempotency_layer.stores.valkey.resp import MAX_DEPTH, ProtocolError

    deepest = answered(b"*1\r\n" * MAX_DEPTH + b":0\r\n").read()
    for _ in range(MAX_DEPTH):
        deepest = deepest[0]
    assert deepest == 0
    for depth in (MAX_DEPTH + 1, 20_000):  # no recursion past the bound: Python's stack never runs out
        with pytest.raises(ProtocolError, match=f"nested deeper than {MAX_DEPTH}"):
            answered(b"*1\r\n" * depth + b":0\r\n").read()


def test_each_kind_of_answer() -> None:
    conn = answered(b"+OK\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*-1\r\n*3\r\n$1\r\nx\r\n*1\r\n:1\r\n-ERR inside\r\n"
                    b"-WRONGTYPE Operation against a key\r\n$0\r\n\r\n")
    assert [conn.read() for _ in range(5)] == ["OK", 42, b"abc", None, None]
    nested = conn.read()
    assert nested[:2] == [b"x", [1]] and isinstance(nested[2], ServerError) and nested[2].code == "ERR"
    with pytest.raises(ServerError) as refused:
        conn.read()
    assert refused.value.code == "WRONGTYPE"
    assert conn.read() == b""
    with pytest.raises(ProtocolError, match="closed"):
        conn.read()


@pytest.mark.parametrize("data", [b"$5\r\nabc", b"?what\r\n", b":12x\r\n", b"$99999999999\r\n", b"*2\r\n:1\r\n",
                                  b"+no end", b"$3\r\nabcde\r\n"])
def test_a_broken_answer_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        answered(data).read()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), st.text(max_size=50), st.integers()), min_size=1, max_size=12))
def test_a_packed_command_reads_back_as_its_arguments(args: list) -> None:
    expected = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    assert answered(pack(tuple(args))).read() == expected


def test_hash_slots_are_the_clusters() -> None:
    # Values from the cluster specification and CLUSTER KEYSLOT.
    assert _slot("foo") == 12182 and _slot("123456789") == 12739
    assert _slot("{user1000}.following") == _slot("{user1000}.followers") == _slot("user1000")
    assert _slot("foo{}{bar}") == _slot("foo{}{bar}") != _slot("bar")  # an empty tag: the whole key
    assert _slot("foo{{bar}}zap") == _slot("{bar")


# -- where the password comes from ------------------------------------------------------------------------------

def test_a_secret_or_iam_authentication_is_set_with_the_url() -> None:
    secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:orders/valkey-AbCdEf"
    found = load(IDEMPOTENCY_VALKEY_URL="rediss://orders@host", IDEMPOTENCY_VALKEY_SECRET=secret).valkey
    assert found.secret == secret and found.password is None and secret in repr(found)
    iam = load(IDEMPOTENCY_VALKEY_URL="rediss://orders-user@host", IDEMPOTENCY_VALKEY_IAM="memorydb:orders",
               AWS_REGION="eu-west-1").valkey
    assert (iam.iam, iam.cache, iam.username) == ("memorydb", "orders", "orders-user")


@pytest.mark.parametrize(("env", "says"), [
    ({"IDEMPOTENCY_VALKEY_SECRET": "s", "IDEMPOTENCY_VALKEY_IAM": "memorydb:c"}, "both set"),
    ({"IDEMPOTENCY_VALKEY_URL": "rediss://u:pw@host", "IDEMPOTENCY_VALKEY_SECRET": "s"}, "remove the password"),
    ({"IDEMPOTENCY_VALKEY_SECRET": "not a name!"}, "not a Secrets Manager secret"),
    ({"IDEMPOTENCY_VALKEY_IAM": "redis:c"}, "expected elasticache:"),
    ({"IDEMPOTENCY_VALKEY_IAM": "memorydb:"}, "expected elasticache:"),
    ({"IDEMPOTENCY_VALKEY_IAM": "memorydb:c", "IDEMPOTENCY_VALKEY_URL": "redis://u@host"}, "over TLS"),
    ({"IDEMPOTENCY_VALKEY_IAM": "memorydb:c", "IDEMPOTENCY_VALKEY_URL": "rediss://host"}, "<user id>@host"),
    ({"IDEMPOTENCY_VALKEY_IAM": "memorydb:c", "AWS_REGION": ""}, "AWS_REGION"),
])
def test_a_bad_source_of_the_password_fails_init(env: dict[str, str], says: str) -> None:
    settings_ = {"IDEMPOTENCY_VALKEY_URL": "rediss://u@host", "AWS_REGION": "us-east-1", **env}
    with pytest.raises(IdempotencyConfigurationError, match=says):
        load(**settings_)


def test_secret_shapes() -> None:
    from idempotency_layer.stores.valkey.auth import _parse
    from idempotency_layer.stores.valkey.client import ValkeyError

    assert _parse("s", '{"username": "app", "password": "pw-1", "user_arn": "arn:..."}') == ("app", "pw-1")
    assert _parse("s", '{"password": "pw-1"}') == (None, "pw-1")
    assert _parse("s", "plain-password") == (None, "plain-password")
    for broken in ('{"username": "app"}', '{"password": 5}', "{not json", "", None):
        with pytest.raises(ValkeyError) as raised:
            _parse("s", broken)
        assert "pw" not in str(raised.value) and "app" not in str(raised.value)


@settings(max_examples=60, deadline=None)
@given(service=st.sampled_from(["elasticache", "elasticache-serverless", "memorydb"]),
       user=st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True),
       cache=st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True),
       token=st.one_of(st.none(), st.text(alphabet="ABCDEFGHIJ0123456789/+=", min_size=1, max_size=60)),
       seconds=st.integers(min_value=1_600_000_000, max_value=2_000_000_000),
       region=st.sampled_from(["us-east-1", "eu-west-1", "ap-southeast-2"]))
def test_an_iam_token_is_botocores_presigned_url(service: str, user: str, cache: str, token: str | None,
                                                 seconds: int, region: str) -> None:
    import datetime
    from unittest import mock
    from urllib.parse import urlencode

    import botocore.auth
    import botocore.session
    from botocore.credentials import Credentials
    from botocore.model import ServiceId
    from botocore.signers import RequestSigner

    from idempotency_layer.aws.sigv4 import Signer

    name = "memorydb" if service == "memorydb" else "elasticache"
    params = {"Action": "connect", "User": user}
    if service == "elasticache-serverless":
        params["ResourceType"] = "ServerlessCache"
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)
    # The session held while it signs: RequestSigner keeps only a weak reference to its event emitter, which a
    # collection would otherwise take from under it (ReferenceError, now and then).
    session = botocore.session.get_session()
    with mock.patch.object(botocore.auth, "get_current_datetime", lambda: when):
        signer = RequestSigner(ServiceId(name), region, name, "v4", Credentials("AKIDEXAMPLE", "secret/key+1", token),
                               session.get_component("event_emitter"))
        theirs = signer.generate_presigned_url(
            {"method": "GET", "url": f"https://{cache}/?{urlencode(params)}", "body": {}, "headers": {},
             "context": {}}, operation_name="connect", expires_in=900, region_name=region)
    ours = Signer("AKIDEXAMPLE", "secret/key+1", token, region, name).presign(cache, list(params.items()), 900,
                                                                              now=seconds)
    assert theirs == "https://" + ours


def test_an_unreadable_ca_bundle_fails_init_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from idempotency_layer.stores.valkey import make_store

    for path in (tmp_path / "missing.pem", tmp_path / "not-pem.pem"):
        if path.name == "not-pem.pem":
            path.write_text("not a certificate")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(path))
        with pytest.raises(IdempotencyConfigurationError, match=f"cannot load the CA bundle {path} "):
            make_store(load(IDEMPOTENCY_VALKEY_URL="rediss://cache.example.com"))
