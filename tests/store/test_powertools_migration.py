"""Coming from Powertools (issue 29): the real `aws-lambda-powertools` package's `@idempotent` writes its records in
the table, then the layer serves the same handler with the decorator removed, IDEMPOTENCY_POWERTOOLS_HANDLER naming
it as Powertools did. No event Powertools completed or holds runs again; executions are counted by the handler's own
side effect, requests by the proxy in front of DynamoDB Local."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent

from idempotency_layer import config as _config
from idempotency_layer.errors import IdempotencyAlreadyInProgressError, IdempotencyPayloadMismatchError
from tests.conftest import CREDENTIALS

_MARSHALLER = "awslambdaric.lambda_runtime_marshaller"
FUNCTION = "payments"
APP = '''
import threading, time

runs = []
hold = None  # a threading.Event the handler waits on, when a test sets one


def charge(event, context):
    runs.append(event["paymentId"])
    if hold is not None:
        hold.wait(30)
    return {"charged": event["amount"], "receipt": f"r-{len(runs)}", "at": time.time()}
'''


def sent(value: Any) -> Any:
    """What the runtime sends for a handler's `value`, read back: how a caller sees an answer."""
    text, _ = importlib.import_module(_MARSHALLER).LambdaMarshaller().marshal_response(value)
    return json.loads(text)


