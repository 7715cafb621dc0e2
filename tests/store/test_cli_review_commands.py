"""The hostile review's findings on the CLI, against DynamoDB Local (and moto's server for the Lambda and SQS
APIs), run as a subprocess the way an operator runs it: container wrapper paths, functions that cannot work,
stalled endpoints, transient errors in the permission probe, malformed answers and items, Ctrl-D at purge's
prompt, control characters in stored attributes and non-finite results."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from idempotency_layer import codec
from idempotency_layer.cli import records
from tests.store import test_cli_commands as _commands
from tests.store import test_cli_doctor_function as _function_tests
from tests.store.test_cli_commands import Denying, claim, cli_env, doctor, item, one_line, run
from tests.store.test_cli_doctor_function import _zip, client, doctor_env
from tests.support.events import json_message, sqs_event

deployed = _function_tests.deployed  # the module-scoped fixture: IAM role, layer, queues (its own moto here)


env = _commands.env  # the fixtures: the CLI's environment on DynamoDB Local, and the layer's store there
store = _commands.store


# -- 1. the wrapper where a container image puts it ---------------------------------------------------------

@pytest.mark.parametrize(("wrapper", "status"), [
    ("/var/lang/bin/idempotency-wrapper", "PASS"),  # an AWS base image, pip install of the wheel
    ("/var/task/bin/idempotency-wrapper", "PASS"),  # pip install --target /var/task
    ("/opt/idempotency-wrapper", "PASS"),  # the layer
    ("idempotency-wrapper", "FAIL"),  # not absolute: Lambda cannot exec it
    ("/opt/other-wrapper", "FAIL"),
])
def test_local_doctor_accepts_any_installed_wrapper(env, wrapper, status):
    code, checks, text = doctor({**env, "AWS_LAMBDA_EXEC_WRAPPER": wrapper})
    assert checks["wrapper"]["status"] == status, text
    assert code == (0 if status == "PASS" else 1), text


# -- 3. a stalled endpoint ends in one FAIL line, within seconds ---------------------------------------------

@pytest.fixture
def stalled():
    """A loopback server that accepts connections (the kernel's backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_doctor_function_on_a_stalled_lambda_endpoint(env, stalled):
    started = time.monotonic()
    done = run({**env, "AWS_ENDPOINT_URL_LAMBDA": stalled}, "doctor", "--function", "orders")
    took = time.monotonic() - started
    assert done.returncode == 1
    assert took < 28, took  # two attempts of a 10 s read, not three (nor botocore's default 60 s reads)
    fails = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert fails == ["FAIL function: could not read function 'orders': ReadTimeoutError"], done.stdout
    assert "fix: the Lambda endpoint did not answer; retry doctor" in done.stdout
    assert "credentials" not in done.stdout and done.stderr == ""


def _function(lam, name: str, role: str, queue_arn: str, table: str) -> None:
    lam.create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="app.handler",
                        Code={"ZipFile": _zip()}, Timeout=30, Environment={"Variables": {"IDEMPOTENCY_TABLE": table}})
    lam.create_event_source_mapping(FunctionName=name, EventSourceArn=queue_arn, BatchSize=10,
                                    FunctionResponseTypes=["ReportBatchItemFailures"])


def test_doctor_function_on_a_stalled_sqs_endpoint_and_a_queue_that_is_gone(moto, deployed, layer_env, table,
                                                                          stalled):
    sqs, lam = client(moto, "sqs"), deployed["lambda"]
    url = sqs.create_queue(QueueName="orders-gone-q")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    _function(lam, "orders-gone", deployed["role"], arn, table)
    sqs.delete_queue(QueueUrl=url)
    gone = run(doctor_env(moto, layer_env, table), "doctor", "--function", "orders-gone")
    assert gone.returncode == 1
    assert f"the mapping's queue {arn} does not exist (" in gone.stdout, gone.stdout
    assert "fix: delete the mapping, or create the queue again" in gone.stdout
    assert "sqs:GetQueue" not in gone.stdout  # not a credentials or permission fix

    _function(lam, "orders-stalled-sqs", deployed["role"], deployed["good_queue"], table)
    started = time.monotonic()
    done = run({**doctor_env(moto, layer_env, table), "AWS_ENDPOINT_URL_SQS": stalled},
               "doctor", "--function", "orders-stalled-sqs")
    assert time.monotonic() - started < 28
    assert done.returncode == 1
    assert "the queue's attributes could not be read (ReadTimeoutError)" in done.stdout, done.stdout
    assert "fix: the SQS endpoint did not answer; retry doctor" in done.stdout
    assert "sqs:GetQueue" not in done.stdout
    assert done.stderr == ""


