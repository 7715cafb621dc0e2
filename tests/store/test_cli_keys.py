"""`key` agrees with the layer: over generated events (whole events, SQS, Kinesis and DynamoDB Streams
batches, API Gateway REST, HTTP API and ALB requests) and settings, the keys the CLI derives are exactly the
keys the layer stores when it serves that event on DynamoDB Local (read back from the table with boto3). The
CLI's printed keys (a subprocess, `key --json`) are checked against the table the same way for one event of
each kind."""

from __future__ import annotations

import contextlib
import copy
import importlib
import itertools
import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.cli import settings as cli_settings
from idempotency_layer.cli.derive import derive, keys_of
from idempotency_layer.errors import IdempotencyError
from tests.conftest import build_transport
from tests.store.test_cli_commands import cli_env, run
from tests.support import events, http_events

PROPERTY = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_prefixes = itertools.count()
KINDS = ("whole", "sqs", "kinesis", "ddb", "rest", "v2", "alb")
IDS = st.sampled_from(["o-1", "o-2", "o-3", ""])  # a small pool: duplicates and empty keys are common


class Context:
    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def handler(event, context):
    if isinstance(event, dict) and "requestContext" in event:
        return {"statusCode": 200, "body": "ok"}
    return {"ok": True} if "Records" not in event else None


@st.composite
def cases(draw, kind=None):
    kind = kind or draw(st.sampled_from(KINDS))
    env = {"IDEMPOTENCY_REQUIRE_KEY": draw(st.sampled_from(["false", "true"]))}
    if draw(st.booleans()):
        env["IDEMPOTENCY_PAYLOAD_JMESPATH"] = "amount"
    if kind == "whole":
        env["IDEMPOTENCY_KEY_JMESPATH"] = draw(st.sampled_from(["orderId", "", "[orderId, amount]"]))
        event = {"amount": draw(st.integers(0, 3))}
        if draw(st.booleans()):
            event["orderId"] = draw(IDS)
        return kind, env, event
    if kind in ("sqs", "kinesis", "ddb"):
        payloads = draw(st.lists(st.fixed_dictionaries({"orderId": IDS, "amount": st.integers(0, 3)}),
                                 min_size=1, max_size=5))
        if kind == "sqs":
            env["IDEMPOTENCY_KEY_JMESPATH"] = draw(st.sampled_from(["", "json_parse(body).orderId"]))
            messages = [events.json_message(p) for p in payloads]
            records = [message.deliver(events.queue_arn()) for message in messages]
        elif kind == "kinesis":
            records = [events.kinesis_record(p) for p in payloads]
        else:
            records = [events.dynamodb_record(p["orderId"] or "none") for p in payloads]
        repeats = draw(st.lists(st.integers(0, len(records) - 1), max_size=2))  # one delivery holding a copy twice
        return kind, env, {"Records": records + [copy.deepcopy(records[i]) for i in repeats]}
    env["IDEMPOTENCY_KEY_JMESPATH"] = draw(st.sampled_from(["", "json_parse(body).orderId"]))
    header = draw(st.sampled_from([None, "k-1", "k-2", '"a quoted key"', "a,b", "x" * 300]))
    headers = {} if header is None else {"Idempotency-Key": header}
    body = json.dumps({"orderId": draw(IDS), "amount": draw(st.integers(0, 3))})
    method = draw(st.sampled_from(["POST", "PUT"]))
    if kind == "rest":
        event = http_events.rest(method, "/orders", headers, body, principal=draw(st.sampled_from([None, "u-1"])))
    elif kind == "v2":
        event = http_events.v2(method, "/orders", headers, body, sub=draw(st.sampled_from([None, "u-1"])),
                               function_url=draw(st.booleans()))
    else:
        event = http_events.alb(method, "/orders", headers, body, multi=draw(st.booleans()))
    return kind, env, event


