"""IDEMPOTENCY_STORE=valkey end to end: the built layer under RIE + awslambdaric, on real Redis OSS 7 and Valkey 9
servers. Executions are counted from the handlers' own side effect; commands from the server's own INFO
commandstats; records read with the tests' own client (valkey-py)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.e2e.conftest import Environments, Executions, marker, record_id
from tests.support import events, http_events
from tests.support.valkey_server import KINDS, Server


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest, valkey_servers: dict[str, Server]) -> Server:
    return valkey_servers[request.param]


def settings(server: Server, **more: str) -> dict[str, str]:
    return {"IDEMPOTENCY_STORE": "valkey", "IDEMPOTENCY_VALKEY_URL": server.url, **more}


def stored(server: Server, key: str) -> dict[bytes, bytes]:
    import valkey

    client = valkey.Valkey(host="127.0.0.1", port=server.port)
    try:
        return client.hgetall(key)
    finally:
        client.close()


# The commands the layer sends. The server counts a script's own calls too (its HMGET, HGETALL): a count of reads
# is the layer's only where no script ran.
LAYER = {"evalsha", "eval", "hgetall", "hmget", "info"}


def commands(server: Server) -> dict[str, int]:
    """Calls of LAYER's commands since the last reset, as the server counts them."""
    import valkey

    client = valkey.Valkey(host="127.0.0.1", port=server.port)
    try:
        stats = client.info("commandstats")
        counts = {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}
        return {name: calls for name, calls in counts.items() if name in LAYER}
    finally:
        client.close()


def reset_counts(server: Server) -> None:
    assert server.command("CONFIG", "RESETSTAT") == b"+OK\r\n"


def test_same_event_twice_runs_once_on_every_python(python_version: str, environments: Environments,
                                                    executions: Executions, server: Server) -> None:
    env = environments.shared(python_version, "", settings(server))
    event = {"marker": marker(), "action": "random"}
    first, second = env.invoke(event), env.invoke(event)
    assert first.status == second.status == 200 and first.error_type is None, first.body
    assert second.body == first.body  # byte for byte: the random id and the timestamp replayed
    assert executions.count(event["marker"]) == 1
    record = stored(server, record_id(event))
    assert record[b"s"] == b"COMPLETED" and record[b"f"] and record[b"r"]


def test_requests_per_path(primary: str, environments: Environments, executions: Executions,
                           server: Server) -> None:
    env = environments.shared(primary, "", settings(server))
    env.invoke({"marker": marker(), "action": "random"})  # warm: the scripts loaded
    event = {"marker": marker(), "action": "random"}
    reset_counts(server)
    assert env.invoke(event).error_type is None
    assert commands(server) == {"evalsha": 2}  # claim, complete
    reset_counts(server)
    env.invoke(event)
    assert commands(server) == {"evalsha": 1, "hmget": 1, "hgetall": 1}  # replay: the claim, which returns the
    # record it found (its script's HMGET and HGETALL): one request
    assert executions.count(event["marker"]) == 1


def test_a_redelivered_batch_is_read_in_one_pipeline_and_runs_each_message_once(
        primary: str, environments: Environments, executions: Executions, server: Server) -> None:
    env = environments.shared(primary, "", settings(server), handler="consumer.handler")
    messages = [events.json_message({"marker": marker()}) for _ in range(5)]
    first = env.invoke(events.sqs_event(messages))
    assert first.status == 200 and first.json() is None, first.body
    reset_counts(server)
    again = env.invoke(events.sqs_event(messages))  # ApproximateReceiveCount 2: the pre-check reads first
    assert again.json() == {"batchItemFailures": []}, again.body
    assert commands(server) == {"hmget": 5}  # five reads (pipelined: tests/store/test_valkey_store.py), no claim
    assert [executions.count(json.loads(m.body)["marker"]) for m in messages] == [1] * 5
    assert stored(server, record_id(messages[0].message_id))[b"f"] == b"done"


def test_an_http_request_replays_and_a_reused_key_with_another_body_is_refused(
        primary: str, environments: Environments, executions: Executions, server: Server) -> None:
    env = environments.shared(primary, "", settings(server), handler="web.handler")
    key, mark = str(uuid.uuid4()), marker()
    request = http_events.v2("POST", "/orders", {"Idempotency-Key": key}, json.dumps({"marker": mark}))
    first, second = env.invoke(request).json(), env.invoke(request).json()
    assert first["statusCode"] == second["statusCode"] == 201 and second["body"] == first["body"]
    assert second["headers"]["Idempotent-Replayed"] == "true"
    other = http_events.v2("POST", "/orders", {"Idempotency-Key": key}, json.dumps({"marker": marker()}))
    assert env.invoke(other).json()["statusCode"] == 422
    assert executions.count(mark) == 1


def test_an_evicting_server_fails_init(primary: str, make_env: Any, executions: Executions) -> None:
    lossy = Server("valkey9", policy="allkeys-lru").start()
    try:
        env = make_env(primary, "", settings(lossy))
        event = {"marker": marker(), "action": "random"}
        answer = env.invoke(event)
        assert answer.error_type == "IdempotencyConfigurationError", answer.body
        assert "maxmemory-policy is 'allkeys-lru'" in answer.error_message
        assert executions.count(event["marker"]) == 0
    finally:
        lossy.close()


def test_a_server_down_at_init_is_checked_before_the_first_claim(primary: str, make_env: Any,
                                                                 executions: Executions) -> None:
    late = Server("redis7")
    env = make_env(primary, "", settings(late, IDEMPOTENCY_CONNECT_TIMEOUT="0.2", IDEMPOTENCY_MAX_ATTEMPTS="1"))
    event = {"marker": marker(), "action": "random"}
    try:
        down = env.invoke(event)  # nothing listens: init warned, the claim's check fails, the handler does not run
        assert down.error_type == "IdempotencyPersistenceLayerError", down.body
        assert executions.count(event["marker"]) == 0
        late.start()
        first, second = env.invoke(event), env.invoke(event)
        assert first.error_type is None and second.body == first.body, first.body
        assert executions.count(event["marker"]) == 1
    finally:
        late.close()
