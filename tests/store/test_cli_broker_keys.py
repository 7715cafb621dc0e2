"""`key` agrees with the layer on Kafka and Amazon MQ batches: over generated events and settings, the keys the CLI
derives are exactly the keys the layer stores when it serves the event on DynamoDB Local; the printed keys (a
subprocess, `key --json`) likewise for one event of each source (issue 23)."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.cli.derive import derive, keys_of
from tests.store.test_cli_commands import cli_env, run
from tests.store.test_cli_keys import config_for, layer, stored  # noqa: F401  (layer: the fixture)
from tests.support import broker_events as brokers

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_prefixes = itertools.count()
ORDERS = st.sampled_from(["o-1", "o-2", ""])
EXPRESSIONS = {"kafka": "powertools_json(powertools_base64(value)).orderId",
               "mq": "powertools_json(powertools_base64(data)).orderId"}


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["msk", "self-managed", "activemq", "rabbitmq"]))
    env = {}
    if draw(st.booleans()):
        env["IDEMPOTENCY_KEY_JMESPATH"] = EXPRESSIONS["kafka" if kind in ("msk", "self-managed") else "mq"]
    env["IDEMPOTENCY_REQUIRE_KEY"] = draw(st.sampled_from(["false", "true"]))
    orders = draw(st.lists(ORDERS, min_size=1, max_size=5))
    if kind in ("msk", "self-managed"):
        records = [brokers.kafka_record("orders", draw(st.integers(0, 1)), offset, {"orderId": order})
                   for offset, order in enumerate(orders)]
        records.sort(key=lambda r: r["partition"])
        return kind, env, brokers.kafka_event(records, kind == "self-managed")
    if kind == "activemq":
        return kind, env, brokers.activemq_event(
            [brokers.activemq_message({"orderId": order}, f"ID:{i}") for i, order in enumerate(orders)])
    with_ids = draw(st.booleans())
    return kind, env, brokers.rabbitmq_event({"orders::/": [
        brokers.rabbitmq_message({"orderId": order}, f"m-{i}" if with_ids else None) for i, order in
        enumerate(orders)]})


@PROPERTY
@given(case=cases())
def test_key_is_what_the_layer_stores_for_kafka_and_mq(layer, ddb_client, table, case):  # noqa: F811
    kind, env, event = case
    prefix = f"b{next(_prefixes)}"
    config = config_for(env, table, prefix)
    facts = derive(config, copy.deepcopy(event))
    layer(config, copy.deepcopy(event))
    assert facts["source"] == "batch", facts
    assert set(keys_of(facts)) == stored(ddb_client, table, prefix), (kind, env, facts)


@pytest.mark.parametrize("kind", ["kafka", "activemq", "rabbitmq"])
def test_the_printed_kafka_and_mq_keys_are_what_the_layer_stores(layer, layer_env, ddb_client, table, tmp_path,  # noqa: F811
                                                                 kind):
    event = {
        "kafka": brokers.kafka_event([brokers.kafka_record("orders", 0, 4, {"n": 1}),
                                      brokers.kafka_record("orders", 1, 9, {"n": 2})]),
        "activemq": brokers.activemq_event([brokers.activemq_message({"n": 1})]),
        "rabbitmq": brokers.rabbitmq_event({"orders::/": [brokers.rabbitmq_message({"n": 1})]}),
    }[kind]
    prefix = f"printed-{kind}"
    (tmp_path / "event.json").write_text(json.dumps(event))
    done = run({**cli_env(layer_env.endpoint, table), "IDEMPOTENCY_KEY_PREFIX": prefix},
               "key", "--event", str(tmp_path / "event.json"), "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)["keys"]
    assert printed
    text = run({**cli_env(layer_env.endpoint, table), "IDEMPOTENCY_KEY_PREFIX": prefix}, "key", "--event", "-",
               stdin=json.dumps(event))
    assert all(key in text.stdout for key in printed)
    assert {"kafka": "source: Kafka batch of 2", "activemq": "source: ActiveMQ batch of 1",
            "rabbitmq": "source: RabbitMQ batch of 1"}[kind] in text.stdout
    layer(config_for({}, table, prefix), event)
    assert set(printed) == stored(ddb_client, table, prefix)
