"""Issue 6's guarantees on DynamoDB Local: replays equal the first response byte for byte through the runtime's
own marshaller, every failure of ours after the handler ran ends in a completion (never a bare claim), the
table's key schema is checked at init, and no event or result content reaches an error or a log line.

Executions are counted from the handler's own side effect (a list it appends to), never from the layer.
"""

from __future__ import annotations

import contextlib
import decimal
import enum
import importlib
import os
import sys
import uuid
from typing import Any, NamedTuple

import pytest
from awslambdaric.lambda_runtime_log_utils import JsonFormatter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer import codec
from idempotency_layer import config as _config
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import (
    IdempotencyConfigurationError,
    IdempotencyError,
    IdempotencyPersistenceLayerError,
    IdempotencyResultTooLargeError,
)
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED, INPROGRESS
from tests.support import emf
from tests.support.dynamodb_local import create_table

EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60"))  # a longer run is a variable away
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])
_MARSHALLER = "awslambdaric.lambda_runtime_marshaller"


def _marshal(value: Any) -> Any:
    return importlib.import_module(_MARSHALLER).LambdaMarshaller().marshal_response(value)


SECRET = "SECRET-4111111111111111"


class Colour(str, enum.Enum):
    RED = "red"


class Pair(NamedTuple):
    a: Any
    b: Any


class Fields:
    def __init__(self, value: Any) -> None:
        self.value = value

    def _asdict(self) -> dict[str, Any]:
        return {"value": self.value}


class Context:
    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def _wire(value: Any) -> bytes:
    """The bytes the runtime sends for what a handler (or the layer) returned."""
    text, _ = _marshal(value)
    return text if isinstance(text, bytes) else text.encode("utf-8")


_text = st.text(st.characters(codec="utf-8"), max_size=12)  # the runtime cannot send lone surrogates on 3.12+
_keys = st.one_of(_text, st.just(Colour.RED), _text.map(str.encode), st.integers(-(2**70), 2**70), st.booleans(),
                  st.none(), st.floats(allow_nan=False))
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**200), 2**200), st.floats(), _text,
    st.text(max_size=8), st.sampled_from([Colour.RED, float("nan"), float("inf"), -0.0, "\x00", "\U0001f600"]),
    st.decimals(allow_nan=False), st.binary(max_size=16),
)
_results = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(_keys, children, max_size=4),
        st.builds(Pair, children, children),
        st.builds(Fields, children),
    ),
    max_leaves=25,
)


def _marshallable(value: Any) -> bool:
    try:
        _wire(value)
    except Exception:
        return False
    return True


class Built:
    """A handler built by the interceptor's `build` from the settings, calling whatever `user_handler` is now."""

    def __init__(self, interceptor: Any) -> None:
        self.user_handler: Any = None
        self.handler = interceptor.build(_config.load(), lambda event, context: self.user_handler(event, context))