# -- 2. functions that cannot work ---------------------------------------------------------------------------

def test_doctor_function_checks_runtime_architecture_and_next_wrapper(moto, deployed, layer_env, table):
    lam = deployed["lambda"]
    lam.create_function(FunctionName="orders-arm", Runtime="python3.9", Role=deployed["role"], Handler="app.handler",
                        Code={"ZipFile": _zip()}, Timeout=30, Layers=[deployed["layer"]], Architectures=["arm64"],
                        Environment={"Variables": {"IDEMPOTENCY_TABLE": table,
                                                   "AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper",
                                                   "IDEMPOTENCY_NEXT_WRAPPER": "bin/next"}})
    done = run(doctor_env(moto, layer_env, table), "doctor", "--function", "orders-arm")
    assert done.returncode == 1
    out = done.stdout
    assert "FAIL runtime: python3.9: the layer supports python3.10 to python3.14" in out
    assert "FAIL architecture: the function runs on arm64, the layer idempotency-layer-x86_64 is built for " \
           "x86_64" in out
    assert "fix: attach the idempotency-layer-arm64 layer's version ARN" in out
    assert "FAIL next wrapper: IDEMPOTENCY_NEXT_WRAPPER='bin/next' is not an absolute path" in out


# -- 4. the probe blames permissions only for a refusal --------------------------------------------------------

@pytest.mark.parametrize("error", [(400, "ProvisionedThroughputExceededException"), (500, "InternalServerError")])
def test_a_transient_error_in_the_probe_is_not_a_permission_fix(layer_env, table, error):
    with Denying(layer_env.endpoint, "PutItem", error=error) as proxy:
        done = run(cli_env(proxy.endpoint, table), "doctor")
    assert done.returncode == 1
    assert f"FAIL permission PutItem: could not be proven ({error[1]}) on probe key orders#doctor-probe-" \
           in done.stdout, done.stdout
    assert f"fix: the table answered {error[1]}: retry doctor" in done.stdout
    assert "grant the function's role dynamodb:PutItem" not in done.stdout


# -- 5. answers and items doctor, show and purge cannot read: one line, never a traceback ---------------------

@pytest.mark.parametrize("body", [b'{"Table":{"KeySchema":"nope"}}', b'{"Item":"nope"}', b'{"Table":null}'])
def test_doctor_on_a_malformed_describe_table(layer_env, table, body):
    with Denying(layer_env.endpoint, "DescribeTable", body=body) as proxy:
        done = run(cli_env(proxy.endpoint, table), "doctor")
    assert done.returncode == 1
    assert "FAIL table: DescribeTable's answer is not one this doctor can read" in done.stdout, done.stdout
    assert done.stderr == ""


def test_show_and_purge_a_time_beyond_the_calendar(env, ddb_client, table):
    huge = "99999999999999999999"
    ddb_client.put_item(TableName=table, Item={"id": {"S": "orders#far"}, "status": {"S": "INPROGRESS"},
                                               "expires_at": {"N": huge}, "in_progress_until": {"N": huge},
                                               "owner": {"S": "o-1"}})
    done = run(env, "show", "orders#far")
    assert done.returncode == 0, done.stderr
    assert f"expires:           {huge} (out of range)" in done.stdout
    assert f"in progress until: {huge} (out of range)" in done.stdout
    shown = json.loads(run(env, "show", "orders#far", "--json").stdout)["records"][0]
    assert shown["expires_at"] == {"utc": None, "epoch": int(huge), "relative": None, "out_of_range": True}
    refused = run(env, "purge", "orders#far", "--yes")
    assert refused.returncode == 1
    assert f"is claimed by a live invocation until {huge} (out of range)" in one_line(refused)


