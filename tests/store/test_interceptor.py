"""The interceptor in-process, against DynamoDB Local: requests per path counted on the wire.

The end-to-end tests run the same module under the real runtime; here each configuration gets a fresh import
of the interceptor (it reads its settings at import, as at a function's init), as the runtime imports it.
"""

import importlib
import sys
import time
import traceback

import pytest

from idempotency_layer.errors import IdempotencyConfigurationError, IdempotencyKeyError

HANDLER = """
import os

def handler(event, context):
    with open(os.environ["RUNS_FILE"], "a") as runs:
        runs.write("run\\n")
    if event.get("fail"):
        raise ValueError("declined: " + event["fail"])
    event.pop("orderId", None)  # a handler that mutates its event
    return {"order": "placed", "n": event.get("n")}
"""


class Context:
    def get_remaining_time_in_millis(self):
        return 30_000


@pytest.fixture
def load(tmp_path, monkeypatch, layer_env, proxy, table):
    (tmp_path / "orders_app.py").write_text(HANDLER)
    runs = tmp_path / "runs"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RUNS_FILE", str(runs))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders")
    # No runtime here: its marshaller must not be found in sys.modules, whatever other tests imported.
    monkeypatch.delitem(sys.modules, "awslambdaric.lambda_runtime_marshaller", raising=False)

    def load_interceptor(**settings):
        env = {"IDEMPOTENCY_ORIGINAL_HANDLER": "orders_app.handler", "IDEMPOTENCY_TABLE": table, **settings}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        sys.modules.pop("idempotency_layer.interceptor", None)
        sys.modules.pop("orders_app", None)
        module = importlib.import_module("idempotency_layer.interceptor")
        proxy.reset()
        return module

    load_interceptor.runs = lambda: len(runs.read_text().splitlines()) if runs.exists() else 0
    yield load_interceptor
    sys.modules.pop("idempotency_layer.interceptor", None)


def test_requests_and_runs_per_path(load, proxy):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId")
    first = interceptor.handler({"orderId": "o-1", "n": 1}, Context())
    assert proxy.snapshot()[0] == {"PutItem": 1, "UpdateItem": 1}
    proxy.reset()
    replay = interceptor.handler({"orderId": "o-1", "n": 1}, Context())
    assert proxy.snapshot()[0] == {"PutItem": 1}
    assert first == replay == {"order": "placed", "n": 1}
    assert load.runs() == 1


def test_local_cache_hit_makes_one_read(load, proxy):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_LOCAL_CACHE_SIZE="8")
    interceptor.handler({"orderId": "o-2"}, Context())
    proxy.reset()
    assert interceptor.handler({"orderId": "o-2"}, Context()) == {"order": "placed", "n": None}
    assert proxy.snapshot()[0] == {"GetItem": 1}  # a read that carries no result, no claim
    assert load.runs() == 1


def test_no_key_passes_through_without_requests(load, proxy, caplog):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId")
    with caplog.at_level("WARNING", logger="idempotency_layer"):
        interceptor.handler({"n": 1}, Context())
        interceptor.handler({"n": 1}, Context())
    assert proxy.total() == 0
    assert load.runs() == 2
    assert "selected nothing" in caplog.text


def test_required_key_refuses_without_running(load, proxy):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_REQUIRE_KEY="true")
    with pytest.raises(IdempotencyKeyError, match="IDEMPOTENCY_REQUIRE_KEY is true"):
        interceptor.handler({"n": 1}, Context())
    assert proxy.total() == 0
    assert load.runs() == 0


def test_disabled_calls_the_handler_itself(load, proxy):
    interceptor = load(IDEMPOTENCY_DISABLED="true")
    assert interceptor.handler is sys.modules["orders_app"].handler
    interceptor.handler({"orderId": "o-3"}, Context())
    interceptor.handler({"orderId": "o-3"}, Context())
    assert proxy.total() == 0
    assert load.runs() == 2


def test_handler_error_is_reraised_as_is_and_released(load, proxy):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId")
    with pytest.raises(ValueError, match="declined: card") as caught:
        interceptor.handler({"orderId": "o-4", "fail": "card"}, Context())
    assert proxy.snapshot()[0] == {"PutItem": 1, "DeleteItem": 1}
    frames = traceback.extract_tb(caught.value.__traceback__)
    # The test's frame, the interceptor's one frame, then the user's: none of the cycle's.
    assert [f.name for f in frames][1:] == ["handler", "handler"]
    assert "idempotency_layer" in frames[1].filename
    assert frames[-1].filename.endswith("orders_app.py")
    interceptor.handler({"orderId": "o-4"}, Context())
    assert load.runs() == 2


def test_bad_setting_fails_the_import(load):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_TTL_SECONDS='soon'"):
        load(IDEMPOTENCY_TTL_SECONDS="soon")


def test_missing_context_deadline_claims_for_the_longest_invocation(load, ddb_client, table):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId")
    seen = {}

    def peek(event, context):
        item = ddb_client.scan(TableName=table)["Items"][0]
        seen["until"] = int(item["in_progress_until"]["N"])
        return 1

    handler = interceptor.build(interceptor.CONFIG, peek)  # the module's settings, another handler
    now_ms = int(time.time() * 1000)
    handler({"orderId": "o-5"}, None)
    assert now_ms + 890_000 < seen["until"] < now_ms + 910_000



def test_no_region_is_a_configuration_error(load, monkeypatch, tmp_path):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    with pytest.raises(IdempotencyConfigurationError, match=r"NoRegionError.*AWS_REGION"):
        load()


def test_log_level_setting_silences_warnings(load, caplog):
    interceptor = load(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_LOG_LEVEL="ERROR")
    with caplog.at_level("DEBUG"):
        interceptor.handler({"n": 1}, Context())
    assert "selected nothing" not in caplog.text
    assert load.runs() == 1
