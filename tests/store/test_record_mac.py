"""Record authentication (IDEMPOTENCY_RECORD_MAC_KEY, the security review's T2.1) on every store: the review's
forgeries (E2 1-3, E2b) planted as an attacker with write access to the store would, and legitimate records
changed, copied and rotated. The handler's runs are counted by the test's own list, S3 requests by a listener's
own count of the connections it accepted; the planting goes through the store's protocol, as anyone who can write
the store can write it."""

from __future__ import annotations

import base64
import importlib
import json
import os
import sys
import time
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer import config as _config
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import plan
from idempotency_layer.stores.protocol import COMPLETED
from tests.support.events import json_message, sqs_event
from tests.support.http_events import v2
from tests.support.inprocess import Context
from tests.support.raw_server import RawServer

KEYS = {"MAC_KEY_NEW": os.urandom(32).hex(), "MAC_KEY_OLD": os.urandom(24).hex()}
FORGED = {"charged": 0, "refund_to": "attacker-iban"}
EVIL = {"statusCode": 302, "headers": {"Location": "https://evil.example/login", "Set-Cookie": "session=attacker"},
        "body": ""}


@pytest.fixture
def interceptor(tmp_path, monkeypatch, layer_env):
    """The interceptor module, imported disabled (its import builds nothing), with the keys in the environment."""
    (tmp_path / "mac_app.py").write_text("def handler(event, context):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, value in {"IDEMPOTENCY_ORIGINAL_HANDLER": "mac_app.handler", "IDEMPOTENCY_DISABLED": "true",
                        **KEYS}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "awslambdaric.lambda_runtime_marshaller", raising=False)
    sys.modules.pop("idempotency_layer.interceptor", None)
    yield importlib.import_module("idempotency_layer.interceptor")
    sys.modules.pop("idempotency_layer.interceptor", None)


class Function:
    """A function built on `store` with `settings`; `runs`: what its handler body was called with."""

    def __init__(self, interceptor: Any, store: Any, keys: str | None, user: Any = None, **settings: str) -> None:
        env = {"IDEMPOTENCY_ORIGINAL_HANDLER": "mac_app.handler", "IDEMPOTENCY_TABLE": "records",
               "AWS_LAMBDA_FUNCTION_NAME": "orders", **settings}
        if keys is not None:
            env["IDEMPOTENCY_RECORD_MAC_KEY"] = keys
        self.config = _config.load(env)
        self.runs: list[Any] = []
        self.user = user or (lambda event, context: {"charged": 500})
        self.handler = interceptor.build(self.config, self._call, store=store)

    def _call(self, event: Any, context: Any) -> Any:
        self.runs.append(event)
        return self.user(event, context)

    def __call__(self, event: Any) -> Any:
        return self.handler(event, Context())

    def keys_of(self, event: Any) -> list[str]:
        config = self.config
        found = plan(config, KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath), event)
        return [unit.key for unit in found.units]


ON = "env:MAC_KEY_NEW,env:MAC_KEY_OLD"


def plant(store: Any, key: str, result: codec.Encoded, *, owner: str = "attacker", mac: str | None = None,
          fingerprint: str | None = None, expires_at: int | None = None) -> None:
    """A completed record written under `key` as anyone with write access writes one (what was there first is
    deleted, as such a writer can)."""
    there = store.get(key)
    if there is not None:
        assert store.purge(key, there.status, there.owner)
    now = time.time()
    expires_at = expires_at or int(now) + 3600
    assert store.claim(key, owner, now, int(now * 1000) + 60_000, expires_at, fingerprint) is None
    assert store.complete(key, owner, result, expires_at, seal=None if mac is None else (lambda _: mac))


def current(function: Function) -> str:
    """The key id `function` seals with (however the reader turned the variable's text into the key)."""
    return function.handler.cycle.mac.current


def bogus_mac(function: Function) -> str:
    """A MAC under the current key's id that the attacker, without the key, can only guess."""
    return f"{current(function)}:{base64.b64encode(os.urandom(32)).decode()}"


