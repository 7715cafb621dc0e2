"""Results whose replay is not the first response's bytes as such, under the real runtime and the built layer:

- a payload 2.0 simple response (a value without statusCode) replays in the explicit form API Gateway makes of
  it, whose body must be exactly the text the runtime sent the first time (its own marshaller: Decimal,
  non-ASCII, floats), on every Python;
- a wrapper chained with IDEMPOTENCY_NEXT_WRAPPER whose handler wraps ours, as OpenTelemetry's does, must get
  the handler's own kind of value on the first run and on a replay, and the responses stay byte for byte alike.

Values travel pickled in the event; executions are counted from the handler's own side effect.
"""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import APPS, PYTHONS, Environments, Executions, marker, same_as_first
from tests.e2e.test_properties import pickled, results_of
from tests.support import http_events

sys.path.insert(0, str(APPS))
from values import Colour, Point, Row

EXAMPLES = max(4, int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60")) // 4)
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


# -- payload 2.0 simple responses ------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=12)
_unicode = st.text(st.sampled_from("aé€\u2603\U0001f600\u00a0\u2028\"\\/\x00\n"), max_size=12)
_numbers = st.one_of(st.decimals(allow_nan=False, allow_infinity=False), st.decimals(places=2, max_value=10**12),
                     st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False))
_leaves = st.one_of(st.none(), st.booleans(), _numbers, _text, _unicode)
_nested = st.recursive(_leaves, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(st.one_of(_text, _unicode), children, max_size=4)), max_leaves=25)
# Large enough to be stored compressed (over 8 KB), still Decimals and non-ASCII.
_large = st.tuples(st.integers(300, 900), _unicode, st.decimals(places=3, max_value=10**6)).map(
    lambda t: {"items": [{"sku": f"s{i}\u00e9{t[1]}", "price": t[2], "qty": Decimal(i)} for i in range(t[0])]})
# A DynamoDB item as boto3's resource layer returns it; never with a statusCode, which would make it explicit.
_simple = st.one_of(
    st.dictionaries(st.one_of(_text, _unicode).filter(lambda k: k != "statusCode"), _nested, max_size=5),
    st.lists(_nested, max_size=4), _large,
)
ITEM = {"orderId": "o-1", "amount": Decimal("19.99"), "qty": Decimal("3"), "ratio": Decimal("1E+3"),
        "note": "caf\u00e9 \u2603 \U0001f600", "lines": [{"price": Decimal("0.10"), "f": 0.1}], "big": 2**70}


@pytest.mark.parametrize("version", PYTHONS)
@PROPERTY
@example(value=ITEM)
@example(value={"note": "caf\u00e9 \u2028 \U0001f600"})  # no Decimal: the text alone is escaped per Python
@given(value=_simple)
def test_a_simple_response_replays_with_the_first_response_as_its_body(
        version: str, environments: Environments, shared_table: str, executions: Executions, value: Any) -> None:
    env = environments.shared(version, shared_table, handler="simple_api.handler")
    mark = marker()
    body = json.dumps({"marker": mark, "value": pickled(value)})
    event = http_events.v2("POST", "/orders", {"Content-Type": "application/json", "Idempotency-Key": mark}, body)
    first = env.invoke(event)
    assert first.status == 200 and first.error_type is None, first.body[:300]
    again = env.invoke({**event, "requestContext": {**event["requestContext"], "requestId": marker()}})
    assert again.status == 200 and again.error_type is None, again.body[:300]
    replay = again.json()
    assert replay["statusCode"] == 200 and replay["isBase64Encoded"] is False
    assert {k.lower(): v for k, v in replay["headers"].items()} == {"content-type": "application/json",
                                                                     "idempotent-replayed": "true"}
    # API Gateway makes the first response a 200 whose body is that response's JSON text: the replay's body.
    assert replay["body"].encode("utf-8") == first.body
    assert executions.count(mark) == 1


# -- a chained wrapper whose handler wraps ours ----------------------------------------------------------------

_keys = st.one_of(_text, st.just(Colour.RED)).filter(lambda k: k != "red")  # keys that stay apart as JSON keys
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**100), 2**100), st.floats(), _text,
                     _unicode, st.sampled_from([Colour.BLUE, float("nan"), -0.0]), st.decimals(allow_nan=False))
