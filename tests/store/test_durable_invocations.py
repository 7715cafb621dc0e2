"""A durable execution's invocations run the handler every time, with no request to DynamoDB, against DynamoDB
Local: the handler counts its own runs; the proxy counts requests; the metrics count a pass-through each."""

from __future__ import annotations

import logging

from tests.store import test_metrics_counts as _metrics_tests
from tests.store.test_metrics_counts import counts, documents, scan

build = _metrics_tests.build  # the fixture: functions built from settings, metrics on, behind the counting proxy

FUNCTION = "shop"  # test_metrics_counts' function name
ARN = "arn:aws:lambda:us-east-1:123456789012:function:orders-workflow:$LATEST/durable-execution/order-42/4f1c2a9e"
EVENT = {"DurableExecutionArn": ARN.replace("orders-workflow", FUNCTION), "CheckpointToken": "token-1",
         "InitialExecutionState": {"Operations": []}, "orderId": "order-42"}


def test_every_invocation_of_a_durable_execution_runs_unclaimed(build, capsys, ddb_client, table, proxy, caplog):
    function = build(IDEMPOTENCY_SCOPE="record")  # would refuse any event that is not a batch
    proxy.reset()
    with caplog.at_level(logging.INFO, logger="idempotency_layer"):
        for token in ("token-1", "token-2", "token-2"):  # replays of one execution, one sent again
            assert function({**EVENT, "CheckpointToken": token}) == {"ok": True}
    assert len(function.runs) == 3
    assert proxy.total() == 0 and scan(ddb_client, table) == []
    assert [counts(doc) for doc in documents(capsys, 3)] == [{"PassThroughs": 1}] * 3
    said = [r for r in caplog.records if "passed through untouched" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO  # once per environment
    lines = [r for r in caplog.records if r.getMessage().startswith("idempotency: durable no key: a durable")]
    assert [r.idempotency_outcome for r in lines] == ["durable"] * 3  # each invocation's own line


def test_an_order_event_of_the_same_shape_but_another_function_is_still_claimed(build, capsys, ddb_client, table):
    function = build()
    other = {**EVENT, "DurableExecutionArn": ARN}  # orders-workflow's execution, sent to this function
    function(other)
    function(other)
    assert len(function.runs) == 1
    assert [item["status"]["S"] for item in scan(ddb_client, table)] == ["COMPLETED"]
    assert [counts(doc) for doc in documents(capsys, 2)] == [{"FirstExecutions": 1}, {"Replays": 1}]