@pytest.fixture
def load(tmp_path, monkeypatch, layer_env, proxy, table):
    """Handlers built from settings as at a function's init, with the runtime's marshaller loaded."""
    # Loaded only for these tests (the interceptor looks for it in sys.modules, as under the runtime).
    monkeypatch.setitem(sys.modules, _MARSHALLER, importlib.import_module(_MARSHALLER))
    (tmp_path / "pay_app.py").write_text("def handler(event, context):\n    raise AssertionError('replaced')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "pay")
    base = {"IDEMPOTENCY_ORIGINAL_HANDLER": "pay_app.handler", "IDEMPOTENCY_TABLE": table,
            "IDEMPOTENCY_KEY_JMESPATH": "orderId"}
    for name, value in base.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("idempotency_layer.interceptor", None)
    sys.modules.pop("pay_app", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")  # for its build, as at an init

    def load_interceptor(**settings: str) -> Built:
        for name, value in {**base, **settings}.items():
            monkeypatch.setenv(name, value)
        return Built(interceptor)

    yield load_interceptor
    sys.modules.pop("idempotency_layer.interceptor", None)


# -- replays equal the first response -------------------------------------------------------------------------


@PROPERTY
@given(value=_results)
def test_replay_bytes_equal_the_first_response(load_once, value):
    interceptor, runs = load_once
    if not _marshallable(value):
        return  # the runtime refuses it too: covered by the unmarshallable tests
    event = {"orderId": uuid.uuid4().hex}
    interceptor.user_handler = lambda e, c: runs.append(1) or value
    first = interceptor.handler(event, Context())
    again = interceptor.handler(event, Context())
    assert len(runs) == 1
    assert _wire(first) == _wire(value)  # the first response is what the runtime would send without us
    assert _wire(again) == _wire(first)
    assert type(again) is type(first)  # a wrapper chained in front of us sees one kind of value
    runs.clear()


@pytest.fixture
def load_once(load):
    return load(), []


def test_a_deeply_nested_result_is_stored_and_replayed(load):
    interceptor = load()
    value: Any = 1
    for _ in range(300):  # 600 levels: the runtime's marshaller sends it
        value = {"d": [value]}
    runs: list[int] = []
    interceptor.user_handler = lambda e, c: runs.append(1) or value
    event = {"orderId": "deep"}
    first, again = interceptor.handler(event, Context()), interceptor.handler(event, Context())
    assert runs == [1]
    assert _wire(again) == _wire(first) == _wire(value)


def test_cache_replay_of_a_too_large_result_raises_the_too_large_error(load):
    interceptor = load(IDEMPOTENCY_LOCAL_CACHE_SIZE="8")
    big = {"blob": os.urandom(500_000).hex()}  # 1 MB of random hex does not compress under the budget
    runs: list[int] = []
    interceptor.user_handler = lambda e, c: runs.append(1) or big
    event = {"orderId": "big"}
    assert _wire(interceptor.handler(event, Context())) == _wire(big)
    for _ in range(2):  # from the local cache the first run filled
        with pytest.raises(IdempotencyResultTooLargeError):
            interceptor.handler(event, Context())
    assert runs == [1]


# -- every failure of ours after the handler ran ends in a completion ----------------------------------------


class Faulty:
    """A store and results wrapper that raises `error` at one step, on the real store behind it."""

    def __init__(self, store: DynamoDBStore, step: str, error: BaseException) -> None:
        self.store, self.step, self.error = store, step, error
        self.deadlines: list[float | None] = []  # given to each completion: the fallback is bounded too

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def complete(self, key, owner, result, expires_at, deadline=None):
        self.deadlines.append(deadline)
        if self.step == "complete" and result.format != codec.TOO_LARGE:
            raise self.error
        return self.store.complete(key, owner, result, expires_at, deadline)

    def encode(self, value):
        if self.step == "encode":
            raise self.error
        return value, codec.encode(value)

    def decode(self, encoded):
        return codec.decode(encoded)


@pytest.mark.parametrize("step", ["encode", "complete"])
@pytest.mark.parametrize("error", [RecursionError(), MemoryError(), ValueError(SECRET), TypeError(SECRET),
                                   KeyError(SECRET)], ids=lambda e: type(e).__name__)
def test_failure_after_the_handler_ends_in_a_completion(store, step, error, caplog):
    faulty = Faulty(store, step, error)
    cycle = Cycle(faulty, ttl_seconds=3600, results=faulty)
    runs: list[int] = []
    key = f"k#{uuid.uuid4().hex}"
    with caplog.at_level("DEBUG", logger="idempotency_layer"):
        value = cycle.run(Invocation(30_000), key, lambda: runs.append(1) or {"card": SECRET}).value
    assert value == {"card": SECRET}  # the caller still gets its result
    record = store.get(key)
    assert record is not None and record.status == COMPLETED, record
    with pytest.raises(IdempotencyResultTooLargeError):  # the handler never runs twice
        Cycle(store, ttl_seconds=3600).run(Invocation(30_000), key, lambda: runs.append(1))
    assert runs == [1]
    assert SECRET not in caplog.text
    assert faulty.deadlines and None not in faulty.deadlines  # every completion, the fallback too, is bounded


# -- the table's key schema -----------------------------------------------------------------------------------


def test_sort_key_setting_on_a_table_without_one_fails_init(load):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_SORT_KEY_ATTR='sk'"):
        load(IDEMPOTENCY_SORT_KEY_ATTR="sk")


def test_table_with_a_sort_key_the_settings_lack_fails_init(load, ddb_client, monkeypatch):
    name = create_table(ddb_client, f"sk-{uuid.uuid4().hex[:8]}", key_attr="id", sort_key_attr="sk")
    try:
        with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_SORT_KEY_ATTR unset"):
            load(IDEMPOTENCY_TABLE=name)
        assert load(IDEMPOTENCY_TABLE=name, IDEMPOTENCY_SORT_KEY_ATTR="sk").handler is not None
    finally:
        ddb_client.delete_table(TableName=name)


def test_wrong_key_attribute_and_missing_table_fail_init(load):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_KEY_ATTR='pk'"):
        load(IDEMPOTENCY_KEY_ATTR="pk")
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_TABLE='no-such-table'"):
        load(IDEMPOTENCY_TABLE="no-such-table")


def test_init_check_is_one_get_item(store, proxy, sort_key_table, transport):
    proxy.reset()
    DynamoDBStore(transport, sort_key_table, Attributes(key="pk", sort_key="sk"), "P", key_prefix="fn").verify()
    assert proxy.snapshot()[0] == {"GetItem": 1}


def test_init_errors_say_what_dynamodb_said_and_blame_the_key_schema_only_when_it_differs(transport, table_name,
                                                                                          sort_key_table, ddb_client):
    """Issue 29: a table ARN DynamoDB refused was reported as a key schema that differs, without DynamoDB's words."""
    arn = "arn:aws:dynamodb:us-east-1:123456789012:table/no-such-table-here"
    numeric = f"numeric-{uuid.uuid4().hex[:8]}"
    ddb_client.create_table(TableName=numeric, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "N"}],
                            BillingMode="PAY_PER_REQUEST")
    seen = {}
    for name, table, attributes in [("arn", arn, Attributes()), ("missing", "no-such-table-here", Attributes()),
                                    ("schema", table_name, Attributes(sort_key="sk")),
                                    ("schema, sort key", sort_key_table, Attributes()),
                                    ("schema, a number", numeric, Attributes())]:
        with pytest.raises(IdempotencyConfigurationError) as raised:
            DynamoDBStore(transport, table, attributes, "P" if attributes.sort_key else None, key_prefix="fn").verify()
        seen[name] = str(raised.value)
    for name, message in seen.items():
        assert "(DynamoDB: " in message and message.endswith(")") and "\n" not in message, (name, message)
    assert "does not have the key these settings describe" in seen["schema"]
    assert "(DynamoDB: ValidationException: " in seen["schema"]
    assert "does not have the key these settings describe" in seen["schema, sort key"]
    assert "as a string partition key" in seen["schema, a number"] and "Type mismatch" in seen["schema, a number"]
    assert "no such table" in seen["missing"] and "ResourceNotFoundException" in seen["missing"]
    # DynamoDB Local takes no ARN for a table name; whatever it says, it is said, and no key schema is blamed.
    assert "key these settings describe" not in seen["arn"], seen["arn"]