# A top-level named tuple comes back as the dict the runtime makes of it, which a decorating wrapper then decorates.
_results = results_of(_scalars, _keys).filter(lambda v: not isinstance(v, (Point, Row)))


@pytest.fixture
def traced(tmp_path: Path, make_env: Any, shared_table: str, primary: str) -> Any:
    """An environment whose next wrapper points _HANDLER at otel_like.handler, which wraps ours; and its records."""
    next_wrapper = tmp_path / "otel-like-wrapper"
    next_wrapper.write_text('#!/bin/bash\nexport TRACED_HANDLER=$_HANDLER _HANDLER=otel_like.handler\nexec "$@"\n')
    next_wrapper.chmod(0o755)
    seen = tmp_path / "traced.jsonl"
    env = make_env(primary, shared_table, {"IDEMPOTENCY_NEXT_WRAPPER": str(next_wrapper), "TRACER_FILE": str(seen)})

    def records(mark: str) -> list[dict[str, Any]]:
        lines = seen.read_text().splitlines() if seen.exists() else []
        return [r for r in map(json.loads, lines) if r["marker"] == mark]

    env.records = records
    return env


def test_a_chained_wrapper_reads_the_status_code_and_decorates_on_both_paths(traced: Any,
                                                                              executions: Executions) -> None:
    for value in ({"statusCode": 201, "headers": {"content-type": "application/json"}, "body": '{"id": 1}'},
                  {"statusCode": 200, "price": Decimal("19.990"), "nan": float("nan"), "n": 2**70, "t": "caf\u00e9"}):
        event = {"marker": marker(), "action": "pickled", "value": pickled(value)}
        first, again = traced.invoke(event), traced.invoke(event)
        assert first.error_type is None, first.body[:300]
        assert again.body == first.body
        assert first.json()["traced"] == value["statusCode"]  # the decoration reached the caller, both times
        assert traced.records(event["marker"]) == [{"marker": event["marker"], "type": "dict",
                                                    "status": value["statusCode"]}] * 2
        assert executions.count(event["marker"]) == 1


@PROPERTY
@example(value={"price": Decimal("1.50"), "e": Decimal("1E+5"), "inf": float("inf"), 1.5: b"raw", "x": (1, 2)})
@example(value=b"\x00\xff raw")
@example(value={"d": Colour.BLUE, "row": Row(p=Point(1, [Decimal("-0")]))})
@given(value=_results)
def test_a_chained_wrapper_gets_the_handlers_kind_of_value_and_the_same_bytes(traced: Any, executions: Executions,
                                                                              value: Any) -> None:
    event = {"marker": marker(), "action": "pickled", "value": pickled(value)}
    first = traced.invoke(event)
    again = traced.invoke(event)
    if not same_as_first(first, again, executions, event["marker"]):
        return
    restored = {tuple: "list", Colour: "str"}.get(type(value), type(value).__name__)  # as the runtime marshals them
    assert [r["type"] for r in traced.records(event["marker"])] == [type(value).__name__, restored]


def test_a_record_stored_before_the_wrapper_was_chained_replays_as_a_value(
        traced: Any, environments: Environments, shared_table: str, primary: str, executions: Executions) -> None:
    """Turning chaining on: a record holding the runtime's text replays as a value the runtime marshals back to it."""
    plain = environments.shared(primary, shared_table)  # same function, same table: same keys
    value = {"statusCode": 200, "price": Decimal("1.50"), "e": Decimal("1E+5"), "f": 0.1, "n": 2**70,
             "nan": float("nan"), "t": "caf\u00e9", "l": [Decimal("-0"), 1e16]}
    event = {"marker": marker(), "action": "pickled", "value": pickled(value)}
    first = plain.invoke(event)
    assert first.error_type is None, first.body[:300]
    again = traced.invoke(event)
    assert again.body == first.body[:-1] + b', "traced": 200}'  # the same text, decorated by the wrapper
    assert traced.records(event["marker"]) == [{"marker": event["marker"], "type": "dict", "status": 200}]
    assert executions.count(event["marker"]) == 1