@pytest.mark.parametrize("mac", [None, "bogus"])
def test_a_forged_whole_event_answer_raises_and_nothing_runs(interceptor, store, mac):
    event = {"orderId": "o-77", "amount": 500}
    function = Function(interceptor, store, ON)
    [key] = function.keys_of(event)
    plant(store, key, codec.Encoded(codec.JSON, json.dumps(FORGED)), mac=None if mac is None else bogus_mac(function))
    assert Function(interceptor, store, None)(event) == FORGED  # without the setting, the forgery works (E2 1)
    with pytest.raises(IdempotencyPersistenceLayerError) as raised:
        function(event)
    assert raised.value.permanent and "failed its authentication" in str(raised.value)
    assert "attacker" not in str(raised.value) and function.runs == []


def test_a_forged_http_redirect_with_a_cookie_is_answered_503(interceptor, store, caplog):
    request = v2("POST", "/orders", {"Idempotency-Key": "k-42"}, "{}")
    scratch = v2("POST", "/orders", {"Idempotency-Key": "scratch"}, "{}")
    # The form the layer stores an HTTP answer in, as the attacker computes it (shared: a cookie response to an
    # anonymous caller is stored only so, since IDEMPOTENCY_HTTP_ANONYMOUS).
    plain = Function(interceptor, store, None, user=lambda event, context: EVIL, IDEMPOTENCY_HTTP_ANONYMOUS="shared")
    plain(scratch)
    stored = store.get(plain.keys_of(scratch)[0]).result
    function = Function(interceptor, store, ON)
    [key] = function.keys_of(request)
    plant(store, key, stored)
    replayed = Function(interceptor, store, None)(request)
    assert replayed["statusCode"] == 302 and "session=attacker" in json.dumps(replayed)  # E2 2, without the setting
    caplog.clear()
    answer = function(request)
    assert answer["statusCode"] == 503 and "attacker" not in json.dumps(answer) and "evil" not in json.dumps(answer)
    assert function.runs == []
    said = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(said) == 1 and "failed its authentication" in said[0].getMessage()  # one line, the key alone
    assert "attacker" not in caplog.text and "evil" not in caplog.text


@pytest.fixture
def s3(monkeypatch):
    listener = RawServer(lambda conn: conn.close())  # standing for S3: it counts the connections made to it
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", listener.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    yield listener
    listener.close()


def test_a_forged_large_result_pointer_makes_no_s3_request(interceptor, store, s3):
    event = {"orderId": "o-88"}
    settings = {"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "results-bucket", "IDEMPOTENCY_READ_TIMEOUT": "1",
                "IDEMPOTENCY_CONNECT_TIMEOUT": "1"}
    function = Function(interceptor, store, ON, **settings)
    [key] = function.keys_of(event)
    body = b'{"payroll": true}'
    pointer = {"bucket": "results-bucket", "key": f"idempotency-results/{key}/{'a' * 32}", "size": len(body),
               "sha256": __import__("hashlib").sha256(body).hexdigest()}
    plant(store, key, codec.Encoded(codec.STORED + codec.JSON, json.dumps(pointer)), mac=bogus_mac(function))
    with pytest.raises(IdempotencyPersistenceLayerError):
        function(event)
    assert s3.accepted == 0 and function.runs == []
    # The listener does count: without the setting the pointer is followed (and fails, the listener closing).
    with pytest.raises(IdempotencyPersistenceLayerError):
        Function(interceptor, store, None, **settings)(event)
    assert s3.accepted >= 1


