"""The layer's behaviour end to end, on one Python (`primary`): the built zip under RIE + awslambdaric,
records in DynamoDB Local, executions counted from the user handler's own side effect.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import (
    FUNCTION,
    Environments,
    Executions,
    get_record,
    marker,
    record_id,
    scan_count,
)
from tests.support.dynamodb_local import DynamoDBLocal, create_table, wait_for
from tests.support.fault_proxy import LATENCY, FaultProxy
from tests.support.rie import Invocation, LambdaEnvironment

IN_PROGRESS = "IdempotencyAlreadyInProgressError"
ORDER_KEY = {"IDEMPOTENCY_KEY_JMESPATH": "powertools_json(body).orderId", "IDEMPOTENCY_KEY_PREFIX": "orders"}


def _fire_together(envs: list[LambdaEnvironment], event: Any) -> tuple[list[Invocation], list[threading.Thread]]:
    """Invoke every environment with `event` at once (a barrier); answers arrive in `answers` as they come."""
    answers: list[Invocation] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(envs))

    def fire(env: LambdaEnvironment) -> None:
        barrier.wait()
        answer = env.invoke(event)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=fire, args=(env,), daemon=True) for env in envs]
    for thread in threads:
        thread.start()
    return answers, threads


def test_handler_error_releases_the_claim(primary: str, environments: Environments, shared_table: str,
                                          executions: Executions, ddb_client: Any) -> None:
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "raise"}
    first = env.invoke(event)
    assert first.error_type == "ValueError", first.body
    assert f"handler failed for {event['marker']}" in first.error_message
    assert get_record(ddb_client, shared_table, record_id(event)) is None
    retry = env.invoke(event)
    assert retry.error_type == "ValueError", retry.body  # ran again, not "in progress" and not a replay
    assert executions.count(event["marker"]) == 2


def test_concurrent_environments_run_once(primary: str, environments: Environments, shared_table: str,
                                          executions: Executions, tmp_path: Path) -> None:
    envs = [environments.shared(primary, shared_table, index=i) for i in range(4)]
    for env in envs:  # warm: the race must be between claims, not between cold starts
        assert env.invoke({"marker": marker(), "action": "info"}).status == 200
    release = tmp_path / "release"
    event = {"marker": marker(), "action": "block", "release": str(release)}
    answers, threads = _fire_together(envs, event)
    try:
        # The winner is held inside the handler until the release file exists; the others answer now.
        wait_for(lambda: len(answers) >= 3, 30, "three environments to answer")
        assert [a.error_type for a in answers] == [IN_PROGRESS] * 3, [a.body for a in answers]
        assert "another invocation is running key" in answers[0].error_message
        assert executions.count(event["marker"]) == 1
    finally:
        release.touch()
        for thread in threads:
            thread.join(60)
    assert len(answers) == 4
    winner = answers[3]
    assert winner.error_type is None, winner.body
    assert executions.count(event["marker"]) == 1
    assert all(env.invoke(event).body == winner.body for env in envs)  # every environment replays it
    assert executions.count(event["marker"]) == 1


def test_timed_out_claim_is_taken_after_its_deadline(primary: str, make_env: Any, shared_table: str,
                                                     executions: Executions, ddb_client: Any,
                                                     tmp_path: Path) -> None:
    first, second = (make_env(primary, shared_table, timeout=2) for _ in range(2))
    for env in (first, second):
        assert env.invoke({"marker": marker(), "action": "info"}).status == 200
    # Blocks (until Lambda's timeout kills it) on the first execution only; the release file never appears.
    event = {"marker": marker(), "action": "block", "block_first": True, "release": str(tmp_path / "never")}
    timed_out: list[Invocation] = []
    runner = threading.Thread(target=lambda: timed_out.append(first.invoke(event)), daemon=True)
    runner.start()
    key = record_id(event)
    record = wait_for(lambda: get_record(ddb_client, shared_table, key), 10, "the first invocation's claim")
    assert record["status"] == {"S": "INPROGRESS"}
    deadline_ms = int(record["in_progress_until"]["N"])
    # A retry is refused until the claim's deadline; after it, one retry takes the abandoned claim and runs.
    refused: list[float] = []

    def retry() -> Invocation | None:
        started = time.time()
        answer = second.invoke(event)
        if answer.error_type == IN_PROGRESS:
            refused.append(started)
            assert started * 1000 <= deadline_ms + 1000, "still refused well after the claim's deadline"
            return None
        assert time.time() * 1000 >= deadline_ms, f"claimed before the deadline: {answer.body!r}"
        return answer

    won = wait_for(retry, 20, "a retry to claim the timed-out record")
    runner.join(30)
    assert refused and refused[0] * 1000 < deadline_ms
    assert b"timed out" in timed_out[0].body.lower(), timed_out[0].body
    assert won.error_type is None, won.body
    assert won.json()["execution"] == 2
    assert time.time() * 1000 >= deadline_ms
    assert executions.count(event["marker"]) == 2
    assert first.invoke(event).body == won.body  # the environment that timed out now replays it
    assert executions.count(event["marker"]) == 2


def test_a_held_completion_still_answers_before_the_functions_timeout(primary: str, make_env: Any, ddb_client: Any,
                                                                       dynamodb: Any, executions: Executions) -> None:
    # DynamoDB holds the completion write 6 s, past the function's 3 s timeout, and the client would wait 10 s
    # for it: the invocation still answers with the handler's result in time. Timed out instead, it would be
    # retried by its caller, and that copy would run the handler again if the write had not landed.
    table = create_table(ddb_client, f"idempotency-held-{uuid.uuid4().hex[:8]}")
    upstream = urlparse(dynamodb.endpoint)
    try:
        with FaultProxy(upstream.hostname, upstream.port, {LATENCY: 1.0}, spike=(6.0, 6.0),
                        operations={"UpdateItem"}) as proxy:
            env = make_env(primary, table, {"AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint,
                                            "IDEMPOTENCY_READ_TIMEOUT": "10"}, timeout=3)
            event = {"marker": marker(), "action": "random"}
            answer = env.invoke(event)
            assert b"timed out" not in answer.body.lower() and answer.error_type is None, answer.body
            assert set(answer.json()) == {"id", "at", "pid"}
            assert executions.count(event["marker"]) == 1
            assert proxy.operations()["UpdateItem"] == {LATENCY: 1}  # one attempt, cut short
            assert "completing key" in env.logs()  # the failure is logged, not hidden
            env.stop()
    finally:
        ddb_client.delete_table(TableName=table)


def test_expired_record_runs_again(primary: str, environments: Environments, shared_table: str,
                                   executions: Executions, ddb_client: Any) -> None:
    # The expiry in an attribute DynamoDB Local's TTL sweep does not watch, so the record can be read back.
    env = environments.shared(primary, shared_table, {"IDEMPOTENCY_TTL_SECONDS": "1",
                                                      "IDEMPOTENCY_EXPIRES_AT_ATTR": "kept_until"})
    event = {"marker": marker(), "action": "random"}
    first = env.invoke(event)
    assert first.error_type is None, first.body
    expires_at = int(get_record(ddb_client, shared_table, record_id(event))["kept_until"]["N"])
    assert expires_at <= time.time() + 2
    # Expired once the clock is past expires_at (DynamoDB's TTL deletion is lazy; the layer must not rely on it).
    wait_for(lambda: int(time.time()) > expires_at, 5, "the record to expire")
    again = env.invoke(event)
    assert again.error_type is None, again.body
    assert again.body != first.body
    assert executions.count(event["marker"]) == 2


def test_key_from_json_body(primary: str, environments: Environments, shared_table: str,
                            executions: Executions, ddb_client: Any) -> None:
    env = environments.shared(primary, shared_table, ORDER_KEY)
    order = marker()
    mark = marker()

    def event(note: str) -> dict[str, Any]:
        return {"marker": mark, "action": "random", "body": json.dumps({"orderId": order, "note": note})}

    first, second = env.invoke(event("first")), env.invoke(event("second, another request id"))
    assert first.error_type is None, first.body
    assert second.body == first.body
    assert executions.count(mark) == 1
    record = get_record(ddb_client, shared_table, record_id(order, prefix="orders"))
    assert record is not None and record["status"] == {"S": "COMPLETED"}

    other = {"marker": mark, "action": "random", "body": json.dumps({"orderId": marker()})}
    assert env.invoke(other).body != first.body
    assert executions.count(mark) == 2


def test_key_is_taken_before_the_handler_mutates_the_event(primary: str, environments: Environments,
                                                           shared_table: str, executions: Executions,
                                                           ddb_client: Any) -> None:
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "mutate", "payload": [1, 2, 3]}
    first, second = env.invoke(event), env.invoke(event)
    assert first.error_type is None, first.body
    assert second.body == first.body
    assert executions.count(event["marker"]) == 1
    assert get_record(ddb_client, shared_table, record_id(event)) is not None
    assert get_record(ddb_client, shared_table, record_id({"mutated": True})) is None


def test_missing_key_runs_every_time_without_a_record(primary: str, make_env: Any, table: str,
                                                      executions: Executions, ddb_client: Any) -> None:
    env = make_env(primary, table, ORDER_KEY)
    mark = marker()
    events = [{"marker": mark, "action": "random"}]  # no body at all: powertools_json(null) selects nothing
    events += [{"marker": mark, "action": "random", "body": json.dumps(body)}
               for body in ({"customer": "c-1"}, {"orderId": None}, {"orderId": ""})]
    for event in events:
        assert env.invoke(event).error_type is None
        assert env.invoke(event).error_type is None
    assert executions.count(mark) == 2 * len(events)
    assert scan_count(ddb_client, table) == 0
    assert "selected nothing from the event" in env.logs()


def test_expression_that_cannot_apply_is_a_key_error(primary: str, environments: Environments,
                                                     shared_table: str, executions: Executions) -> None:
    """A body that is not JSON is not "no key": the handler does not run, and the error says why."""
    env = environments.shared(primary, shared_table, ORDER_KEY)
    event = {"marker": marker(), "action": "random", "body": "orderId=42"}
    answer = env.invoke(event)
    assert answer.error_type == "IdempotencyKeyError", answer.body
    assert "could not be applied" in answer.error_message
    assert executions.count(event["marker"]) == 0


def test_event_with_an_integer_beyond_64_bits(primary: str, environments: Environments, shared_table: str,
                                              executions: Executions, ddb_client: Any) -> None:
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "random", "amount": 2**70 + 1}
    first, second = env.invoke(event), env.invoke(event)
    assert first.error_type is None, first.body
    assert second.body == first.body
    assert executions.count(event["marker"]) == 1
    assert get_record(ddb_client, shared_table, record_id(event)) is not None


def test_missing_key_is_refused_when_required(primary: str, make_env: Any, table: str,
                                              executions: Executions, ddb_client: Any) -> None:
    env = make_env(primary, table, {**ORDER_KEY, "IDEMPOTENCY_REQUIRE_KEY": "true"})
    event = {"marker": marker(), "action": "random", "body": json.dumps({"customer": "c-1"})}
    answer = env.invoke(event)
    assert answer.error_type == "IdempotencyKeyError", answer.body
    assert "powertools_json(body).orderId" in answer.error_message
    assert executions.count(event["marker"]) == 0
    assert scan_count(ddb_client, table) == 0
    keyed = {**event, "body": json.dumps({"orderId": marker()})}
    assert env.invoke(keyed).error_type is None
    assert executions.count(event["marker"]) == 1


def test_one_megabyte_result(primary: str, environments: Environments, shared_table: str,
                             executions: Executions) -> None:
    """1 MB of repetitive JSON compresses under DynamoDB's 400 KB item limit, so it replays byte for byte."""
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "big", "size": 1_000_000, "seed": 7}
    first = env.invoke(event)
    assert first.error_type is None, first.body[:300]
    assert len(first.body) >= 1_000_000
    second = env.invoke(event)
    assert second.body == first.body, second.body[:300]
    assert executions.count(event["marker"]) == 1