class Context:
    def __init__(self, remaining_ms: int = 30_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture
def world(tmp_path, monkeypatch, layer_env, proxy, table):
    monkeypatch.setitem(sys.modules, _MARSHALLER, importlib.import_module(_MARSHALLER))
    (tmp_path / "pt_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("pt_app", None)
    app = importlib.import_module("pt_app")
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    client = boto3.client("dynamodb", endpoint_url=layer_env.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    base = {"IDEMPOTENCY_ORIGINAL_HANDLER": "pt_app.charge", "IDEMPOTENCY_TABLE": table,
            "IDEMPOTENCY_KEY_JMESPATH": "paymentId", "IDEMPOTENCY_POWERTOOLS_HANDLER": "pt_app.charge"}
    for name, value in base.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("idempotency_layer.interceptor", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")  # for its build, as at an init

    def powertools(**options: Any) -> Any:
        """The handler as it was: Powertools' decorator on it, its records in the same table."""
        layer = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
        return idempotent(persistence_store=layer, config=IdempotencyConfig(event_key_jmespath="paymentId",
                                                                            **options))(app.charge)

    def layer(**settings: str) -> Any:
        """The handler as it is now: undecorated, under the layer."""
        for name, value in {**base, **settings}.items():
            if value:
                monkeypatch.setenv(name, value)
            else:
                monkeypatch.delenv(name, raising=False)
        return interceptor.build(_config.load(), app.charge)

    yield app, powertools, layer, proxy
    app.hold = None
    sys.modules.pop("idempotency_layer.interceptor", None)


def holding(app: Any, powertools: Any, event: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    """Powertools' decorated handler running `event` in a thread, held inside the handler (app.hold) once its
    claim is written; its answer lands in the list when it is let go."""
    app.hold = threading.Event()
    answers: list[Any] = []
    running = threading.Thread(target=lambda: answers.append(powertools()(event, Context())))
    running.start()
    deadline = time.monotonic() + 10
    while not app.runs:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return running, answers


def test_an_event_powertools_completed_is_replayed_and_kept_not_run_again(world):
    app, powertools, layer, proxy = world
    event = {"paymentId": "p-1", "amount": 42, "requestedAt": "10:00"}
    first = powertools()(event, Context())
    assert app.runs == ["p-1"]
    handler = layer()
    proxy.reset()
    retried = {**event, "requestedAt": "10:01"}  # a retry after the switch
    assert sent(handler(retried, Context())) == first  # Powertools' result, as Powertools would replay it
    assert proxy.snapshot()[0] == {"PutItem": 1, "GetItem": 1, "UpdateItem": 1}  # claim, its record, kept as ours
    proxy.reset()
    assert sent(handler(retried, Context())) == first
    assert proxy.snapshot()[0] == {"PutItem": 1}  # now the layer's own record: no read of Powertools' any more
    assert app.runs == ["p-1"]


def test_an_event_powertools_holds_is_in_progress_then_replayed(world):
    app, powertools, layer, _ = world
    event = {"paymentId": "p-2", "amount": 7}
    running, answers = holding(app, powertools, event)
    handler = layer()
    with pytest.raises(IdempotencyAlreadyInProgressError, match=r"Powertools' record 'payments\.pt_app\.charge#"):
        handler(event, Context())
    app.hold.set()
    running.join(10)
    assert sent(handler(event, Context())) == answers[0]
    assert app.runs == ["p-2"]


def test_a_payload_powertools_saw_differently_is_refused(world):
    app, powertools, layer, _ = world
    powertools(payload_validation_jmespath="amount")({"paymentId": "p-3", "amount": 5}, Context())
    handler = layer(IDEMPOTENCY_PAYLOAD_JMESPATH="amount")
    with pytest.raises(IdempotencyPayloadMismatchError, match="written for another payload"):
        handler({"paymentId": "p-3", "amount": 500}, Context())
    assert sent(handler({"paymentId": "p-3", "amount": 5}, Context()))["charged"] == 5  # the same payload replays
    assert app.runs == ["p-3"]


def test_after_powertools_expiry_or_without_the_setting_the_event_runs_again(world):
    app, powertools, layer, proxy = world
    powertools(expires_after_seconds=1)({"paymentId": "p-4", "amount": 1}, Context())
    time.sleep(2.1)  # Powertools' record expired: Powertools itself would run the event again
    assert sent(layer()({"paymentId": "p-4", "amount": 1}, Context()))["receipt"] == "r-2"
    # The window the setting closes: without it, an event Powertools completed runs again.
    powertools()({"paymentId": "p-5", "amount": 1}, Context())
    without = layer(IDEMPOTENCY_POWERTOOLS_HANDLER="")
    proxy.reset()
    answer = without({"paymentId": "p-5", "amount": 1}, Context())
    assert sent(answer)["receipt"] == "r-4"
    assert proxy.snapshot()[0] == {"PutItem": 1, "UpdateItem": 1}  # no read of Powertools' record
    assert app.runs == ["p-4", "p-4", "p-5", "p-5"]


def test_an_event_powertools_had_no_key_for_costs_no_read(world):
    app, _, layer, proxy = world
    handler = layer(IDEMPOTENCY_KEY_JMESPATH="[paymentId, orderId]")  # Powertools: a list of nulls is no key
    proxy.reset()
    handler({"paymentId": None, "orderId": None, "amount": 1}, Context())
    assert proxy.snapshot()[0] == {}  # the layer sees no key either (a pass-through): nothing read
    handler({"paymentId": "p-6", "amount": 3}, Context())
    assert proxy.snapshot()[0] == {"PutItem": 1, "GetItem": 1, "UpdateItem": 1}
    assert app.runs == [None, "p-6"]


def test_a_wait_covers_powertools_claim_too(world):
    app, powertools, layer, _ = world
    event = {"paymentId": "p-7", "amount": 9}
    running, answers = holding(app, powertools, event)
    threading.Timer(1.0, app.hold.set).start()
    answer = layer(IDEMPOTENCY_WAIT_SECONDS="10")(event, Context())  # waits for Powertools' run to complete
    running.join(10)
    assert sent(answer) == answers[0] and app.runs == ["p-7"]


def test_a_payload_check_powertools_made_and_the_layer_lacks_is_said(world, caplog):
    app, powertools, layer, _ = world
    powertools(payload_validation_jmespath="amount")({"paymentId": "p-8", "amount": 5}, Context())
    with caplog.at_level("WARNING", logger="idempotency_layer"):
        layer()({"paymentId": "p-8", "amount": 5}, Context())
    assert "set IDEMPOTENCY_PAYLOAD_JMESPATH to Powertools' payload_validation_jmespath" in caplog.text
    assert app.runs == ["p-8"]