class Flaky:
    """A transport that fails its first `n` calls the way an unreachable endpoint does."""

    def __init__(self, transport: Any, n: int) -> None:
        self.transport, self.n = transport, n

    def call(self, operation, params, deadline=None):
        if self.n > 0:
            self.n -= 1
            from idempotency_layer.stores.dynamodb import DynamoDBError

            raise DynamoDBError(operation, "EndpointConnectionError", "unreachable", None)
        return self.transport.call(operation, params, deadline)


def test_a_table_unreachable_at_init_is_checked_before_the_first_claim(transport, table_name):
    store = DynamoDBStore(Flaky(transport, 2), table_name, Attributes(sort_key="sk"), "P", key_prefix="fn")
    store.verify()  # unreachable: no verdict yet
    with pytest.raises(IdempotencyPersistenceLayerError, match="could not be reached"):
        store.claim("k", "me", 0, 1, 2)
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_SORT_KEY_ATTR"):
        store.claim("k", "me", 0, 1, 2)


# -- no event or result content in errors and logs ------------------------------------------------------------


def test_no_event_or_result_content_in_errors_or_logs(load, caplog, capsys, monkeypatch):
    """Every error path of ours, with the secret in the event and in the result; metrics and INFO lines on."""
    seen: list[str] = []
    monkeypatch.setenv("IDEMPOTENCY_METRICS", "emf")  # each invocation's EMF document goes to stdout

    def attempt(interceptor: Any, event: Any, result: Any = None) -> None:
        interceptor.user_handler = lambda e, c: result
        try:
            interceptor.handler(event, Context())  # what it returns is the user's own result: not an error of ours
        except IdempotencyError as error:
            seen.append(f"{type(error).__name__}: {error}")
        except Exception as error:  # the runtime's own errors are not ours, but must not quote us either
            seen.append(f"{type(error).__name__}: {error}")

    with caplog.at_level("DEBUG", logger="idempotency_layer"):
        body = load(IDEMPOTENCY_KEY_JMESPATH="json_parse(body).orderId", IDEMPOTENCY_REQUIRE_KEY="true")
        attempt(body, {"body": {"card": SECRET}})  # json_parse of an object
        attempt(body, {"body": SECRET})  # not JSON
        attempt(body, {"body": '{"card": "' + SECRET + '"}'})  # selects nothing, key required
        gz = load(IDEMPOTENCY_KEY_JMESPATH="base64_gzip_decode(body)")
        attempt(gz, {"body": "U0VDUkVULTQxMTExMTExMTExMTExMTE="})  # base64 of the secret, not gzip
        plain = load()
        attempt(plain, {"orderId": "o1", "card": SECRET}, {"card": SECRET, "when": object()})  # unmarshallable
        big = {"card": SECRET, "blob": os.urandom(500_000).hex()}
        attempt(plain, {"orderId": "o2", "card": SECRET}, big)  # too large: stored as such
        attempt(plain, {"orderId": "o2", "card": SECRET}, big)  # its replay raises
        fingerprinted = load(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_PAYLOAD_JMESPATH="card",
                             IDEMPOTENCY_LOCAL_CACHE_SIZE="5")
        attempt(fingerprinted, {"orderId": "o3", "card": "first"}, {"ok": 1})
        attempt(fingerprinted, {"orderId": "o3", "card": SECRET})  # another payload: refused
        attempt(load(IDEMPOTENCY_PAYLOAD_JMESPATH="json_parse(card)"), {"card": SECRET})  # not JSON
    replies = "\n".join(seen)
    assert "IdempotencyKeyError" in replies and "IdempotencyResultTooLargeError" in replies
    assert "IdempotencyPayloadMismatchError" in replies
    assert SECRET not in replies
    ours = [r.getMessage() + str(r.exc_info) for r in caplog.records if r.name.startswith("idempotency_layer")]
    assert any("too large" in line for line in ours)  # the paths were taken and logged
    assert not [line for line in ours if SECRET in line]
    captured = capsys.readouterr()
    assert SECRET not in captured.err and SECRET not in captured.out
    # Every record whole, its fields included, as the runtime's JSON formatter writes it; every document.
    formatter = JsonFormatter()
    written = [formatter.format(r) for r in caplog.records if r.name.startswith("idempotency_layer")]
    assert any('"idempotency_outcome": "first_run"' in line for line in written)  # the INFO lines are there
    assert not [line for line in written if SECRET in line]
    assert len(emf.documents(captured.out)) == len(seen) + 3  # one an invocation: 3 did not raise


