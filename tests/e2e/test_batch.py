"""Record scope end to end: the built layer under RIE + awslambdaric, an unmodified batch consumer
(apps/consumer.py), events shaped as Lambda's event source mappings send them, records in DynamoDB Local.

Executions are counted from the consumer's own side effect, one line per record it processed.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Environments, Executions, get_record, marker, record_id
from tests.support import events
from tests.support.dynamodb_local import wait_for
from tests.support.rie import Invocation, LambdaEnvironment

CONSUMER = "consumer.handler"
STREAM_CONSUMER = "stream_consumer.handler"  # AWS's documented stream handler: stops at its first failure
BODY_KEY = {"IDEMPOTENCY_KEY_JMESPATH": "json_parse(body).marker"}


def consumer(environments: Environments, version: str, table: str, env: dict[str, str] | None = None,
             index: int = 0) -> LambdaEnvironment:
    return environments.shared(version, table, env, index=index, handler=CONSUMER)


def order(**fields: Any) -> events.Message:
    return events.json_message({"marker": marker(), **fields})


def marker_of(message: events.Message) -> str:
    return json.loads(message.body)["marker"]


def failed(answer: Invocation) -> list[str]:
    assert answer.status == 200 and answer.error_type is None, answer.body
    value = answer.json()
    return [item["itemIdentifier"] for item in (value or {}).get("batchItemFailures", [])]


def test_a_redelivered_message_runs_once_and_its_record_keeps_no_result(
        python_version: str, environments: Environments, shared_table: str, executions: Executions,
        ddb_client: Any) -> None:
    env = consumer(environments, python_version, shared_table)
    messages = [order() for _ in range(3)]
    first = env.invoke(events.sqs_event(messages))
    assert first.json() is None, first.body  # no failures: the consumer's own answer, unchanged
    again = env.invoke(events.sqs_event(messages))  # new receipt handles, ApproximateReceiveCount 2
    assert again.json() == {"batchItemFailures": []}, again.body  # nothing passed, nothing failed
    assert [executions.count(marker_of(m)) for m in messages] == [1, 1, 1]
    item = get_record(ddb_client, shared_table, record_id(messages[0].message_id))
    assert item is not None and item["status"]["S"] == "COMPLETED"
    assert item["result_format"]["S"] == "done" and "result" not in item


def test_an_overlapping_redelivery_runs_only_the_new_messages(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    old, new = [order() for _ in range(4)], [order() for _ in range(3)]
    assert failed(env.invoke(events.sqs_event(old))) == []
    mixed = [old[0], new[0], old[1], new[1], new[2], old[3]]
    assert failed(env.invoke(events.sqs_event(mixed))) == []
    assert [executions.count(marker_of(m)) for m in old + new] == [1] * 7


def test_the_consumers_own_failures_are_reported_released_and_run_again(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    ok, flaky = order(), order(fail_first=True)
    assert failed(env.invoke(events.sqs_event([ok, flaky]))) == [flaky.message_id]
    # The queue redelivers only the failed message; the consumer succeeds with it this time.
    assert failed(env.invoke(events.sqs_event([flaky]))) == []
    assert failed(env.invoke(events.sqs_event([ok, flaky]))) == []  # both done now: neither runs again
    assert (executions.count(marker_of(ok)), executions.count(marker_of(flaky))) == (1, 2)


def test_the_consumer_raising_releases_every_claimed_record(
        primary: str, environments: Environments, shared_table: str, executions: Executions,
        ddb_client: Any) -> None:
    env = consumer(environments, primary, shared_table)
    done = order()
    assert failed(env.invoke(events.sqs_event([done]))) == []
    a, b = order(), order(**{"raise": True})
    answer = env.invoke(events.sqs_event([done, a, b]))
    assert answer.error_type == "RuntimeError", answer.body
    assert get_record(ddb_client, shared_table, record_id(a.message_id)) is None
    assert get_record(ddb_client, shared_table, record_id(b.message_id)) is None
    answer = env.invoke(events.sqs_event([done, a, b]))  # the whole batch comes back: the done one is skipped
    assert answer.error_type == "RuntimeError", answer.body
    assert [executions.count(marker_of(m)) for m in (done, a, b)] == [1, 2, 2]


def _hold(env: LambdaEnvironment, message_events: dict[str, Any], ddb_client: Any, table: str,
          held: events.Message) -> tuple[threading.Thread, list[Invocation]]:
    """Invoke `env` in the background; return once its claim on `held` is in the table."""
    answers: list[Invocation] = []
    thread = threading.Thread(target=lambda: answers.append(env.invoke(message_events)), daemon=True)
    thread.start()
    wait_for(lambda: get_record(ddb_client, table, record_id(held.message_id)) is not None, 30,
             "the first environment's claim")
    return thread, answers


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_a_message_in_progress_elsewhere_is_reported_and_fifo_stops_there(
        primary: str, environments: Environments, shared_table: str, executions: Executions,
        ddb_client: Any, tmp_path: Path, fifo: bool) -> None:
    holder = consumer(environments, primary, shared_table, index=1)
    other = consumer(environments, primary, shared_table, index=2)
    arn = events.queue_arn("orders", fifo=fifo)
    release = tmp_path / "release"
    before, busy, after = order(), events.json_message({"marker": marker(), "release": str(release)}), order()
    thread, answers = _hold(holder, events.sqs_event([busy], arn), ddb_client, shared_table, busy)
    try:
        reported = failed(other.invoke(events.sqs_event([before, busy, after], arn)))
    finally:
        release.touch()
        thread.join(60)
    assert failed(answers[0]) == []
    if fifo:  # the blocked message and everything after it come back, in order; nothing after it ran
        assert reported == [busy.message_id, after.message_id]
        assert [executions.count(marker_of(m)) for m in (before, busy, after)] == [1, 1, 0]
        assert get_record(ddb_client, shared_table, record_id(after.message_id)) is None  # its claim released
    else:
        assert reported == [busy.message_id]
        assert [executions.count(marker_of(m)) for m in (before, busy, after)] == [1, 1, 1]
    assert failed(other.invoke(events.sqs_event([busy, after], arn))) == []  # the redelivery finishes the rest
    assert [executions.count(marker_of(m)) for m in (before, busy, after)] == [1, 1, 1]


def test_kinesis_reports_sequence_numbers_and_keys_by_event_id(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    # This consumer goes on past a failure and reports exactly the records that failed: the records mode.
    env = consumer(environments, primary, shared_table, {"IDEMPOTENCY_STREAM_FAILURES": "records"})
    marks = [marker() for _ in range(3)]
    records = [events.kinesis_record({"marker": marks[0]}),
               events.kinesis_record({"marker": marks[1], "fail_first": True}),
               events.kinesis_record({"marker": marks[2]})]
    assert failed(env.invoke(events.stream_event(records))) == [records[1]["kinesis"]["sequenceNumber"]]
    # Kinesis retries from the failed record on: the same records, the same eventIDs.
    assert failed(env.invoke(events.stream_event(records[1:]))) == []
    assert [executions.count(m) for m in marks] == [1, 2, 1]


@pytest.mark.parametrize("source", ["kinesis", "dynamodb"])
def test_the_documented_stream_handler_loses_no_record_after_its_checkpoint(
        primary: str, environments: Environments, shared_table: str, executions: Executions, ddb_client: Any,
        source: str) -> None:
    """IDEMPOTENCY_STREAM_FAILURES=checkpoint (the default): the handler stops at record 1 and reports it; the
    records after it never ran, so they are released, not completed, and run when Lambda retries from there."""
    env = environments.shared(primary, shared_table, handler=STREAM_CONSUMER)
    marks = [marker() for _ in range(5)]
    if source == "kinesis":
        records = [events.kinesis_record({"marker": m, "fail_first": i == 1}) for i, m in enumerate(marks)]
        sequences = [r["kinesis"]["sequenceNumber"] for r in records]
        keys = [record_id([r["eventSourceARN"], r["eventID"]]) for r in records]
    else:
        records = [events.dynamodb_record(m) for m in marks]
        records[1]["dynamodb"]["NewImage"]["FailFirst"] = {"BOOL": True}
        sequences = [r["dynamodb"]["SequenceNumber"] for r in records]
        keys = [record_id(r["eventID"]) for r in records]
    assert failed(env.invoke(events.stream_event(records))) == sequences[1:]  # the checkpoint and all after it
    assert [executions.count(m) for m in marks] == [1, 1, 0, 0, 0]
    assert get_record(ddb_client, shared_table, keys[0])["status"]["S"] == "COMPLETED"
    assert all(get_record(ddb_client, shared_table, key) is None for key in keys[1:])
    assert failed(env.invoke(events.stream_event(records[1:]))) == []  # Lambda retries from the checkpoint
    assert failed(env.invoke(events.stream_event(records))) == []  # the whole batch again: all done
    assert [executions.count(m) for m in marks] == [1, 2, 1, 1, 1]  # none lost, none run twice


def test_a_shard_stops_at_a_record_without_a_usable_key(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table,
                   {"IDEMPOTENCY_KEY_JMESPATH": "json_parse(base64_decode(kinesis.data)).marker"})
    marks = [marker() for _ in range(3)]
    records = [events.kinesis_record({"marker": m}) for m in marks]
    broken = events.kinesis_record({"marker": "unused"})
    broken["kinesis"]["data"] = "bm90IGpzb24="  # base64 of "not json": the key expression cannot be applied
    batch_ = [records[0], broken, records[1], records[2]]
    reported = failed(env.invoke(events.stream_event(batch_)))
    assert reported == [r["kinesis"]["sequenceNumber"] for r in batch_[1:]]
    assert [executions.count(m) for m in marks] == [1, 0, 0]  # nothing after it ran before it


def test_dynamodb_streams_reports_sequence_numbers(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    marks = [marker() for _ in range(3)]
    records = [events.dynamodb_record(m) for m in marks]
    records[2]["dynamodb"]["NewImage"]["FailFirst"] = {"BOOL": True}
    assert failed(env.invoke(events.stream_event(records))) == [records[2]["dynamodb"]["SequenceNumber"]]
    assert failed(env.invoke(events.stream_event(records))) == []
    assert [executions.count(m) for m in marks] == [1, 1, 2]


def test_a_body_key_runs_an_order_sent_twice_once_in_one_batch_and_across_batches(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table, BODY_KEY)
    mark = marker()
    same = [events.json_message({"marker": mark}) for _ in range(2)]  # two messages, two messageIds, one order
    other = order()
    assert failed(env.invoke(events.sqs_event([same[0], other, same[1]]))) == []
    assert failed(env.invoke(events.sqs_event([events.json_message({"marker": mark})]))) == []
    assert (executions.count(mark), executions.count(marker_of(other))) == (1, 1)


def test_a_copy_in_one_batch_shares_the_first_ones_failure(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table, BODY_KEY)
    mark = marker()
    first, copy = (events.json_message({"marker": mark, "fail_first": True}) for _ in range(2))
    assert failed(env.invoke(events.sqs_event([first, copy]))) == [first.message_id, copy.message_id]
    assert failed(env.invoke(events.sqs_event([first, copy]))) == []
    assert executions.count(mark) == 2  # failed once, then done once: the copy never ran on its own


def test_a_record_without_a_key_follows_require_key(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    by_ref = {"IDEMPOTENCY_KEY_JMESPATH": "json_parse(body).ref"}
    keyed = events.json_message({"marker": marker(), "ref": marker()})
    unkeyed = order()  # no `ref`: the key selects nothing
    strict = consumer(environments, primary, shared_table, {**by_ref, "IDEMPOTENCY_REQUIRE_KEY": "true"})
    assert failed(strict.invoke(events.sqs_event([unkeyed, keyed]))) == [unkeyed.message_id]
    assert (executions.count(marker_of(unkeyed)), executions.count(marker_of(keyed))) == (0, 1)
    lenient = consumer(environments, primary, shared_table, by_ref)
    assert failed(lenient.invoke(events.sqs_event([unkeyed]))) == []
    assert failed(lenient.invoke(events.sqs_event([unkeyed]))) == []
    assert executions.count(marker_of(unkeyed)) == 2  # unguarded, as the setting says


def test_scope_event_keys_the_whole_batch_and_scope_record_refuses_other_events(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    whole = consumer(environments, primary, shared_table, {"IDEMPOTENCY_SCOPE": "event"})
    message = order()
    event = events.sqs_event([message])
    assert whole.invoke(event).json() is None
    assert whole.invoke(event).json() is None  # the same bytes: a replay
    assert whole.invoke(events.sqs_event([message])).json() is None  # a new receipt handle: a new event
    assert executions.count(marker_of(message)) == 2
    strict = environments.shared(primary, shared_table, {"IDEMPOTENCY_SCOPE": "record"})
    answer = strict.invoke({"marker": marker()})
    assert answer.error_type == "IdempotencyKeyError", answer.body
    assert "IDEMPOTENCY_SCOPE=record" in answer.error_message


def test_requests_per_record_on_the_wire(primary: str, wired_env: Any, executions: Executions) -> None:
    with wired_env(primary, CONSUMER) as (env, proxy):
        assert failed(env.invoke(events.sqs_event([order()]))) == []  # warm: init's table check
        messages = [order() for _ in range(10)]
        proxy.reset()
        assert failed(env.invoke(events.sqs_event(messages))) == []
        assert proxy.snapshot()[0] == {"PutItem": 10, "UpdateItem": 10}  # per record: claim, complete
        proxy.reset()
        assert failed(env.invoke(events.sqs_event(messages))) == []
        assert proxy.snapshot()[0] == {"BatchGetItem": 1}  # redelivered: one read answers all 10 (the pre-check)
        flaky = order(fail_first=True)
        proxy.reset()
        assert failed(env.invoke(events.sqs_event([flaky]))) == [flaky.message_id]
        assert proxy.snapshot()[0] == {"PutItem": 1, "DeleteItem": 1}  # claim, release
    assert all(executions.count(marker_of(m)) == 1 for m in messages)


def test_several_environments_handed_overlapping_batches_run_each_message_once(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    envs = [consumer(environments, primary, shared_table, index=10 + i) for i in range(3)]
    for env in envs:  # warm: the race must be between claims, not between cold starts
        assert failed(env.invoke(events.sqs_event([order()]))) == []
    messages = [order(fail_first=(i % 7 == 0)) for i in range(30)]
    pending = {m.message_id: m for m in messages}
    rng = random.Random(7)
    lock = threading.Lock()
    for _ in range(40):
        if not pending:
            break
        barrier = threading.Barrier(len(envs))

        def fire(env: LambdaEnvironment, picked: list[events.Message], barrier: threading.Barrier) -> None:
            barrier.wait()
            reported = set(failed(env.invoke(events.sqs_event(picked))))
            with lock:
                for message in picked:  # what succeeded is deleted from the queue
                    if message.message_id not in reported:
                        pending.pop(message.message_id, None)

        waiting = list(pending.values())
        threads = [threading.Thread(target=fire, args=(env, rng.sample(waiting, min(10, len(waiting))), barrier))
                   for env in envs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
    assert not pending
    counts = [executions.count(marker_of(m)) for m in messages]
    assert counts == [2 if i % 7 == 0 else 1 for i in range(30)]


def test_a_function_never_sent_a_batch_never_imports_the_batch_module(
        primary: str, make_env: Any, shared_table: str) -> None:
    env = make_env(primary, shared_table)
    assert env.invoke({"marker": marker(), "action": "info"}).json()["batch_module_loaded"] is False
    assert env.invoke({"Records": [{"eventSource": "aws:s3"}], "action": "info"}).json()["batch_module_loaded"]


def _purge_with_the_cli(dynamodb: Any, table: str, event: dict[str, Any], tmp_path: Path,
                        settings: dict[str, str], opt: Path) -> None:
    """`python -m idempotency_layer purge --event FILE --yes` with the function's settings, as an operator runs it
    from the unzipped layer (`opt`) with the PYTHONPATH the README gives."""
    import os
    import subprocess
    import sys

    from tests.e2e.conftest import FUNCTION

    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    import jmespath

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    jmespath_home = Path(jmespath.__file__).parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDEMPOTENCY_", "AWS_")) and k != "PYTHONPATH"}
    env.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL_DYNAMODB=dynamodb.endpoint, IDEMPOTENCY_TABLE=table, AWS_LAMBDA_FUNCTION_NAME=FUNCTION,
               PYTHONPATH=f"{opt}/python:{opt}/python/lib/python{version}/site-packages:{jmespath_home}", **settings)
    # -S keeps the test venv's site-packages (its editable layer, its orjson) out: only the layer's own code runs,
    # with jmespath (the runtime's, which boto3 brings) as the one package of the operator's own.
    done = subprocess.run([sys.executable, "-S", "-m", "idempotency_layer", "purge", "--event", str(path), "--yes"],
                          env=env, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_purged_message_runs_again_in_a_warm_environment_with_a_local_cache(
        primary: str, environments: Environments, shared_table: str, executions: Executions, dynamodb: Any,
        tmp_path: Path, opt_dir: Path) -> None:
    """Issue 28: with IDEMPOTENCY_LOCAL_CACHE_SIZE set, the redelivery of a message an operator had purged to have
    it reprocessed was dropped as done from memory, and the queue deleted it."""
    settings = {**BODY_KEY, "IDEMPOTENCY_LOCAL_CACHE_SIZE": "64"}
    env = consumer(environments, primary, shared_table, settings)
    messages = [order() for _ in range(3)]
    assert env.invoke(events.sqs_event(messages)).json() is None
    _purge_with_the_cli(dynamodb, shared_table, events.sqs_event(messages[1:2]), tmp_path, settings, opt_dir)
    again = env.invoke(events.sqs_event(messages))  # the same warm environment, its cache holding all three
    assert failed(again) == []
    assert [executions.count(marker_of(m)) for m in messages] == [1, 2, 1]


def test_a_purged_event_runs_again_in_a_warm_environment_with_a_local_cache(
        primary: str, environments: Environments, shared_table: str, executions: Executions, dynamodb: Any,
        tmp_path: Path, opt_dir: Path) -> None:
    settings = {"IDEMPOTENCY_KEY_JMESPATH": "marker", "IDEMPOTENCY_LOCAL_CACHE_SIZE": "64"}
    env = environments.shared(primary, shared_table, settings)
    event = {"marker": marker(), "action": "random"}
    first = env.invoke(event)
    assert env.invoke(event).body == first.body and executions.count(event["marker"]) == 1  # from the cache
    _purge_with_the_cli(dynamodb, shared_table, event, tmp_path, settings, opt_dir)
    rerun = env.invoke(event)
    assert rerun.error_type is None and rerun.body != first.body and executions.count(event["marker"]) == 2
    assert env.invoke(event).body == rerun.body and executions.count(event["marker"]) == 2