def test_result_that_cannot_be_stored(primary: str, environments: Environments, shared_table: str,
                                      executions: Executions, ddb_client: Any) -> None:
    """1 MB of random hex does not compress under 400 KB: the first caller gets it, a repeat is told why not."""
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "big", "size": 1_000_000, "compressible": False}
    first = env.invoke(event)
    assert first.error_type is None, first.body[:300]
    assert len(first.body) >= 1_000_000
    second = env.invoke(event)
    assert second.error_type == "IdempotencyResultTooLargeError", second.body[:300]
    assert executions.count(event["marker"]) == 1  # it did run once, so a repeat must not run it again
    record = get_record(ddb_client, shared_table, record_id(event))
    assert record["status"] == {"S": "COMPLETED"}


@pytest.mark.parametrize("cache", ["no cache", "local cache"])
def test_a_result_the_runtime_cannot_send_is_completed_and_never_run_again(
        primary: str, environments: Environments, shared_table: str, executions: Executions, ddb_client: Any,
        cache: str) -> None:
    """Issue 29: the handler charged, returned a value the runtime cannot send; the claim used to be released and
    each copy charged again."""
    settings = {"IDEMPOTENCY_LOCAL_CACHE_SIZE": "8"} if cache == "local cache" else {}
    env = environments.shared(primary, shared_table, settings)
    other = environments.shared(primary, shared_table, {**settings, "IDEMPOTENCY_LOG_LEVEL": "INFO"})
    event = {"marker": marker(), "action": "unmarshallable"}
    first = env.invoke(event)
    assert first.error_type == "Runtime.MarshalError", first.body  # the runtime's own error, as without the layer
    record = get_record(ddb_client, shared_table, record_id(event))
    assert record["status"] == {"S": "COMPLETED"}
    assert (record["result_format"], record["result"]) == ({"S": "undeliverable"}, {"S": "object"})
    for copy in (env.invoke(event), env.invoke(event), other.invoke(event)):
        assert copy.error_type == "IdempotencyResultUndeliverableError", copy.body
        assert "could not send the result its handler returned (of type object" in copy.error_message
    assert executions.count(event["marker"]) == 1


