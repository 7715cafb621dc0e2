"""Per-function isolation under an IAM `dynamodb:LeadingKeys` condition (issue 44: T1.1, T1.4; R1.1, R1.4).

IAM cannot run here (nothing in these tests reaches AWS). The condition is emulated as the security review's harness
emulates it (security-2026-12.md, Appendix A; tests/support/leading_keys.py): the layer is built in process with
`interceptor.build` on the in-memory table behind a transport that refuses, with `AccessDeniedException`, any
request naming a partition key that matches none of the policy's `StringLike` patterns. With the patterns a
function's role would carry, `<P>#*` (or `idempotency#<P>` in the sort-key layout), every source must pass init,
run once and replay, with no key denied. Handler runs are counted by the handler itself (`World.runs`).
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import pytest

from idempotency_layer import config as _config
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from tests.support.inprocess import Context
from tests.support.leading_keys import LeadingKeys
from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport

P = "orders"
BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "shared",
        "AWS_LAMBDA_FUNCTION_NAME": P, "AWS_REGION": "us-east-1"}
SORT_KEY = {"IDEMPOTENCY_KEY_ATTR": "pk", "IDEMPOTENCY_SORT_KEY_ATTR": "sk"}
# (settings of the layout, the policy's patterns, the table's partition key attribute)
LAYOUTS = {"partition key": ({}, [f"{P}#*"], "id"),
           "sort key": (SORT_KEY, [f"idempotency#{P}"], "pk")}


_MARSHALLER = "awslambdaric.lambda_runtime_marshaller"


@pytest.fixture(autouse=True)
def runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's marshaller loaded, as in Lambda: results stored as the text the runtime sends, and replayed as
    it (whatever other tests loaded before)."""
    monkeypatch.setitem(sys.modules, _MARSHALLER, importlib.import_module(_MARSHALLER))


def sent(value: Any) -> Any:
    """What the runtime sends for a handler's `value`, read back: how a caller sees an answer."""
    text, _ = importlib.import_module(_MARSHALLER).LambdaMarshaller().marshal_response(value)
    return json.loads(text)