def test_record_states_are_only_completed_or_absent_after_a_run(store, ddb_client, table_name):
    cycle = Cycle(store, ttl_seconds=3600)
    for outcome in ("ok", "raise"):
        key = f"k#{outcome}"

        def invoke(outcome: str = outcome) -> Any:
            if outcome == "raise":
                raise ValueError("declined")
            return decimal.Decimal("1.10")

        with contextlib.suppress(ValueError):
            cycle.run(Invocation(30_000), key, invoke)
        record = store.get(key)
        assert (record is None) if outcome == "raise" else (record.status == COMPLETED)
        assert record is None or record.status != INPROGRESS


def test_a_completion_refused_for_good_stops_this_environment_running_handlers(transport, ddb_client, caplog):
    """The handler ran and its completion cannot be written (here the table is gone): the caller gets its result,
    and no later invocation in this environment runs a handler it could not record."""
    name = create_table(ddb_client, f"gone-{uuid.uuid4().hex[:8]}")
    cycle = Cycle(DynamoDBStore(transport, name, Attributes(), key_prefix="fn"), ttl_seconds=3600)
    runs: list[str] = []

    def place_order() -> Any:
        runs.append("first")
        ddb_client.delete_table(TableName=name)
        return {"order": "placed"}

    with caplog.at_level("ERROR", logger="idempotency_layer"):
        assert cycle.run(Invocation(30_000), "k#1", place_order).value == {"order": "placed"}
    assert "ResourceNotFoundException" in caplog.text and "runs no more handlers" in caplog.text
    for key in ("k#1", "k#2"):
        with pytest.raises(IdempotencyPersistenceLayerError, match=r"runs no more handlers.*ResourceNotFound"):
            cycle.run(Invocation(30_000), key, lambda: runs.append("again"))
    assert runs == ["first"]


def test_a_transient_completion_failure_does_not_stop_the_environment(store, transport, table_name):
    class FailOnce:
        def __init__(self) -> None:
            self.failed = False

        def call(self, operation, params, deadline=None):
            if operation == "UpdateItem" and not self.failed:
                self.failed = True
                from idempotency_layer.stores.dynamodb import DynamoDBError

                raise DynamoDBError(operation, "ProvisionedThroughputExceededException", "throttled", None)
            return transport.call(operation, params, deadline)

    cycle = Cycle(DynamoDBStore(FailOnce(), table_name, Attributes(), key_prefix="fn"), ttl_seconds=3600)
    runs: list[int] = []
    assert cycle.run(Invocation(30_000), "k#a", lambda: runs.append(1) or 1).value == 1
    assert cycle.run(Invocation(30_000), "k#b", lambda: runs.append(2) or 2).value == 2
    assert runs == [1, 2] and cycle.environment.refusal is None