def test_purge_prompt_answered_with_end_of_file_deletes_nothing(store, ddb_client, table):
    claim(store, "orders#eof", claim_s=-60)

    def ctrl_d(prompt: str) -> str:
        raise EOFError

    with pytest.raises(records.Refused, match="not deleted: key 'orders#eof'"):
        records.purge(store, "orders#eof", yes=False, force=False, ask=ctrl_d)
    assert item(ddb_client, table, "orders#eof") is not None


def test_an_item_that_is_not_a_layer_record(env, ddb_client, table):
    ddb_client.put_item(TableName=table, Item={"id": {"S": "orders#foreign"}, "status": {"S": "whatever"}})
    for args in (("show", "orders#foreign"), ("purge", "orders#foreign", "--yes")):
        done = run(env, *args)
        assert done.returncode == 1
        line = one_line(done)
        assert "is not an idempotency record" in line and "it is not a record of this layer" in line, line
        assert "the handler did not run" not in line
    assert item(ddb_client, table, "orders#foreign") is not None


# -- 9. what show writes: escaped attributes, JSON without NaN --------------------------------------------------

def test_show_escapes_control_characters_in_attributes(env, ddb_client, table):
    owner = "o-1\nkey:               forged\x1b[2J"
    ddb_client.put_item(TableName=table, Item={"id": {"S": "orders#ctl"}, "status": {"S": "INPROGRESS"},
                                               "expires_at": {"N": str(int(time.time()) + 3600)},
                                               "in_progress_until": {"N": str(int(time.time() * 1000) + 60_000)},
                                               "owner": {"S": owner}})
    done = run(env, "show", "orders#ctl")
    assert done.returncode == 0
    assert "\x1b" not in done.stdout and "\nkey:               forged" not in done.stdout
    assert "owner:             o-1\\nkey:               forged\\x1b[2J" in done.stdout
    assert json.loads(run(env, "show", "orders#ctl", "--json").stdout)["records"][0]["owner"] == owner


def test_show_result_json_writes_non_finite_numbers_as_strings(env, store):
    claim(store, "orders#nan")
    value = {"nan": float("nan"), "up": float("inf"), "down": [float("-inf"), 1.5]}
    assert store.complete("orders#nan", "o-1", codec.encode(value), int(time.time()) + 3600)
    done = run(env, "show", "orders#nan", "--json", "--result")
    assert done.returncode == 0
    assert "NaN," not in done.stdout.replace('"NaN"', "")
    decoded = json.loads(done.stdout, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert decoded["records"][0]["result"] == {"value": {"nan": "NaN", "up": "Infinity",
                                                         "down": ["-Infinity", 1.5]}}


def test_doctor_function_refuses_a_blank_name(env):
    for name in ("", "   "):
        done = run(env, "doctor", "--function", name)
        assert done.returncode == 2
        assert "doctor --function: the function name is empty" in one_line(done)


# -- round 2 of the review ----------------------------------------------------------------------------------------

class _Endpoint:
    """A loopback endpoint that answers each connection with `answer(connection)`, on a thread per connection."""

    def __init__(self, answer) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            connection.recv(65536)
            self.answer(connection, self.closed)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


def _trickle(connection: socket.socket, closed: threading.Event) -> None:
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    while not closed.wait(0.5):  # a byte every half second: no single read ever times out
        connection.sendall(b" ")


def _html(connection: socket.socket, closed: threading.Event) -> None:
    body = b"<html><body>not lambda</body></html>"
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body))


def test_doctor_function_on_a_trickling_lambda_endpoint_ends(env, monkeypatch, capsys):
    from idempotency_layer import cli
    from idempotency_layer.cli import doctor as _doctor

    monkeypatch.setattr(_doctor, "CALL_SECONDS", 3)  # the bound on a whole call (30 s in use)
    endpoint = _Endpoint(_trickle)
    try:
        for name, value in {**env, "AWS_ENDPOINT_URL_LAMBDA": endpoint.url}.items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        code = cli.main(["doctor", "--function", "orders"])
        took = time.monotonic() - started
    finally:
        endpoint.close()
    out = capsys.readouterr().out
    assert code == 1 and took < 10, (code, took)
    assert "FAIL function: could not read function 'orders': TimeoutError" in out, out
    assert "fix: the Lambda endpoint did not answer; retry doctor" in out