@pytest.fixture(scope="module")
def interceptor() -> Any:
    """The interceptor module, imported disabled (its import-time init builds nothing), for its `build`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IDEMPOTENCY_DISABLED", "true")
        patch.setenv("IDEMPOTENCY_ORIGINAL_HANDLER", "json.dumps")
        yield importlib.import_module("idempotency_layer.interceptor")


class World:
    """The layer built as at an init, with `settings`, on an in-memory table behind the emulated policy."""

    def __init__(self, interceptor: Any, layout: str, patterns: list[str] | None = None, **settings: str) -> None:
        layout_settings, default_patterns, key_attr = LAYOUTS[layout]
        self.config = _config.load({**BASE, **layout_settings, **settings})
        self.db = MemoryDynamoDB(key_attr, "sk" if layout == "sort key" else None)
        self.policy = LeadingKeys(MemoryTransport(self.db), default_patterns if patterns is None else patterns,
                                  key_attr)
        self.runs: list[Any] = []  # each event (or record) the handler was given: its own side effect
        self.answer: Any = lambda event: {"done": len(self.runs)}
        self.handler = interceptor.build(self.config, self._user, transport=self.policy)

    def _user(self, event: Any, context: Any) -> Any:
        self.runs.append(event)
        return self.answer(event)

    def __call__(self, event: Any) -> Any:
        return sent(self.handler(event, Context()))


def test_the_emulated_policy_matches_as_string_like_does_and_refuses_a_request_whole():
    policy = LeadingKeys(MemoryTransport(MemoryDynamoDB()), [f"{P}#*"])
    assert policy.allows("orders#abc") and policy.allows("orders#")
    assert not any(policy.allows(key) for key in ("orders", "orders-2#abc", "ordersx#1", "Orders#1", "x#orders#1"))
    assert LeadingKeys(None, ["a?[b]"]).allows("ax[b]") and not LeadingKeys(None, ["a?[b]"]).allows("axb")
    keys = {"Keys": [{"id": {"S": "orders#1"}}, {"id": {"S": "payments#1"}}]}
    from idempotency_layer.stores.dynamodb import DynamoDBError

    with pytest.raises(DynamoDBError) as caught:
        policy.call("BatchGetItem", {"RequestItems": {"shared": keys}})
    assert caught.value.code == "AccessDeniedException"
    assert [seen.allowed for seen in policy.seen] == [True, False]


# -- the Powertools migration (R1.4, T1.4) ---------------------------------------------------------------------

POWERTOOLS = {"IDEMPOTENCY_POWERTOOLS_HANDLER": "app.handler", "IDEMPOTENCY_KEY_JMESPATH": "orderId"}


def test_a_denied_powertools_read_names_the_statement_to_grant_and_nothing_runs(interceptor):
    world = World(interceptor, "partition key", **POWERTOOLS)
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        world({"orderId": "o-1"})
    assert str(caught.value) == (
        "the function's role may not read the Powertools record of this invocation: grant dynamodb:GetItem on keys "
        "'orders.app.handler#*' (a GetItem-only statement, docs/security.md)")
    assert caught.value.denied and caught.value.permanent
    assert world.runs == []
    assert world.db.items == {}  # the layer's own claim released: a retry after the grant runs
    assert [(seen.operation, seen.key.partition("#")[0]) for seen in world.policy.denied] == [
        ("GetItem", "orders.app.handler")]
    world.policy.patterns.append("orders.app.handler#*")  # the GetItem-only statement, granted
    assert world({"orderId": "o-1"}) == {"done": 1}
    assert len(world.runs) == 1


def test_a_powertools_read_failing_otherwise_keeps_its_own_words(interceptor):
    world = World(interceptor, "partition key", [f"{P}#*", f"{P}.app.handler#*"], **POWERTOOLS)

    class Throttled:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
            if operation == "GetItem" and params.get("ProjectionExpression"):
                from idempotency_layer.stores.dynamodb import DynamoDBError

                raise DynamoDBError(operation, "ProvisionedThroughputExceededException", "slow down", status=400)
            return self.inner.call(operation, params, deadline)

    world.policy.inner = Throttled(world.policy.inner)
    with pytest.raises(IdempotencyPersistenceLayerError, match="ProvisionedThroughputExceededException") as caught:
        world({"orderId": "o-2"})
    assert "Powertools record" not in str(caught.value) and not caught.value.denied
    assert world.runs == []


# -- every source under the function's own keys (T1.1) ---------------------------------------------------------

def units(event: Any) -> int:
    """How many units of work (records, messages, or the event) a handler call was given."""
    if "Records" in event:
        return len(event["Records"])
    if "records" in event:  # Kafka
        return sum(len(records) for records in event["records"].values())
    if "messages" in event:  # ActiveMQ
        return len(event["messages"])
    if "rmqMessagesByQueue" in event:
        return sum(len(messages) for messages in event["rmqMessagesByQueue"].values())
    return 1


def _http(kind: str) -> tuple[Any, Any]:
    from tests.support import http_events

    headers = {"Idempotency-Key": f"k-{kind}", "Content-Type": "application/json"}
    make = {"rest": http_events.rest, "v2": http_events.v2, "alb": http_events.alb}[kind]
    return make("POST", "/orders", headers, '{"orderId": "o-1"}'), make("POST", "/orders", headers,
                                                                        '{"orderId": "o-1"}')


def _sqs(fifo: bool) -> tuple[Any, Any]:
    from tests.support import events

    messages = [events.json_message({"orderId": f"o-{i}"}, group="g-1" if fifo else None) for i in range(3)]
    arn = events.queue_arn(fifo=fifo)
    return events.sqs_event(messages, arn), events.sqs_event(messages, arn)


def _kinesis() -> tuple[Any, Any]:
    from tests.support import events

    records = [events.kinesis_record({"orderId": f"o-{i}"}) for i in range(3)]
    return events.stream_event(records), events.stream_event(records)


def _dynamodb_streams() -> tuple[Any, Any]:
    from tests.support import events

    records = [events.dynamodb_record(f"m-{i}") for i in range(3)]
    return events.stream_event(records), events.stream_event(records)


def _kafka() -> tuple[Any, Any]:
    from tests.support import broker_events

    records = [broker_events.kafka_record("orders", 0, offset, {"orderId": f"o-{offset}"}) for offset in range(3)]
    return broker_events.kafka_event(records), broker_events.kafka_event(records)


def _activemq() -> tuple[Any, Any]:
    from tests.support import broker_events

    messages = [broker_events.activemq_message({"orderId": f"o-{i}"}) for i in range(3)]
    return broker_events.activemq_event(messages), broker_events.activemq_event(messages, redelivered=True)


def _rabbitmq() -> tuple[Any, Any]:
    from tests.support import broker_events

    queues = {"orders::/": [broker_events.rabbitmq_message({"orderId": f"o-{i}"}) for i in range(3)]}
    return broker_events.rabbitmq_event(queues), broker_events.rabbitmq_event(queues, redelivered=True)


def _durable() -> tuple[Any, Any]:
    def envelope(execution: str) -> dict[str, Any]:
        arn = f"arn:aws:lambda:us-east-1:123456789012:function:{P}:$LATEST/durable-execution/{execution}/op-1"
        operation = {"Id": "op-1", "Type": "EXECUTION", "Status": "STARTED",
                     "ExecutionDetails": {"InputPayload": json.dumps({"orderId": "o-1"})}}
        return {"DurableExecutionArn": arn, "CheckpointToken": "t-1",
                "InitialExecutionState": {"Operations": [operation]}}

    return envelope("exec-1"), envelope("exec-2")  # a duplicate execution of the same input


def _http_answer(event: Any) -> Any:
    return {"statusCode": 201, "headers": {"Content-Type": "application/json"}, "body": '{"placed": true}'}


def _durable_answer(event: Any) -> Any:
    return {"Status": "SUCCEEDED", "Result": '{"receipt": 1}'}


def _batch_answer(event: Any) -> Any:
    return None  # every record done (an MQ handler's return value is ignored; a partial response of none failed)


DURABLE = {"IDEMPOTENCY_DURABLE": "execution", "IDEMPOTENCY_IN_PROGRESS_SECONDS": "86400",
           "IDEMPOTENCY_KEY_JMESPATH": "orderId"}
# name: (settings, the two deliveries, the handler's answer, whether the second delivery's answer is the first's)
SCENARIOS: dict[str, tuple[dict[str, str], Any, Any]] = {
    "whole event": ({}, lambda: ({"orderId": "o-1"}, {"orderId": "o-1"}), None),
    "whole event, key expression": ({"IDEMPOTENCY_KEY_JMESPATH": "orderId"},
                                    lambda: ({"orderId": "o-1", "n": 1}, {"orderId": "o-1", "n": 2}), None),
    "HTTP REST": ({}, lambda: _http("rest"), _http_answer),
    "HTTP v2": ({}, lambda: _http("v2"), _http_answer),
    "HTTP ALB": ({}, lambda: _http("alb"), _http_answer),
    "SQS standard, pre-check": ({"IDEMPOTENCY_BATCH_PRECHECK": "always"}, lambda: _sqs(False), _batch_answer),
    "SQS FIFO, pre-check": ({"IDEMPOTENCY_BATCH_PRECHECK": "always"}, lambda: _sqs(True), _batch_answer),
    "SQS standard, redelivery pre-checked (auto)": ({}, lambda: _sqs(False), _batch_answer),
    "Kinesis": ({}, _kinesis, _batch_answer),
    "DynamoDB Streams": ({}, _dynamodb_streams, _batch_answer),
    "Kafka": ({}, _kafka, _batch_answer),
    "ActiveMQ": ({}, _activemq, _batch_answer),
    "RabbitMQ": ({}, _rabbitmq, _batch_answer),
    "durable execution": (DURABLE, _durable, _durable_answer),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_source_runs_once_and_replays_under_the_functions_own_keys(interceptor, layout, scenario):
    settings, deliveries, answer = SCENARIOS[scenario]
    world = World(interceptor, layout, **settings)
    if answer is not None:
        world.answer = answer
    first_event, second_event = deliveries()
    first = world(first_event)
    ran = sum(units(event) for event in world.runs)
    assert ran == units(first_event)  # every unit of work ran once
    second = world(second_event)
    assert sum(units(event) for event in world.runs) == ran  # ... and none again
    if scenario.startswith("HTTP"):  # the replay is the first run's response, marked as a replay
        assert (second["statusCode"], second["body"]) == (first["statusCode"], first["body"])
        assert second["headers"]["Idempotent-Replayed"] == "true"
    elif not scenario.startswith(("SQS", "Kinesis", "DynamoDB", "Kafka", "ActiveMQ", "RabbitMQ")):
        assert second == first, scenario  # the replay is the first run's answer
    else:
        assert not (second or {}).get("batchItemFailures"), second
    _assert_confined(world, layout)
    if "pre-check" in scenario:
        assert "BatchGetItem" in {seen.operation for seen in world.policy.seen}


def _assert_confined(world: World, layout: str) -> None:
    """Nothing was denied, something was sent, and every item the table holds lies under the function's keys."""
    assert world.policy.denied == []
    assert world.policy.seen
    assert world.db.items
    for key in world.db.items:
        if layout == "sort key":
            assert key[0] == f"idempotency#{P}" and key[1].startswith(f"{P}#"), key
        else:
            assert key[0].startswith(f"{P}#"), key
    init = world.policy.seen[0]  # the table check, under the function's own keys too
    assert init.operation == "GetItem"
    assert init.key == (f"idempotency#{P}" if layout == "sort key" else f"{P}#idempotency-layer-schema-check")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_replay_from_the_local_cache_reads_under_the_functions_own_keys(interceptor, layout):
    world = World(interceptor, layout, IDEMPOTENCY_LOCAL_CACHE_SIZE="8")
    answers = [world({"orderId": "o-1"}) for _ in range(3)]
    assert answers == [answers[0]] * 3 and len(world.runs) == 1
    # the cache's check: a GetItem of the cached record, after the first replay (a PutItem) cached it
    assert [seen.operation for seen in world.policy.seen][-1] == "GetItem"
    _assert_confined(world, layout)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_copy_that_waits_for_the_first_reads_under_the_functions_own_keys(interceptor, layout):
    import threading

    world = World(interceptor, layout, IDEMPOTENCY_WAIT_SECONDS="10")
    started, go = threading.Event(), threading.Event()

    def slow(event: Any) -> Any:
        started.set()
        assert go.wait(10)
        return {"placed": event["orderId"]}

    world.answer = slow
    answers: list[Any] = []
    first = threading.Thread(target=lambda: answers.append(world({"orderId": "o-1"})))
    first.start()
    assert started.wait(10)
    copy = threading.Thread(target=lambda: answers.append(world({"orderId": "o-1"})))
    copy.start()
    while not any(seen.operation == "GetItem" for seen in world.policy.seen[2:]) and copy.is_alive():
        threading.Event().wait(0.01)  # the copy polls the claim
    go.set()
    first.join(10)
    copy.join(10)
    assert answers == [{"placed": "o-1"}] * 2 and len(world.runs) == 1
    _assert_confined(world, layout)