@pytest.mark.parametrize("redelivered", [False, True])
def test_a_forged_done_record_of_an_sqs_message_is_reported_failed_never_dropped(interceptor, store, redelivered):
    messages = [json_message({"n": n}) for n in range(3)]
    function = Function(interceptor, store, ON, user=lambda event, context: None,
                        IDEMPOTENCY_BATCH_PRECHECK="always" if redelivered else "never")
    forged = messages[1]
    [key] = function.keys_of(sqs_event([forged]))
    plant(store, key, codec.Encoded(codec.DONE, None), mac=bogus_mac(function))
    if redelivered:  # the other two are done for real: answered by the pre-check's one read
        Function(interceptor, store, ON)(sqs_event([messages[0], messages[2]]))
    answer = function(sqs_event(messages))
    assert answer == {"batchItemFailures": [{"itemIdentifier": forged.message_id}]}
    ran = [record["messageId"] for event in function.runs for record in event["Records"]]
    assert forged.message_id not in ran
    assert ran == ([] if redelivered else [messages[0].message_id, messages[2].message_id])
    # Without the setting the forgery would drop it silently (E2b): SQS deletes what is not reported.
    assert Function(interceptor, store, None)(sqs_event([forged])) == {"batchItemFailures": []}


def test_a_legitimate_record_flipped_by_one_bit_is_refused(interceptor, store):
    event = {"orderId": "o-1", "amount": 7}
    function = Function(interceptor, store, ON)
    assert function(event) == {"charged": 500} and function(event) == {"charged": 500} and len(function.runs) == 1
    [key] = function.keys_of(event)
    record = store.get(key)
    assert record.mac.startswith(current(function) + ":")
    data = bytearray(record.result.data.encode() if isinstance(record.result.data, str) else record.result.data)
    data[-2] ^= 1  # '{"charged":500}' -> '{"charged":501}'
    plant(store, key, codec.Encoded(record.result.format, bytes(data)), owner=record.owner, mac=record.mac,
          expires_at=record.expires_at, fingerprint=record.fingerprint)
    with pytest.raises(IdempotencyPersistenceLayerError):
        function(event)
    assert len(function.runs) == 1


def test_a_legitimate_record_copied_to_another_key_is_refused(interceptor, store):
    paid, other = {"orderId": "o-paid"}, {"orderId": "o-other"}
    function = Function(interceptor, store, ON)
    function(paid)
    record = store.get(function.keys_of(paid)[0])
    plant(store, function.keys_of(other)[0], record.result, owner=record.owner, mac=record.mac,
          expires_at=record.expires_at, fingerprint=record.fingerprint)
    with pytest.raises(IdempotencyPersistenceLayerError):
        function(other)
    assert len(function.runs) == 1


def test_a_record_of_the_previous_key_is_accepted_while_configured_and_refused_after(interceptor, store):
    event = {"orderId": "o-rotated"}
    before = Function(interceptor, store, "env:MAC_KEY_OLD")
    before(event)
    assert store.get(before.keys_of(event)[0]).mac.startswith(current(before) + ":")
    during = Function(interceptor, store, ON)
    assert during(event) == {"charged": 500} and during.runs == []  # replayed under the previous key
    after = Function(interceptor, store, "env:MAC_KEY_NEW")
    with pytest.raises(IdempotencyPersistenceLayerError, match="is not configured"):
        after(event)
    assert after.runs == [] and len(before.runs) == 1


def test_a_record_without_a_mac_is_refused_when_the_setting_is_on(interceptor, store, caplog):
    event = {"orderId": "o-unsealed", "amount": 3}
    Function(interceptor, store, None)(event)  # completed before the setting was turned on
    function = Function(interceptor, store, ON, IDEMPOTENCY_METRICS="emf")
    with pytest.raises(IdempotencyPersistenceLayerError, match="it has no mac"):
        function(event)
    refused = [r for r in caplog.records if "failed its authentication" in r.getMessage()]
    assert len(refused) == 1 and refused[0].idempotency_key == function.keys_of(event)[0]
    assert "500" not in caplog.text and function.runs == []


def test_the_metric_counts_each_refusal(interceptor, store, capsys):
    event = {"orderId": "o-counted"}
    function = Function(interceptor, store, ON, IDEMPOTENCY_METRICS="emf")
    plant(store, function.keys_of(event)[0], codec.Encoded(codec.JSON, json.dumps(FORGED)))
    capsys.readouterr()
    with pytest.raises(IdempotencyPersistenceLayerError):
        function(event)
    [document] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert document["RecordIntegrityFailures"] == 1 and function.runs == []


