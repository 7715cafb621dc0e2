"""The CLI's commands against DynamoDB Local, run as a subprocess the way an operator runs them: exit status,
stdout and stderr (one line, never a traceback) for `show`, `purge` and `doctor`.

Records are written by the layer's own store and cycle; what `purge` deleted or left is read back with boto3;
executions are counted by the handler's own side effect."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from idempotency_layer import codec
from idempotency_layer.cli import records
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.conftest import CREDENTIALS, build_transport
from tests.support.dynamodb_local import create_table

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "orders"


def cli_env(endpoint: str, table: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("IDEMPOTENCY_", "AWS_")) and k != "PYTHONPATH"}
    env.update(CREDENTIALS, AWS_ENDPOINT_URL_DYNAMODB=endpoint, IDEMPOTENCY_TABLE=table,
               AWS_LAMBDA_FUNCTION_NAME=PREFIX, PYTHONPATH=str(ROOT / "layer"), IDEMPOTENCY_MAX_ATTEMPTS="1", **extra)
    return env


def run(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "idempotency_layer", *args], env=env, capture_output=True,
                          text=True, timeout=60, input=stdin if stdin is not None else "", check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("idempotency-layer: ")
    return lines[0]


@pytest.fixture
def env(layer_env, table):
    return cli_env(layer_env.endpoint, table)


@pytest.fixture
def store(layer_env, table):
    return DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2), table,
                         Attributes(), key_prefix="fn")


def claim(store: DynamoDBStore, key: str, *, claim_s: float = 300, ttl_s: float = 3600, owner: str = "o-1") -> None:
    now = time.time()
    assert store.claim(key, owner, now, int((now + claim_s) * 1000), int(now + ttl_s)) is None


def item(ddb_client, table: str, key: str):
    return ddb_client.get_item(TableName=table, Key={"id": {"S": key}}, ConsistentRead=True).get("Item")


# -- show --------------------------------------------------------------------------------------------------

def test_show_a_live_claim(env, store):
    claim(store, "orders#live", claim_s=250)
    done = run(env, "show", "orders#live")
    assert done.returncode == 0, done.stderr
    assert "INPROGRESS (in progress: a live claim" in done.stdout
    assert "owner:             o-1" in done.stdout
    shown = json.loads(run(env, "show", "orders#live", "--json").stdout)["records"][0]
    assert shown["state"] == "in progress" and shown["result_format"] is None
    assert shown["in_progress_until"]["relative"].startswith("in 4m")
    assert shown["expires_at"]["relative"] in ("in 1h",) or shown["expires_at"]["relative"].startswith("in 59m")


def test_show_a_completed_record_and_its_result_only_when_asked(env, store):
    secret = {"card": "4111-1111-1111-1111", "total": 12}
    claim(store, "orders#done")
    encoded = codec.encode(secret)
    assert store.complete("orders#done", "o-1", encoded, int(time.time()) + 3600)
    done = run(env, "show", "orders#done")
    assert done.returncode == 0
    assert "4111" not in done.stdout
    assert f"result:            json, {len(encoded.data)} bytes stored" in done.stdout
    shown = json.loads(run(env, "show", "orders#done", "--json").stdout)["records"][0]
    assert (shown["state"], shown["result_format"], shown["result_bytes"]) == ("completed", "json", len(encoded.data))
    assert "result" not in shown
    decoded = json.loads(run(env, "show", "orders#done", "--json", "--result").stdout)["records"][0]["result"]
    assert decoded == {"value": secret}
    assert '"card": "4111-1111-1111-1111"' in run(env, "show", "orders#done", "--result").stdout


def test_show_an_expired_record_and_an_expired_claim(env, layer_env, table):
    # DynamoDB Local's TTL sweep (on `expires_at`) may delete an expired record before `show` reads it; a record
    # whose expiry lives in another attribute stays until the test is done.
    store = DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2), table,
                          Attributes(expires_at="kept_until"), key_prefix="fn")
    env = {**env, "IDEMPOTENCY_EXPIRES_AT_ATTR": "kept_until"}
    claim(store, "orders#old", claim_s=-60, ttl_s=-30)
    claim(store, "orders#stale", claim_s=-60)
    old = json.loads(run(env, "show", "orders#old", "--json").stdout)["records"][0]
    assert old["state"] == "expired" and old["expires_at"]["relative"].endswith("ago")
    stale = json.loads(run(env, "show", "orders#stale", "--json").stdout)["records"][0]
    assert stale["state"] == "in progress (claim expired)"


def test_show_by_event_finds_the_record_the_layer_wrote(env, store, tmp_path):
    cycle = Cycle(store, 3600, 0)
    event = {"orderId": "o-7"}
    (tmp_path / "event.json").write_text(json.dumps(event))
    key = json.loads(run({**env, "IDEMPOTENCY_KEY_JMESPATH": "orderId"}, "key", "--event", str(tmp_path / "event.json"),
                         "--json").stdout)["keys"][0]
    cycle.run(Invocation(30_000), key, lambda: {"ok": 1})
    done = run({**env, "IDEMPOTENCY_KEY_JMESPATH": "orderId"}, "show", "--event", str(tmp_path / "event.json"),
               "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["records"][0]["key"] == key


# -- purge -------------------------------------------------------------------------------------------------

def test_purge_refuses_a_live_claim_unless_forced(env, store, ddb_client, table):
    claim(store, "orders#live", claim_s=250)
    refused = run(env, "purge", "orders#live", "--yes")
    assert refused.returncode == 1
    line = one_line(refused)
    assert "claimed by a live invocation until 20" in line and "(in 4m" in line and "--force" in line
    assert item(ddb_client, table, "orders#live") is not None
    forced = run(env, "purge", "orders#live", "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "deleted the record of key orders#live (it was in progress)" in forced.stdout
    assert item(ddb_client, table, "orders#live") is None


def test_purge_off_a_terminal_asks_for_yes(env, store, ddb_client, table):
    claim(store, "orders#stale", claim_s=-60)
    done = run(env, "purge", "orders#stale")
    assert done.returncode == 1
    assert "pass --yes" in one_line(done)
    assert item(ddb_client, table, "orders#stale") is not None


def test_purge_makes_the_next_copy_run_again(env, store, tmp_path):
    runs = []
    cycle = Cycle(store, 3600, 0)
    (tmp_path / "event.json").write_text(json.dumps({"orderId": "o-9"}))
    env = {**env, "IDEMPOTENCY_KEY_JMESPATH": "orderId"}
    key = json.loads(run(env, "key", "--event", str(tmp_path / "event.json"), "--json").stdout)["keys"][0]

    def handler():
        runs.append(1)
        return {"n": len(runs)}

    assert cycle.run(Invocation(30_000), key, handler).value == {"n": 1}
    assert cycle.run(Invocation(30_000), key, handler).value == {"n": 1}  # a replay
    done = run(env, "purge", "--event", str(tmp_path / "event.json"), "--yes", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["deleted"][0]["was"] == "completed"
    assert cycle.run(Invocation(30_000), key, handler).value == {"n": 2}
    assert len(runs) == 2


def test_purge_of_a_batch_tries_every_record_and_says_what_became_of_each(env, store, ddb_client, table, tmp_path):
    """Issue 28: `purge --event` on a batch stopped at the first record that had none, deleting the ones before it
    without a word and never reaching the ones after; a re-run stopped at the first deleted one."""
    from tests.support import events

    messages = [events.json_message({"n": n}) for n in range(4)]
    (tmp_path / "batch.json").write_text(json.dumps(events.sqs_event(messages)))
    keys = json.loads(run(env, "key", "--event", str(tmp_path / "batch.json"), "--json").stdout)["keys"]
    assert len(keys) == 4
    for key in (keys[0], keys[2]):
        claim(store, key, claim_s=-60)  # stale claims: purgeable without --force
    claim(store, keys[3], claim_s=250)  # live: refused
    done = run(env, "purge", "--event", str(tmp_path / "batch.json"), "--yes", "--json")
    assert done.returncode == 1
    found = json.loads(done.stdout)
    assert [d["key"] for d in found["deleted"]] == [keys[0], keys[2]]
    assert found["missing"] == [keys[1]] and [r["key"] for r in found["refused"]] == [keys[3]]
    assert [item(ddb_client, table, key) is None for key in keys] == [True, True, True, False]
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and "nothing to delete" in lines[0] and "--force" in lines[1]
    again = run(env, "purge", "--event", str(tmp_path / "batch.json"), "--yes", "--force")
    assert again.returncode == 1  # three had no record any more
    assert again.stdout.splitlines() == [f"deleted the record of key {keys[3]} (it was in progress)"]
    assert len(again.stderr.splitlines()) == 3
    assert all(item(ddb_client, table, key) is None for key in keys)


def test_purge_deletes_nothing_that_changed_since_it_was_read(layer_env, store, ddb_client, table):
    claim(store, "orders#racy", claim_s=-60)  # an expired claim: purge takes it without --force

    def completed_meanwhile(prompt: str) -> str:  # its invocation completes while the operator reads the prompt
        assert "orders#racy" in prompt
        assert store.complete("orders#racy", "o-1", codec.encode({"n": 1}), int(time.time()) + 3600)
        return "y"

    with pytest.raises(records.Refused, match="changed since it was read"):
        records.purge(store, "orders#racy", yes=False, force=False, ask=completed_meanwhile)
    assert item(ddb_client, table, "orders#racy")["status"] == {"S": "COMPLETED"}
    with pytest.raises(records.Refused, match="not deleted"):
        records.purge(store, "orders#racy", yes=False, force=False, ask=lambda prompt: "n")
    assert records.purge(store, "orders#racy", yes=False, force=False, ask=lambda prompt: "y")["deleted"]
    assert item(ddb_client, table, "orders#racy") is None


# -- expected failures -------------------------------------------------------------------------------------

def test_expected_failures_are_one_line_never_a_traceback(env, tmp_path):
    (tmp_path / "bad.json").write_text('{"card": "4111-1111"')
    cases = [
        (("show", "orders#none"), 1, "no record for key 'orders#none'"),
        (("purge", "orders#none", "--yes"), 1, "no record for key 'orders#none'"),
        (("show", "orders#x", "--table", "no-such-table"), 1, "ResourceNotFoundException"),
        (("key", "--event", str(tmp_path / "bad.json")), 2, "is not JSON"),
        (("show", "--event", str(tmp_path / "bad.json")), 2, "is not JSON"),
        (("key", "--event", str(tmp_path / "missing.json")), 2, "No such file or directory"),
        (("key", "--event", str(tmp_path)), 2, "Is a directory"),
        (("show", "orders#x", "--scope", "batch"), 2, "IDEMPOTENCY_SCOPE='batch' is not accepted"),
        (("show",), 2, "give either KEY or --event FILE"),
        (("show", "orders#x", "--table", ""), 2, "IDEMPOTENCY_TABLE is not set"),
    ]
    for args, status, message in cases:
        done = run(env, *args)
        assert done.returncode == status, (args, done.stderr)
        line = one_line(done)
        assert message in line, (args, line)
        assert "4111" not in line
    none = run(env, "key", "--event", "-", "--key-jmespath", "orderId", stdin='{"other": 1}')
    assert none.returncode == 1 and "no key: IDEMPOTENCY_KEY_JMESPATH='orderId' selected nothing" in none.stdout


# -- doctor ------------------------------------------------------------------------------------------------

def doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict], str]:
    done = run(env, "doctor", *args)
    text = done.stdout
    facts = json.loads(run(env, "doctor", "--json", *args).stdout)
    return done.returncode, {check["name"]: check for check in facts["checks"]}, text


def test_doctor_passes_on_a_good_table_and_touches_nothing_else(env, ddb_client, table):
    foreign = {"id": {"S": "someone-else#1"}, "status": {"S": "COMPLETED"}, "expires_at": {"N": "1"}}
    ddb_client.put_item(TableName=table, Item=foreign)
    status, checks, text = doctor({**env, "AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper",
                                   "IDEMPOTENCY_KEY_JMESPATH": "orderId"})
    assert status == 0, text
    assert "0 failed, 0 warning(s), 12 passed" in text
    assert "PASS key: IDEMPOTENCY_KEY_JMESPATH='orderId' (an event it selects nothing from runs unguarded)" in text
    for name in ("settings", "key", "wrapper", "credentials", "table", "key schema", "ttl", "permission PutItem",
                 "permission UpdateItem", "permission GetItem", "permission DeleteItem", "permission BatchGetItem"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert ddb_client.scan(TableName=table)["Items"] == [foreign]  # the probes are gone, nothing else changed


def test_doctor_shows_the_key_rule_and_warns_on_the_whole_event_default(env):
    """Issue 29: doctor said `PASS settings: valid` and never showed the key expression."""
    status, checks, text = doctor({**env, "AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper"})
    assert status == 0
    assert checks["key"]["status"] == "WARN"
    assert "WARN key: IDEMPOTENCY_KEY_JMESPATH is unset (or @): a whole event is keyed on all of it" in text
    assert ("     fix: set IDEMPOTENCY_KEY_JMESPATH to what names the operation (e.g. paymentId) and "
            "IDEMPOTENCY_REQUIRE_KEY=true") in text
    _, checks, text = doctor(env, "--key-jmespath", "paymentId", "--require-key", "true")
    assert checks["key"]["status"] == "PASS"
    assert "PASS key: IDEMPOTENCY_KEY_JMESPATH='paymentId' (required)" in text


def test_doctor_warns_on_a_table_without_ttl_and_strict_fails(env, ddb_client):
    name = f"nottl-{os.getpid()}"
    ddb_client.create_table(TableName=name, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                            BillingMode="PAY_PER_REQUEST")
    try:
        status, checks, text = doctor(env, "--table", name)
        assert status == 0
        assert checks["ttl"]["status"] == "WARN"
        fix = (f"aws dynamodb update-time-to-live --table-name {name} --time-to-live-specification "
               "Enabled=true,AttributeName=expires_at")
        assert "WARN ttl: not enabled (DISABLED)" in text and f"     fix: {fix}" in text
        strict = run(env, "doctor", "--table", name, "--strict")
        assert strict.returncode == 1
        ddb_client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True,
                                                                                "AttributeName": "expires_at"})
        assert run(env, "doctor", "--table", name, "--strict",
                   "--set", "IDEMPOTENCY_TTL_SECONDS=60").returncode == 1  # the wrapper warning still counts
        assert doctor({**env, "AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper"}, "--table", name,
                      "--strict", "--key-jmespath", "orderId")[0] == 0
    finally:
        ddb_client.delete_table(TableName=name)


def test_doctor_fails_on_a_wrong_key_schema_with_the_fix(env, ddb_client):
    name = f"pk-{os.getpid()}"
    create_table(ddb_client, name, key_attr="pk")
    try:
        status, checks, text = doctor(env, "--table", name)
        assert status == 1
        assert checks["key schema"]["status"] == "FAIL"
        assert "FAIL key schema: the table has pk (HASH, S); the settings expect id (HASH, S)" in text
        assert "fix: set IDEMPOTENCY_KEY_ATTR" in text
        assert not any(name.startswith("permission") for name in checks)  # no probe on a table that cannot serve
        assert doctor(env, "--table", name, "--key-attr", "pk")[0] == 0
    finally:
        ddb_client.delete_table(TableName=name)


def test_doctor_fails_on_a_missing_table_with_the_fix(env):
    status, checks, text = doctor(env, "--table", "no-such-table")
    assert status == 1
    assert checks["table"]["status"] == "FAIL"
    assert "FAIL table: no table 'no-such-table' in us-east-1" in text
    assert "fix: create it: aws dynamodb create-table --table-name no-such-table" in text


class Denying(ThreadingHTTPServer):
    """Forwards DynamoDB requests to DynamoDB Local, but answers AccessDeniedException to one operation, as
    DynamoDB answers a role without that permission (or `error`: another status and error type; or `body`:
    a 200 with that body, as a broken endpoint might)."""

    daemon_threads = True

    def __init__(self, upstream: str, denied: str, error: tuple[int, str] = (400, "AccessDeniedException"),
                 body: bytes | None = None) -> None:
        self.upstream = urlparse(upstream)
        self.denied = denied
        self.error = error
        self.body = body
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Forward)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __exit__(self, *exc: object) -> None:  # `with Denying(...) as proxy:` stops it, then closes its socket
        self.shutdown()
        super().__exit__(*exc)


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        server: Denying = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        operation = (self.headers.get("X-Amz-Target") or "").rpartition(".")[2]
        server.seen.append(operation)
        if operation == server.denied:
            status, kind = (200, "") if server.body is not None else server.error
            payload = server.body if server.body is not None else json.dumps({
                "__type": f"com.amazon.coral.service#{kind}",
                "message": f"User is not authorized to perform: dynamodb:{operation}"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-amz-json-1.0")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        connection = http.client.HTTPConnection(server.upstream.hostname, server.upstream.port, timeout=10)
        connection.request("POST", self.path, body, {k: v for k, v in self.headers.items()})
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.parametrize("operation", ["PutItem", "UpdateItem", "GetItem", "DeleteItem"])
def test_doctor_fails_on_a_role_without_one_permission(layer_env, table, ddb_client, operation):
    with Denying(layer_env.endpoint, operation) as proxy:
        env = cli_env(proxy.endpoint, table)
        status, checks, text = doctor(env)
    assert status == 1
    assert operation in proxy.seen
    for other in ("PutItem", "UpdateItem", "GetItem", "DeleteItem"):
        assert checks[f"permission {other}"]["status"] == ("FAIL" if other == operation else "PASS")
    assert f"FAIL permission {operation}: AccessDeniedException on probe key orders#doctor-probe-" in text
    assert f"fix: grant the function's role dynamodb:{operation} on table '{table}'" in text
    left = ddb_client.scan(TableName=table)["Items"]
    if operation == "DeleteItem":  # the probe could not be removed: doctor says so, and it expires on its own
        assert checks["probe record"]["status"] == "WARN"
        assert len(left) == 2  # one per run: text and --json
        assert all(entry["id"]["S"].startswith("orders#doctor-probe-") for entry in left)
        assert all(int(entry["expires_at"]["N"]) <= time.time() + 130 for entry in left)
    else:
        assert left == []


def test_access_denied_on_show_is_one_line(layer_env, table):
    with Denying(layer_env.endpoint, "GetItem") as proxy:
        done = run(cli_env(proxy.endpoint, table), "show", "orders#x")
    assert done.returncode == 1
    assert "AccessDeniedException" in one_line(done)


def test_show_purge_and_doctor_on_a_sort_key_table(layer_env, sort_key_table, ddb_client):
    attributes = Attributes(key="pk", sort_key="sk")
    store = DynamoDBStore(build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2),
                          sort_key_table, attributes, "idempotency#orders", key_prefix="fn")
    claim(store, "orders#sk-1", claim_s=-60)
    env = {**cli_env(layer_env.endpoint, sort_key_table), "IDEMPOTENCY_KEY_ATTR": "pk",
           "IDEMPOTENCY_SORT_KEY_ATTR": "sk"}
    shown = json.loads(run(env, "show", "orders#sk-1", "--json").stdout)["records"][0]
    assert (shown["key"], shown["state"]) == ("orders#sk-1", "in progress (claim expired)")
    assert run(env, "purge", "orders#sk-1", "--yes").returncode == 0
    key = {"pk": {"S": "idempotency#orders"}, "sk": {"S": "orders#sk-1"}}
    assert ddb_client.get_item(TableName=sort_key_table, Key=key, ConsistentRead=True).get("Item") is None
    done = run({**env, "AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper"}, "doctor")
    assert done.returncode == 0, done.stdout
    assert "PASS key schema: pk (HASH, S), sk (RANGE, S)" in done.stdout
    assert ddb_client.scan(TableName=sort_key_table)["Items"] == []
    wrong = run(cli_env(layer_env.endpoint, sort_key_table), "doctor")  # settings without the sort key
    assert wrong.returncode == 1
    assert ("FAIL key schema: the table has pk (HASH, S), sk (RANGE, S); the settings expect id (HASH, S)"
            in wrong.stdout)


def test_doctor_warns_when_the_layer_is_disabled(env):
    done = run({**env, "IDEMPOTENCY_DISABLED": "true", "IDEMPOTENCY_TABLE": ""}, "doctor")
    assert done.returncode == 0
    assert "WARN disabled: IDEMPOTENCY_DISABLED is true" in done.stdout
    assert "fix: unset IDEMPOTENCY_DISABLED" in done.stdout
    assert "table" not in done.stdout.split("WARN disabled")[1]  # nothing to check without a table