def test_doctor_function_on_an_endpoint_that_is_not_lambda(env):
    endpoint = _Endpoint(_html)
    try:
        done = run({**env, "AWS_ENDPOINT_URL_LAMBDA": endpoint.url}, "doctor", "--function", "orders")
    finally:
        endpoint.close()
    assert done.returncode == 1
    assert done.stdout.splitlines()[:2] == [
        "FAIL function: GetFunctionConfiguration's answer is not one this doctor can read (not a Lambda answer)",
        "     fix: check the endpoint (AWS_ENDPOINT_URL_LAMBDA / AWS_ENDPOINT_URL) and the Region: it should be "
        "Lambda's; the function itself was not checked"], done.stdout
    assert "PASS" not in done.stdout and done.stderr == ""


_DESCRIPTION = {"TableName": "t", "TableStatus": "ACTIVE", "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
                "AttributeDefinitions": [{"AttributeName": "id", "AttributeType": "S"}]}


@pytest.mark.parametrize(("table_fields", "line"), [
    ({"TableName": 5}, "FAIL table: DescribeTable's answer is not one this doctor can read"),
    ({"KeySchema": [{"AttributeName": 1, "KeyType": "HASH"}]},
     "FAIL table: DescribeTable's answer is not one this doctor can read"),
    ({"TableStatus": "DELETING"}, "FAIL table: t is DELETING: the layer's requests fail"),
    ({"TableStatus": "INACCESSIBLE_ENCRYPTION_CREDENTIALS"},
     "FAIL table: t is INACCESSIBLE_ENCRYPTION_CREDENTIALS: the layer's requests fail"),
    ({"TableStatus": "CREATING"}, "WARN table: t is still being created"),
])
def test_doctor_reads_describe_table_strictly(layer_env, table, table_fields, line):
    body = json.dumps({"Table": {**_DESCRIPTION, **table_fields}}).encode()
    with Denying(layer_env.endpoint, "DescribeTable", body=body) as proxy:
        done = run(cli_env(proxy.endpoint, table), "doctor")
    assert line in done.stdout, done.stdout
    assert done.returncode == (1 if line.startswith("FAIL") else 0) and done.stderr == ""
    if line.startswith("FAIL"):
        assert "PASS permission" not in done.stdout  # no probe of a table the layer cannot use


def test_doctor_on_a_table_whose_key_is_a_number(layer_env, ddb_client):
    name = f"numeric-{uuid.uuid4().hex[:8]}"
    ddb_client.create_table(TableName=name, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "N"}],
                            BillingMode="PAY_PER_REQUEST")
    ddb_client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
    try:
        done = run(cli_env(layer_env.endpoint, name), "doctor")
    finally:
        ddb_client.delete_table(TableName=name)
    assert "FAIL key schema: the table has id (HASH, N); the layer's keys are strings" in done.stdout, done.stdout
    assert "fix: use a table whose key attributes are strings (AttributeType S): id (HASH, S)" in done.stdout
    assert "WARN ttl: enabled on 'ttl', not on 'expires_at'" in done.stdout  # checked after a schema FAIL too
    assert "permission" not in done.stdout and done.returncode == 1


def test_a_probe_left_by_a_transient_error_is_not_a_permission_fix(layer_env, table):
    with Denying(layer_env.endpoint, "DeleteItem", error=(500, "InternalServerError")) as proxy:
        done = run(cli_env(proxy.endpoint, table), "doctor")
    assert "FAIL permission DeleteItem: could not be proven (InternalServerError)" in done.stdout, done.stdout
    assert "WARN probe record:" in done.stdout and "fix: nothing to do: it expires" in done.stdout
    assert "dynamodb:DeleteItem" not in done.stdout


def test_a_reader_that_goes_away_ends_the_cli_quietly(env, tmp_path):
    messages = [json_message({"orderId": n}) for n in range(400)]  # more output than a pipe's buffer
    path = tmp_path / "sqs.json"
    path.write_text(json.dumps(sqs_event(messages)))
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before the first write
    try:
        done = subprocess.run([sys.executable, "-m", "idempotency_layer", "key", "--event", str(path)], env=env,
                              stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""