def test_a_batch_sealed_with_a_fingerprint_replays_through_the_precheck_and_the_claim(interceptor, store):
    # The fingerprint the MAC covers is the claim's, at every completion (a batch's records too).
    messages = [json_message({"n": n, "amount": n}) for n in range(3)]
    function = Function(interceptor, store, ON, user=lambda event, context: None,
                        IDEMPOTENCY_PAYLOAD_JMESPATH="body", IDEMPOTENCY_BATCH_PRECHECK="always")
    assert function(sqs_event(messages)) is None  # the handler's own answer
    record = store.get(function.keys_of(sqs_event(messages[:1]))[0])
    assert record.status == COMPLETED and record.fingerprint and record.mac
    assert function(sqs_event(messages)) == {"batchItemFailures": []}  # the pre-check's read
    assert function(sqs_event(messages[:1])) == {"batchItemFailures": []}  # one record: its claim
    assert len(function.runs) == 1


def test_a_durable_executions_forged_result_is_refused_and_its_own_record_replays(store):
    # What the executor asks of the cycle for a durable execution (IDEMPOTENCY_DURABLE=execution): `take`, the
    # execution's ARN as the owner. A planted record, even one naming that owner, is refused before any use.
    from idempotency_layer.cycle import Cycle, Found
    from idempotency_layer.invocation import Invocation
    from idempotency_layer.record_mac import RecordMac

    cycle = Cycle(store, ttl_seconds=3600, mac=RecordMac([os.urandom(32)], store.identity))
    execution = "arn:aws:lambda:us-east-1:123456789012:function:orders:$LATEST/durable-execution/run/1"
    plant(store, "orders#durable-forged", codec.Encoded(codec.JSON, json.dumps(FORGED)), owner=execution)
    with pytest.raises(IdempotencyPersistenceLayerError, match="it has no mac"):
        cycle.take(Invocation(30_000), "orders#durable-forged", owner=execution)
    claimed = cycle.take(Invocation(30_000), "orders#durable-own", owner=execution)
    assert cycle.complete(Invocation(30_000), "orders#durable-own", claimed.owner,
                          codec.Encoded(codec.JSON, '"SUCCEEDED"'))
    found = cycle.take(Invocation(30_000), "orders#durable-own", owner="arn:another-execution")
    assert isinstance(found, Found) and found.record.result.data in ('"SUCCEEDED"', b'"SUCCEEDED"')


def test_a_forged_record_under_an_http_requests_previous_key_is_refused(interceptor, store):
    # The previous-key consult (IDEMPOTENCY_HTTP_PREVIOUS_KEYS=consult) reads a completed record too: it is
    # authenticated before it is decoded, like the record under the request's own key.
    request = v2("POST", "/orders", {"Idempotency-Key": "k-previous"}, "{}")
    scratch = v2("POST", "/orders", {"Idempotency-Key": "scratch-previous"}, "{}")
    plain = Function(interceptor, store, None, user=lambda event, context: {"statusCode": 200, "body": "forged"})
    plain(scratch)
    stored = store.get(plain.keys_of(scratch)[0]).result
    function = Function(interceptor, store, ON, user=lambda event, context: {"statusCode": 201, "body": "fresh"})
    config = function.config
    [unit] = plan(config, KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath), request).units
    assert unit.previous is not None and unit.previous != unit.key
    plant(store, unit.previous, stored)
    answer = function(request)
    assert answer["statusCode"] == 503 and "forged" not in json.dumps(answer) and function.runs == []
    # Our claim on the new key was released, and the plant is really read by the consult: without the setting, a
    # function replays it (as the previous version's record it pretends to be).
    control = Function(interceptor, store, None, user=lambda event, context: {"statusCode": 201, "body": "fresh"})
    assert control(request)["body"] == "forged" and control.runs == []