class Objects:
    """S3 in memory behind `Bucket._request`, under an emulated policy of s3:PutObject and s3:GetObject on
    `<bucket>/<allowed>*` only: objects by key, every request recorded with its verdict."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, allowed: str) -> None:
        from idempotency_layer.stores.s3 import Bucket, S3Error

        self.objects: dict[str, bytes] = {}
        self.seen: list[tuple[str, str, bool]] = []
        store = self

        def request(bucket: Any, method: str, object_key: str, body: bytes, deadline: Any, *rest: Any,
                    **options: Any) -> Any:
            ok = method in ("PUT", "GET") and object_key.startswith(allowed)
            store.seen.append((method, object_key, ok))
            if not ok:
                raise S3Error(f"S3 {method} s3://{bucket.name}/{object_key} failed: HTTP 403 AccessDenied",
                              code="AccessDenied")
            if method == "PUT":
                store.objects[object_key] = body
                return 200, b""
            found = store.objects.get(object_key)
            return (404, b"") if found is None else (200, found)

        monkeypatch.setattr(Bucket, "_request", request)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_large_result_goes_under_the_functions_own_prefix_and_replays(interceptor, layout, monkeypatch):
    import base64
    import os

    results = f"idempotency-results/{P}/"
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
                        "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)
    s3 = Objects(monkeypatch, results)
    world = World(interceptor, layout, IDEMPOTENCY_LARGE_RESULTS_BUCKET="results",
                  IDEMPOTENCY_LARGE_RESULTS_PREFIX=results)
    large = base64.b64encode(os.urandom(450_000)).decode()  # 600 KB that does not compress to a record's size
    world.answer = lambda event: {"report": large}
    assert world({"orderId": "o-1"}) == {"report": large}
    assert world({"orderId": "o-1"}) == {"report": large}
    assert len(world.runs) == 1
    assert [method for method, _, _ in s3.seen] == ["PUT", "GET"]
    assert all(ok for _, _, ok in s3.seen)
    (object_key,) = s3.objects
    assert object_key.startswith(f"{results}{P}#")
    _assert_confined(world, layout)


# -- the property: whatever the prefix, the expression and the event ---------------------------------------------

def _events(draw: Any, source: str) -> Any:
    from hypothesis import strategies as st

    from tests.support import events, http_events

    text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
    order = {"orderId": draw(text), "customerId": draw(st.one_of(st.none(), text))}
    if source == "whole":
        return order
    if source == "http":
        header = draw(st.from_regex(r"[A-Za-z0-9._~+/=-]{1,40}", fullmatch=True))  # a token the layer accepts
        return http_events.v2("POST", "/orders", {"Idempotency-Key": header}, json.dumps(order))
    return events.sqs_event([events.json_message({**order, "orderId": f"{order['orderId']}-{n}"})
                             for n in range(draw(st.integers(1, 3)))])


EXPRESSIONS = {"whole": [None, "orderId", "[customerId, orderId]", "@"], "http": [None],
               "sqs": [None, "json_parse(body).orderId", "messageId"]}


def test_every_key_the_layer_sends_lies_under_the_prefix(interceptor):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @st.composite
    def cases(draw: Any) -> Any:
        prefix = draw(st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True))
        source = draw(st.sampled_from(sorted(EXPRESSIONS)))
        expression = draw(st.sampled_from(EXPRESSIONS[source]))
        layout = draw(st.sampled_from(sorted(LAYOUTS)))
        return prefix, layout, expression, _events(draw, source)

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(cases())
    def check(case: Any) -> None:
        prefix, layout, expression, event = case
        patterns = [f"idempotency#{prefix}"] if layout == "sort key" else [f"{prefix}#*"]
        settings_ = {"IDEMPOTENCY_KEY_PREFIX": prefix, **({"IDEMPOTENCY_KEY_JMESPATH": expression} if expression
                                                         else {})}
        world = World(interceptor, layout, patterns, **settings_)
        world(event)
        ran = sum(units(one) for one in world.runs)
        world(event)
        assert ran == units(event) == sum(units(one) for one in world.runs)  # once, then replayed
        assert world.policy.denied == [] and world.db.items
        for key in world.db.items:  # what the layer wrote
            written = key[1] if layout == "sort key" else key[0]
            assert written.startswith(f"{prefix}#"), (prefix, written)
            assert layout != "sort key" or key[0] == f"idempotency#{prefix}"
        assert all(seen.key.startswith(f"{prefix}#") or seen.key == f"idempotency#{prefix}"
                   for seen in world.policy.seen)

    check()


class PowertoolsClient:
    """The boto3 DynamoDB client Powertools' DynamoDBPersistenceLayer calls, over the in-memory table: its four item
    calls as the low-level requests boto3 would send (the same shapes the layer's transport sends), and its
    conditional-check failure as boto3's ClientError."""

    def __init__(self, db: MemoryDynamoDB) -> None:
        self.transport = MemoryTransport(db)

    def _call(self, operation: str, params: dict) -> dict:
        from botocore.exceptions import ClientError

        from idempotency_layer.stores.dynamodb import DynamoDBError

        try:
            return self.transport.call(operation, params)
        except DynamoDBError as error:
            answer: dict = {"Error": {"Code": error.code, "Message": error.message}}
            if error.item:
                answer["Item"] = error.item
            raise ClientError(answer, operation) from None  # type: ignore[arg-type]

    def put_item(self, **params: Any) -> dict:
        return self._call("PutItem", params)

    def get_item(self, **params: Any) -> dict:
        return self._call("GetItem", params)

    def update_item(self, **params: Any) -> dict:
        return self._call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict:
        return self._call("DeleteItem", params)


def _powertools_completed(db: MemoryDynamoDB, monkeypatch: pytest.MonkeyPatch, event: Any) -> list[Any]:
    """`event` run once by the real aws-lambda-powertools `@idempotent` on handler `app.handler` of function `orders`,
    its COMPLETED record in `db`; the runs of that handler (its own side effect)."""
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent

    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", P)
    runs: list[Any] = []

    def handler(event: Any, context: Any) -> Any:
        runs.append(event)
        return {"charged": event["amount"], "receipt": "r-1"}

    handler.__module__, handler.__qualname__ = "app", "handler"  # Powertools keys by module.qualname
    layer = DynamoDBPersistenceLayer(table_name="shared", boto3_client=PowertoolsClient(db))  # type: ignore[arg-type]
    decorated = idempotent(persistence_store=layer, config=IdempotencyConfig(event_key_jmespath="orderId"))(handler)
    assert decorated(event, Context()) == {"charged": event["amount"], "receipt": "r-1"}
    return runs


def test_a_powertools_record_is_replayed_under_the_extra_getitem_statement(interceptor, monkeypatch):
    event = {"orderId": "o-7", "amount": 12}
    denied = World(interceptor, "partition key", **POWERTOOLS)
    assert _powertools_completed(denied.db, monkeypatch, event) == [event]
    (powertools_key,) = denied.db.items
    assert powertools_key[0].startswith("orders.app.handler#")
    grant = r"grant dynamodb:GetItem on keys 'orders\.app\.handler#\*'"
    with pytest.raises(IdempotencyPersistenceLayerError, match=grant):
        denied(event)
    assert denied.runs == [] and list(denied.db.items) == [powertools_key]

    world = World(interceptor, "partition key", [f"{P}#*", "orders.app.handler#*"], **POWERTOOLS)
    world.db.items.update(denied.db.items)
    assert world(event) == {"charged": 12, "receipt": "r-1"}  # Powertools' result, replayed
    assert world(event) == {"charged": 12, "receipt": "r-1"}  # ... and kept as the layer's own record
    assert world.runs == []
    assert world.policy.denied == []
    # the Powertools key only read (GetItem), never written; everything written lies under the function's keys
    assert {seen.operation for seen in world.policy.seen if not seen.key.startswith(f"{P}#")} == {"GetItem"}
    assert all(key[0].startswith(f"{P}#") for key in world.db.items if key != powertools_key)