def test_dynamodb_down_fails_closed(primary: str, make_env: Any, executions: Executions,
                                    tmp_path: Path) -> None:
    """The layer never runs the handler without a record: it fails with an error naming the table."""
    if os.environ.get("LOCALSTACK_HOST") and shutil.which("java") is None:
        pytest.skip("needs Java for a DynamoDB Local of its own to stop")
    server = DynamoDBLocal(tmp_path / "dynamodb.log").start()  # its own: stopping it disturbs no other test
    try:
        from tests.conftest import ddb_session

        client = ddb_session(server.endpoint).client("dynamodb")
        table = create_table(client, "fail-closed")
        env = make_env(primary, table, {"AWS_ENDPOINT_URL_DYNAMODB": server.endpoint})
        mark = marker()
        assert env.invoke({"marker": mark, "action": "random", "n": 0}).error_type is None

        server.stop()
        down = env.invoke({"marker": mark, "action": "random", "n": 1}, timeout=120)
        assert down.error_type == "IdempotencyPersistenceLayerError", down.body
        assert "fail-closed" in down.error_message
        assert executions.count(mark) == 1

        server.start()  # back, but empty: the table is gone
        missing = env.invoke({"marker": mark, "action": "random", "n": 2})
        assert missing.error_type == "IdempotencyPersistenceLayerError", missing.body
        assert "fail-closed" in missing.error_message
        assert executions.count(mark) == 1

        create_table(client, "fail-closed")
        event = {"marker": mark, "action": "random", "n": 3}
        ok = env.invoke(event)
        assert ok.error_type is None, ok.body
        assert env.invoke(event).body == ok.body
        assert executions.count(mark) == 2
    finally:
        server.stop()