@pytest.fixture
def layer(layer_env, table, tmp_path, monkeypatch):
    """The interceptor module (imported disabled, so that its import builds nothing), its `build`, a transport
    on DynamoDB Local, and what the table holds under a prefix."""
    (tmp_path / "cli_keys_app.py").write_text("def handler(event, context):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, value in {"IDEMPOTENCY_ORIGINAL_HANDLER": "cli_keys_app.handler", "IDEMPOTENCY_DISABLED": "true",
                        "AWS_LAMBDA_FUNCTION_NAME": "orders"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "awslambdaric.lambda_runtime_marshaller", raising=False)
    sys.modules.pop("idempotency_layer.interceptor", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")
    transport = build_transport("lean", connect_timeout=2, read_timeout=5, max_attempts=2)

    def serve(config, event):
        built = interceptor.build(config, handler, transport=transport)
        # The layer may refuse the event (no key under require-key, a malformed batch): nothing is stored then.
        with contextlib.suppress(IdempotencyError):
            built(event, Context())

    yield serve
    sys.modules.pop("idempotency_layer.interceptor", None)


def stored(ddb_client, table: str, prefix: str) -> set[str]:
    items = ddb_client.scan(TableName=table, ConsistentRead=True, FilterExpression="begins_with(id, :p)",
                            ExpressionAttributeValues={":p": {"S": f"{prefix}#"}})["Items"]
    return {item["id"]["S"] for item in items}


def config_for(env: dict[str, str], table: str, prefix: str):
    return cli_settings.load({"IDEMPOTENCY_TABLE": table, "IDEMPOTENCY_KEY_PREFIX": prefix, **env})


@PROPERTY
@given(case=cases())
def test_key_is_what_the_layer_stores(layer, ddb_client, table, case):
    kind, env, event = case
    prefix = f"p{next(_prefixes)}"
    config = config_for(env, table, prefix)
    facts = derive(config, copy.deepcopy(event))
    layer(config, copy.deepcopy(event))
    assert set(keys_of(facts)) == stored(ddb_client, table, prefix), (kind, env, facts)
    expected = {"whole": "event", "sqs": "batch", "kinesis": "batch", "ddb": "batch"}.get(kind, "http")
    assert facts["source"] in (expected, "none")  # none: a batch the layer refuses whole


@pytest.mark.parametrize("kind", KINDS)
def test_the_printed_keys_are_what_the_layer_stores(layer, layer_env, ddb_client, table, tmp_path, kind):
    event = {
        "whole": {"orderId": "o-1"},
        "sqs": events.sqs_event([events.json_message({"orderId": "a"}), events.json_message({"orderId": "b"})]),
        "kinesis": events.stream_event([events.kinesis_record({"n": 1}), events.kinesis_record({"n": 2})]),
        "ddb": events.stream_event([events.dynamodb_record("m-1")]),
        "rest": http_events.rest("POST", "/orders", {"Idempotency-Key": "k-1"}, "{}"),
        "v2": http_events.v2("POST", "/orders", {"Idempotency-Key": "k-1"}, "{}", sub="u-1"),
        "alb": http_events.alb("POST", "/orders", {"Idempotency-Key": "k-1"}, "{}", multi=True),
    }[kind]
    prefix = f"printed-{kind}"
    settings_env = {"IDEMPOTENCY_KEY_JMESPATH": "orderId"} if kind == "whole" else {}
    (tmp_path / "event.json").write_text(json.dumps(event))
    done = run({**cli_env(layer_env.endpoint, table), **settings_env, "IDEMPOTENCY_KEY_PREFIX": prefix},
               "key", "--event", str(tmp_path / "event.json"), "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)["keys"]
    assert printed
    text = run({**cli_env(layer_env.endpoint, table), **settings_env, "IDEMPOTENCY_KEY_PREFIX": prefix},
               "key", "--event", "-", stdin=json.dumps(event))
    assert all(key in text.stdout for key in printed)
    layer(config_for(settings_env, table, prefix), event)
    assert set(printed) == stored(ddb_client, table, prefix)
