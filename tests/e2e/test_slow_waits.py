"""A copy that waits on a slow table answers in-progress before its function times out (issue 20): a 4 s
function with IDEMPOTENCY_WAIT_SECONDS=900 whose every poll takes 2.5 s (under the read timeout) used to be
killed by its timeout after two polls. The built layer under RIE + awslambdaric; the copy reaches DynamoDB
Local through a proxy that holds each GetItem 2.5 s; executions counted from the handlers' own lines."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import Executions, marker
from tests.e2e.test_http import answer, headers_of, request
from tests.support.dynamodb_local import create_table
from tests.support.fault_proxy import LATENCY, FaultProxy
from tests.support.rie import Invocation

POLL_S = 2.5


@pytest.fixture
def slow_table(ddb_client: Any, dynamodb: Any) -> Iterator[tuple[str, FaultProxy]]:
    table = create_table(ddb_client, f"idempotency-slow-{uuid.uuid4().hex[:8]}")
    upstream = urlparse(dynamodb.endpoint)
    proxy = FaultProxy(upstream.hostname, upstream.port, spike=(POLL_S, POLL_S))
    try:
        yield table, proxy
    finally:
        proxy.close()
        ddb_client.delete_table(TableName=table)


@pytest.mark.parametrize("form", ["event", "http"])
def test_a_wait_on_a_slow_table_answers_in_progress_before_the_timeout(
        form: str, primary: str, make_env: Any, slow_table: tuple[str, FaultProxy], executions: Executions,
        tmp_path: Path) -> None:
    table, proxy = slow_table
    settings = {"IDEMPOTENCY_KEY_JMESPATH": "marker"} if form == "event" else {}
    handler = {} if form == "event" else {"handler": "web.handler"}
    first_env = make_env(primary, table, settings, **handler)
    copy_env = make_env(primary, table, {**settings, "AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint,
                                         "IDEMPOTENCY_WAIT_SECONDS": "900"}, timeout=4, **handler)
    mark, release = marker(), tmp_path / "release"
    if form == "event":
        event: dict[str, Any] = {"marker": mark, "action": "block", "release": str(release)}
        warm: dict[str, Any] = {"marker": marker(), "action": "info"}
    else:
        event = request("v2", mark, {"marker": mark, "release": str(release)})
        warm = request("v2", marker(), {"marker": marker()})
    for env in (first_env, copy_env):  # init (and its table check) done before any GetItem is held
        assert env.invoke(warm).error_type is None
    answers: dict[str, Invocation] = {}
    first = threading.Thread(target=lambda: answers.update(first=first_env.invoke(event)), daemon=True)
    first.start()
    try:
        executions.wait_for(mark, 1)
        proxy.script("GetItem", *[LATENCY] * 10)  # every poll of the copy takes 2.5 s
        seen = len(proxy.arrivals)
        started = time.monotonic()
        copy = copy_env.invoke(event)
        took = time.monotonic() - started
    finally:
        release.touch()
        first.join(60)
    polls = [kind for _, op, kind in proxy.arrivals[seen:] if op == "GetItem"]
    assert polls and set(polls) == {LATENCY}, polls  # it did wait on the slow table
    assert took < 4, f"the copy took {took:.1f} s of its 4"
    if form == "event":
        assert copy.error_type == "IdempotencyAlreadyInProgressError", copy.body
        assert "after waiting" in copy.error_message
    else:
        duplicate = answer(copy)
        assert duplicate["statusCode"] == 409 and headers_of(duplicate)["retry-after"] == "1"
        assert "still in progress" in json.loads(duplicate["body"])["detail"]  # the log says it waited
    assert answers["first"].error_type is None, answers["first"].body
    assert executions.count(mark) == 1