@pytest.mark.parametrize(("setting", "value"), [
    ("IDEMPOTENCY_TTL_SECONDS", "abc"),
    ("IDEMPOTENCY_REQUIRE_KEY", "maybe"),
    ("IDEMPOTENCY_TRANSPORT", "carrier-pigeon"),
    ("IDEMPOTENCY_KEY_JMESPATH", "orders[?"),
    ("IDEMPOTENCY_LOG_LEVEL", "LOUD"),
    ("IDEMPOTENCY_TABLE", ""),
    ("IDEMPOTENCY_KEY_JMESPATH", "powertools_jsno(body)"),
    ("IDEMPOTENCY_SORT_KEY_ATTR", "sk"),  # the shared table has a partition key only
    ("IDEMPOTENCY_KEY_ATTR", "pk"),
])
def test_bad_setting_fails_init(primary: str, make_env: Any, shared_table: str, executions: Executions,
                                setting: str, value: str) -> None:
    env = make_env(primary, shared_table, {setting: value})
    event = {"marker": marker(), "action": "random"}
    answer = env.invoke(event)
    assert answer.error_type == "IdempotencyConfigurationError", answer.body
    assert setting in answer.error_message
    if value:
        assert value in answer.error_message
    assert executions.count(event["marker"]) == 0
    assert env.invoke(event).error_type == "IdempotencyConfigurationError"  # every init fails the same way


def test_a_mistyped_key_setting_fails_init_instead_of_keying_on_the_whole_event(
        primary: str, make_env: Any, shared_table: str, executions: Executions) -> None:
    """Issue 29: IDEMPOTENCY_KEY_JMESPAHT (sic) used to be ignored, the key fell back to the whole event, and two
    retries that differed only in requestedAt both charged."""
    env = make_env(primary, shared_table, {"IDEMPOTENCY_KEY_JMESPAHT": "paymentId"})
    mark = marker()
    retries = [{"marker": mark, "action": "random", "paymentId": "p-1", "requestedAt": at} for at in ("10:00", "10:01")]
    for event in retries:
        answer = env.invoke(event)
        assert answer.error_type == "IdempotencyConfigurationError", answer.body
        assert answer.error_message.startswith("IDEMPOTENCY_KEY_JMESPAHT is set, but it is not a setting of this "
                                               "layer (did you mean IDEMPOTENCY_KEY_JMESPATH?)")
    assert executions.count(mark) == 0


