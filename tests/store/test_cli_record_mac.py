"""The CLI under IDEMPOTENCY_RECORD_MAC_KEY: `show` authenticates a completed record as a copy does, and never
prints the result of one that fails or could not be checked; `doctor` reads the keys as init does and fails with
init's message. The CLI runs as a subprocess on DynamoDB Local (and moto's Lambda for `doctor --function`); the
records are planted through the store's protocol, as anyone who can write the table can write them."""

from __future__ import annotations

import base64
import json
import os
import time

import pytest

from idempotency_layer import codec
from idempotency_layer import config as _config
from idempotency_layer.errors import IdempotencyConfigurationError
from idempotency_layer.record_mac import RecordMac, key_id, keyed
from tests.store.test_cli_commands import cli_env, run
from tests.store.test_cli_doctor_function import client, doctor_env

KEY = os.urandom(32).hex()  # an env: source's key is the variable's bytes: 64 of them
FORGED = '{"refund_to":"attacker-iban-7731"}'
ON = {"IDEMPOTENCY_RECORD_MAC_KEY": "env:MAC_KEY", "MAC_KEY": KEY}


@pytest.fixture
def env(layer_env, table):
    return cli_env(layer_env.endpoint, table, **ON)


def plant(store, key: str, data: str, mac: str | None) -> None:
    """A completed record of `data` under `key`, its `mac` as given (None: none)."""
    now = time.time()
    expires_at = int(now) + 3600
    assert store.claim(key, "writer", now, int(now * 1000) + 60_000, expires_at) is None
    assert store.complete(key, "writer", codec.Encoded(codec.JSON, data), expires_at,
                          seal=None if mac is None else (lambda _: mac))


def sealed(store, key: str, data: str) -> None:
    """A completed record as the function writes it under KEY."""
    now = time.time()
    expires_at = int(now) + 3600
    mac = RecordMac([KEY.encode()], store.identity)
    assert store.claim(key, "writer", now, int(now * 1000) + 60_000, expires_at) is None
    assert store.complete(key, "writer", codec.Encoded(codec.JSON, data), expires_at,
                          seal=lambda stored: mac.seal(key, expires_at, "writer", stored, None))


@pytest.fixture
def store(layer_env, table):
    from idempotency_layer.config import Attributes
    from idempotency_layer.stores.dynamodb.store import DynamoDBStore
    from tests.conftest import build_transport

    return DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2), table,
                         Attributes(), key_prefix="orders")


@pytest.mark.parametrize("mac", [None, "bogus", "unknown key"])
def test_show_says_a_forged_record_fails_and_never_prints_its_result(env, store, mac):
    guessed = base64.b64encode(os.urandom(32)).decode()
    given = {None: None, "bogus": f"{key_id(KEY.encode())}:{guessed}", "unknown key": f"0badc0de:{guessed}"}[mac]
    plant(store, "orders#forged", FORGED, given)
    fault = {None: "it has no mac", "bogus": "its mac does not match",
             "unknown key": "its key id '0badc0de' is not configured"}[mac]
    for args in ((), ("--result",)):
        done = run(env, "show", "orders#forged", *args)
        assert done.returncode == 1, done.stderr
        assert "attacker-iban" not in done.stdout and "attacker-iban" not in done.stderr
        assert "copies replay" not in done.stdout
        assert (f"status:            COMPLETED (completed: fails its authentication: {fault}; copies refuse it: "
                "HTTP 503, a batch record reported failed)") in done.stdout
        assert f"authentic:         NO: {fault}" in done.stdout
        assert "fails its authentication" in done.stderr
    assert "result value:      withheld: the record is not authentic" in done.stdout
    done = run(env, "show", "orders#forged", "--json", "--result")
    assert done.returncode == 1 and "attacker-iban" not in done.stdout
    shown = json.loads(done.stdout)["records"][0]
    assert (shown["authentic"], shown["integrity_fault"]) == (False, fault)
    assert shown["result"] == {"none": f"withheld: the record is not authentic ({fault})"}


def test_show_an_authentic_record_and_its_result(env, store):
    sealed(store, "orders#sealed", '{"charged":500}')
    done = run(env, "show", "orders#sealed", "--result")
    assert done.returncode == 0, done.stderr
    assert "authentic:         yes" in done.stdout and "copies replay the stored result" in done.stdout
    assert 'result value:      {"charged": 500}' in done.stdout
    shown = json.loads(run(env, "show", "orders#sealed", "--json", "--result").stdout)["records"][0]
    assert (shown["authentic"], shown["integrity_fault"], shown["result"]) == (True, None, {"value": {"charged": 500}})


def test_show_without_the_setting_is_unchanged(env, store):
    plant(store, "orders#plain", FORGED, None)
    plain = {k: v for k, v in env.items() if k != "IDEMPOTENCY_RECORD_MAC_KEY"}
    done = run(plain, "show", "orders#plain", "--json", "--result")
    assert done.returncode == 0
    shown = json.loads(done.stdout)["records"][0]
    assert "authentic" not in shown and shown["result"] == {"value": json.loads(FORGED)}


