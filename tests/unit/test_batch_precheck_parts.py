"""The batch pre-check's pure parts: when a batch shows redelivery, the setting, and the cycle's mode check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.config import load
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyConfigurationError
from idempotency_layer.invocation import Invocation
from idempotency_layer.sources.redelivery import shows_redelivery
from tests.support import events

BASE = {"IDEMPOTENCY_TABLE": "orders-idem", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
        "AWS_LAMBDA_FUNCTION_NAME": "orders"}


def test_a_first_delivery_shows_none_and_a_second_one_shows_it():
    batch_ = [events.json_message({"id": i}) for i in range(3)]
    assert not shows_redelivery(events.sqs_event(batch_)["Records"])
    assert shows_redelivery(events.sqs_event(batch_)["Records"])


def test_one_redelivered_record_is_enough():
    fresh, again = events.json_message({"id": 1}), events.json_message({"id": 2})
    events.sqs_event([again])
    assert shows_redelivery(events.sqs_event([fresh, again])["Records"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.none(), st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=1),
    st.fixed_dictionaries({"attributes": st.one_of(st.none(), st.text(max_size=2), st.fixed_dictionaries(
        {"ApproximateReceiveCount": st.one_of(st.none(), st.integers(-2, 3), st.text("0123\u0665 +-", max_size=3))}
    ))}),
), max_size=5))
def test_only_a_whole_receive_count_above_1_is_a_sign(records):
    def count(record):
        attributes = record.get("attributes") if isinstance(record, dict) else None
        value = attributes.get("ApproximateReceiveCount") if isinstance(attributes, dict) else None
        return int(value) if isinstance(value, str) and value and all(c in "0123456789" for c in value) else 0

    assert shows_redelivery(records) == any(count(record) > 1 for record in records)


def test_an_amazon_mq_message_marked_redelivered_is_a_sign():
    from tests.support import broker_events

    messages = [broker_events.rabbitmq_message({"id": 1}), broker_events.activemq_message({"id": 2}, "ID:2")]
    assert not shows_redelivery(broker_events.activemq_event(messages[1:])["messages"])
    assert shows_redelivery(broker_events.activemq_event(messages[1:], redelivered=True)["messages"])
    again = broker_events.rabbitmq_event({"orders::/": messages[:1]}, redelivered=True)
    assert shows_redelivery([messages[0], *again["rmqMessagesByQueue"]["orders::/"]])
    assert not shows_redelivery([{**messages[0], "redelivered": "true"}])  # only the boolean the broker sends


def test_streams_carry_no_sign():
    records = [events.kinesis_record({"id": 1}), events.dynamodb_record("a")]
    assert not shows_redelivery(records)


@pytest.mark.parametrize("value, expected", [(None, "auto"), ("always", "always"), (" Never ", "never"),
                                             ("AUTO", "auto"), ("", "auto")])
def test_the_setting(value, expected):
    env = BASE if value is None else {**BASE, "IDEMPOTENCY_BATCH_PRECHECK": value}
    assert load(env).batch_precheck == expected


def test_a_bad_setting_names_the_variable_and_the_choices():
    with pytest.raises(IdempotencyConfigurationError, match=r"IDEMPOTENCY_BATCH_PRECHECK.*auto, always, never"):
        load({**BASE, "IDEMPOTENCY_BATCH_PRECHECK": "sometimes"})


class Unreachable:
    def read(self, keys, deadline=None):
        raise AssertionError("no read expected")


@pytest.mark.parametrize("mode, redelivered, keys", [("never", True, 5), ("auto", False, 5), ("always", True, 1),
                                                      ("auto", True, 1)])
def test_no_read_when_none_is_due(mode, redelivered, keys):
    cycle = Cycle(Unreachable(), ttl_seconds=60, precheck=mode)  # type: ignore[arg-type]
    assert cycle.precheck(Invocation(60_000), {f"k{i}": None for i in range(keys)}, redelivered) == {}


def test_the_precheck_module_is_imported_only_when_a_batch_is_pre_checked():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (
        "import sys\n"
        "from idempotency_layer.cycle import Cycle\n"
        "from idempotency_layer.invocation import Invocation\n"
        "class Store:\n"
        "    def read(self, keys, deadline=None):\n"
        "        return {}, []\n"
        "cycle = Cycle(Store(), ttl_seconds=60)\n"
        "cycle.precheck(Invocation(60_000), {'k1': None, 'k2': None}, redelivered=False)\n"
        "print('idempotency_layer.precheck' in sys.modules)\n"
        "cycle.precheck(Invocation(60_000), {'k1': None, 'k2': None}, redelivered=True)\n"
        "print('idempotency_layer.precheck' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": f"{root / 'layer'}:{root}", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "True"]