@pytest.mark.parametrize(("handler", "error_type", "named"), [
    ("no_such_module.handler", "Runtime.ImportModuleError", "no_such_module"),
    ("app.no_such_function", "Runtime.HandlerNotFound", "no_such_function"),
])
def test_bad_user_handler_fails_init_naming_it(primary: str, make_env: Any, shared_table: str,
                                               handler: str, error_type: str, named: str) -> None:
    env = make_env(primary, shared_table, handler=handler)
    answer = env.invoke({"marker": marker(), "action": "random"})
    assert answer.error_type == error_type, answer.body
    assert named in answer.error_message
    assert "idempotency_layer" not in answer.error_message


def test_container_image_entrypoint(primary: str, environments: Environments, shared_table: str,
                                    executions: Executions, ddb_client: Any) -> None:
    """ENTRYPOINT ["/opt/idempotency-wrapper", "python", "-m", "awslambdaric"], CMD ["app.handler"]."""
    env = environments.shared(primary, shared_table, image=True)
    info = env.invoke({"marker": marker(), "action": "info"})
    assert info.error_type is None, info.body
    assert info.json()["original_handler"] == "app.handler"
    event = {"marker": marker(), "action": "random"}
    first, second = env.invoke(event), env.invoke(event)
    assert first.error_type is None, first.body
    assert second.body == first.body
    assert executions.count(event["marker"]) == 1
    assert get_record(ddb_client, shared_table, record_id(event))["status"] == {"S": "COMPLETED"}


@pytest.mark.parametrize("settings", [{"IDEMPOTENCY_TRANSPORT": "boto3"}, {"IDEMPOTENCY_LOCAL_CACHE_SIZE": "16"}],
                         ids=["boto3-transport", "local-cache"])
def test_same_event_twice_with(primary: str, environments: Environments, shared_table: str,
                               executions: Executions, settings: dict[str, str]) -> None:
    env = environments.shared(primary, shared_table, settings)
    event = {"marker": marker(), "action": "random"}
    answers = [env.invoke(event) for _ in range(3)]
    assert answers[0].error_type is None, answers[0].body
    assert answers[1].body == answers[2].body == answers[0].body
    assert executions.count(event["marker"]) == 1
    failing = {"marker": marker(), "action": "raise"}
    assert [env.invoke(failing).error_type for _ in range(2)] == ["ValueError"] * 2
    assert executions.count(failing["marker"]) == 2


def test_disabled_passes_through(primary: str, make_env: Any, table: str, executions: Executions,
                                 ddb_client: Any) -> None:
    env = make_env(primary, table, {"IDEMPOTENCY_DISABLED": "true"})
    event = {"marker": marker(), "action": "random"}
    assert env.invoke(event).body != env.invoke(event).body
    assert executions.count(event["marker"]) == 2
    assert scan_count(ddb_client, table) == 0


def test_default_prefix_is_the_function_name(primary: str, environments: Environments, shared_table: str,
                                             ddb_client: Any) -> None:
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "random"}
    assert env.invoke(event).error_type is None
    record = get_record(ddb_client, shared_table, record_id(event, prefix=FUNCTION))
    assert record is not None
    assert set(record) >= {"id", "status", "expires_at", "owner"}
    assert record["status"] == {"S": "COMPLETED"}


def test_a_chained_wrapper_sees_the_same_kind_of_result_on_both_paths(primary: str, make_env: Any,
                                                                       shared_table: str, executions: Executions,
                                                                       tmp_path: Path) -> None:
    """IDEMPOTENCY_NEXT_WRAPPER: the next wrapper points _HANDLER at its own handler, which calls ours."""
    next_wrapper = tmp_path / "tracer-wrapper"
    next_wrapper.write_text('#!/bin/bash\nexport TRACED_HANDLER=$_HANDLER _HANDLER=tracer.handler\nexec "$@"\n')
    next_wrapper.chmod(0o755)
    seen = tmp_path / "types"
    env = make_env(primary, shared_table, {"IDEMPOTENCY_NEXT_WRAPPER": str(next_wrapper),
                                           "TRACER_FILE": str(seen)})
    for kind in ("decimal", "bytes", "none"):
        event = {"marker": marker(), "action": "result", "result": kind}
        first, second = env.invoke(event), env.invoke(event)
        assert first.error_type is None, first.body
        assert second.body == first.body
        assert executions.count(event["marker"]) == 1
    types = seen.read_text().splitlines()
    assert len(types) == 6
    # The handler's own kind of value, not the runtime's raw JSON: a tracer reads a dict's statusCode.
    assert types == ["dict", "dict", "bytes", "bytes", "NoneType", "NoneType"], types