def test_show_with_unreadable_keys_says_they_were_not_checked(env, store):
    sealed(store, "orders#sealed", FORGED)
    unset = {**env, "IDEMPOTENCY_RECORD_MAC_KEY": "env:NO_SUCH_KEY"}
    done = run(unset, "show", "orders#sealed", "--result")
    assert done.returncode == 1
    reason = "IDEMPOTENCY_RECORD_MAC_KEY: env:NO_SUCH_KEY: the variable NO_SUCH_KEY is not set or empty"
    assert f"authentic:         not checked: {reason}" in done.stdout
    assert "copies replay the stored result" not in done.stdout and "attacker-iban" not in done.stdout
    assert "result value:      withheld: the record's authentication was not checked" in done.stdout
    assert done.stderr == f"idempotency-layer: {reason}; so the records' authentication was not checked\n"
    shown = json.loads(run(unset, "show", "orders#sealed", "--json", "--result").stdout)["records"][0]
    assert (shown["authentic"], shown["authentication_not_checked"]) == (None, reason)


def test_show_a_live_claim_under_the_setting(env, store):
    now = time.time()
    assert store.claim("orders#live", "o-1", now, int(now * 1000) + 60_000, int(now) + 3600) is None
    done = run(env, "show", "orders#live", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["records"][0]
    assert shown["authentic"] is None and "not sealed" in shown["authentication_not_checked"]


def init_message(env: dict[str, str]) -> str:
    """What init says of these settings' keys (record_mac.keyed, as the interceptor calls it)."""
    with pytest.raises(IdempotencyConfigurationError) as raised:
        keyed(_config.load({**env, "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler"}), env, "dynamodb:t")
    return str(raised.value)


def settings_check(env: dict[str, str], *args: str) -> tuple[int, dict[str, str]]:
    done = run(env, "doctor", "--json", *args)
    [found] = [check for check in json.loads(done.stdout)["checks"] if check["name"] == "settings"]
    return done.returncode, found


@pytest.mark.parametrize("keys", [{"MAC_KEY": "too-short-16byte"}, {}], ids=["short key", "unset variable"])
def test_doctor_fails_on_keys_init_fails_on(env, keys):
    given = {**{k: v for k, v in env.items() if k != "MAC_KEY"}, **keys}
    expected = init_message(given)
    assert ("has 16 bytes; at least 32" if keys else "the variable MAC_KEY is not set or empty") in expected
    status, found = settings_check(given)
    assert status == 1 and (found["status"], found["detail"]) == ("FAIL", expected)
    assert run(given, "doctor").stdout.startswith(f"FAIL settings: {expected}\n")


def test_doctor_passes_a_valid_key(env):
    status, found = settings_check(env)
    assert status == 0 and found["status"] == "PASS", found
    assert found["detail"].endswith(f"; IDEMPOTENCY_RECORD_MAC_KEY: 1 key(s) read as init reads them (current key "
                                    f"id {key_id(KEY.encode())})")


def test_doctor_function_reads_an_env_source_from_the_functions_own_variables(moto, layer_env, table):
    iam, lam = client(moto, "iam"), client(moto, "lambda")
    role = iam.create_role(RoleName="mac-doctor-role", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    from tests.store.test_cli_doctor_function import _zip

    for name, key in (("mac-good", KEY), ("mac-short", "short"), ("mac-unset", None)):
        variables = {"IDEMPOTENCY_TABLE": table, "IDEMPOTENCY_RECORD_MAC_KEY": "env:FN_MAC_KEY"}
        if key is not None:
            variables["FN_MAC_KEY"] = key
        lam.create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="app.handler",
                            Code={"ZipFile": _zip()}, Timeout=30, Environment={"Variables": variables})
    env = doctor_env(moto, layer_env, table)
    _, found = settings_check(env, "--function", "mac-good")
    # An env: source is the function's own variable: no credentials read it.
    assert found["status"] == "PASS" and "1 key(s) read as init reads them" in found["detail"]
    assert "your credentials" not in found["detail"]
    # The operator's variable of that name is not the function's: its init would fail, so doctor does.
    _, found = settings_check({**env, "FN_MAC_KEY": KEY}, "--function", "mac-unset")
    assert found["status"] == "FAIL" and "FN_MAC_KEY" in found["detail"] and "not set" in found["detail"]
    _, found = settings_check(env, "--function", "mac-short")
    assert found["status"] == "FAIL" and "has 5 bytes; at least 32 are required" in found["detail"]
    assert "your credentials, not the function's role" in found["fix"]


def test_show_withholds_a_result_planted_in_a_live_claim(env, store, ddb_client, table):
    # A claim of the layer's never carries a result; one that does was written by someone else, and no MAC covers a
    # claim: --result does not print it.
    now = time.time()
    assert store.claim("orders#planted", "o-1", now, int(now * 1000) + 60_000, int(now) + 3600) is None
    ddb_client.update_item(TableName=table, Key={"id": {"S": "orders#planted"}},
                           UpdateExpression="SET #r = :r, #f = :f", ExpressionAttributeNames={"#r": "result",
                                                                                             "#f": "result_format"},
                           ExpressionAttributeValues={":r": {"S": FORGED}, ":f": {"S": codec.JSON}})
    for extra in ((), ("--json",)):
        done = run(env, "show", "orders#planted", "--result", *extra)
        assert "attacker-iban" not in done.stdout and "attacker-iban" not in done.stderr
    assert "withheld: an in-progress claim carries no result" in done.stdout
