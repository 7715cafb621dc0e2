"""The issue-20 reproduction end to end: an 8 s function with IDEMPOTENCY_READ_TIMEOUT=1 whose completion's
first request goes into a kept-alive connection that never answers. The built layer under RIE + awslambdaric,
DynamoDB Local behind a proxy that stalls that one request; executions counted from the handler's own lines."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import Environments, Executions, get_record, marker, record_id
from tests.support.dynamodb_local import create_table
from tests.support.fault_proxy import FORWARDED, STALL, FaultProxy


@pytest.fixture
def stalled_env(environments: Environments, ddb_client: Any, dynamodb: Any, primary: str) -> Iterator[Any]:
    table = create_table(ddb_client, f"idempotency-stall-{uuid.uuid4().hex[:8]}")
    upstream = urlparse(dynamodb.endpoint)
    proxy = FaultProxy(upstream.hostname, upstream.port)
    env = environments.new(primary, table, {"AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint,
                                            "IDEMPOTENCY_KEY_JMESPATH": "marker", "IDEMPOTENCY_READ_TIMEOUT": "1"},
                           timeout=8)
    try:
        yield env, proxy, table
    finally:
        env.stop()
        proxy.close()
        ddb_client.delete_table(TableName=table)


@pytest.mark.parametrize("operation", ["UpdateItem", "DeleteItem"])
def test_a_stalled_write_after_the_handler_costs_one_read_timeout(
        stalled_env: Any, operation: str, executions: Executions, ddb_client: Any) -> None:
    env, proxy, table = stalled_env
    mark = marker()
    event = {"marker": mark, "action": "raise" if operation == "DeleteItem" else "random"}
    proxy.script(operation, STALL)
    started = time.monotonic()
    first = env.invoke(event)
    took = time.monotonic() - started
    assert executions.count(mark) == 1
    arrivals = [(at, kind) for at, op, kind in proxy.arrivals if op == operation]
    assert [kind for _, kind in arrivals] == [STALL, FORWARDED], arrivals
    gap = arrivals[1][0] - arrivals[0][0]
    assert 0.95 <= gap <= 1.75, f"{gap:.2f} s from the stall to the next attempt (read timeout 1 s)"
    assert took < 6, f"the invocation took {took:.1f} s of its 8"  # not held until its deadline
    record = get_record(ddb_client, table, record_id(mark))
    if operation == "DeleteItem":
        assert first.error_type == "ValueError", first.body  # the handler's own error, its claim released
        assert record is None
        again = env.invoke(event)  # the key is not blocked: the retry runs the handler again, as it should
        assert again.error_type == "ValueError" and executions.count(mark) == 2
    else:
        assert first.error_type is None, first.body
        assert record is not None and record["status"]["S"] == "COMPLETED"
        again = env.invoke(event)  # a later copy replays: the handler ran once
        assert again.body == first.body and executions.count(mark) == 1
