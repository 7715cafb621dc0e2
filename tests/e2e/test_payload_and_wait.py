"""Payload fingerprints, waiting for an in-flight copy and the in-progress floor end to end: the built layer
under RIE + awslambdaric, records in DynamoDB Local, executions counted from the handler's own side effect."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Environments, Executions, get_record, marker, record_id
from tests.support.dynamodb_local import wait_for
from tests.support.rie import Invocation

BY_MARKER = {"IDEMPOTENCY_KEY_JMESPATH": "marker", "IDEMPOTENCY_PAYLOAD_JMESPATH": "[marker, amount]"}


def test_a_key_reused_with_another_payload_is_refused_from_the_table_and_the_cache(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    for cache in ("0", "10"):
        env = environments.shared(primary, shared_table, {**BY_MARKER, "IDEMPOTENCY_LOCAL_CACHE_SIZE": cache})
        mark = marker()
        first = env.invoke({"marker": mark, "amount": 1})
        assert first.status == 200 and first.error_type is None, first.body
        again = env.invoke({"marker": mark, "amount": 1, "comment": "outside the fingerprint"})
        assert again.body == first.body
        other = env.invoke({"marker": mark, "amount": 2})
        assert other.error_type == "IdempotencyPayloadMismatchError", other.body
        assert "was used before with another payload" in other.error_message
        assert executions.count(mark) == 1


def test_a_copy_that_waits_gets_the_first_runs_response(
        primary: str, environments: Environments, shared_table: str, executions: Executions,
        tmp_path: Path) -> None:
    waiting = {"IDEMPOTENCY_KEY_JMESPATH": "marker", "IDEMPOTENCY_WAIT_SECONDS": "30"}
    first_env, copy_env = (environments.shared(primary, shared_table, waiting, index=20 + i) for i in range(2))
    for env in (first_env, copy_env):  # warm, so the copy arrives while the first is running
        assert env.invoke({"marker": marker(), "action": "info"}).status == 200
    release = tmp_path / "release"
    event = {"marker": marker(), "action": "block", "release": str(release)}
    answers: dict[str, Invocation] = {}
    first = threading.Thread(target=lambda: answers.update(first=first_env.invoke(event)), daemon=True)
    first.start()
    executions.wait_for(event["marker"], 1)
    copy = threading.Thread(target=lambda: answers.update(copy=copy_env.invoke(event)), daemon=True)
    copy.start()
    time.sleep(0.5)  # the copy is polling now; it must not have run the handler
    assert executions.count(event["marker"]) == 1 and "copy" not in answers
    release.touch()
    first.join(60)
    copy.join(60)
    assert answers["first"].error_type is None, answers["first"].body
    assert answers["copy"].body == answers["first"].body  # the replay, not a run of its own
    assert executions.count(event["marker"]) == 1


def test_in_progress_seconds_sets_the_claims_floor(primary: str, environments: Environments, shared_table: str,
                                                   ddb_client: Any, tmp_path: Path) -> None:
    env = environments.shared(primary, shared_table, {"IDEMPOTENCY_IN_PROGRESS_SECONDS": "600"})
    release = tmp_path / "release"
    event = {"marker": marker(), "action": "block", "release": str(release)}
    before = time.time()
    thread = threading.Thread(target=lambda: env.invoke(event), daemon=True)
    thread.start()
    try:
        wait_for(lambda: get_record(ddb_client, shared_table, record_id(event)) is not None, 30, "the claim")
        item = get_record(ddb_client, shared_table, record_id(event))
        assert int(item["in_progress_until"]["N"]) >= int(before * 1000) + 600_000  # not the 30 s timeout
    finally:
        release.touch()
        thread.join(60)
