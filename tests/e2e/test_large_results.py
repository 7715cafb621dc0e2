"""IDEMPOTENCY_LARGE_RESULTS_BUCKET end to end: the built layer under RIE + awslambdaric, results too large for a
record kept in moto's S3 server and replayed byte for byte: whole events up to Lambda's 6 MB response, an HTTP API
(payload 2.0) and a Function URL with base64 bodies, an ALB up to its 1 MB. Executions counted by the handler."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.e2e.conftest import Environments, Executions, marker
from tests.support import http_events

MIB = 1024 * 1024
APP = "large.handler"


@pytest.fixture(scope="module")
def bucket(moto: Any) -> Any:
    import boto3

    name = f"large-results-{time.time_ns()}"
    client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="a",
                          aws_secret_access_key="b")
    client.create_bucket(Bucket=name)
    return name, moto.endpoint, client


def settings(bucket: Any) -> dict[str, str]:
    return {"IDEMPOTENCY_LARGE_RESULTS_BUCKET": bucket[0], "AWS_ENDPOINT_URL_S3": bucket[1],
            "IDEMPOTENCY_KEY_JMESPATH": "marker"}


@pytest.mark.parametrize(("size", "raw"), [(MIB // 2, True), (MIB // 2, False), (MIB, False), (5 * MIB, False),
                                           (int(5.9 * MIB) - 200, False), (int(5.9 * MIB), True)])
def test_a_large_result_of_a_whole_event_replays_byte_for_byte(primary: str, environments: Environments,
                                                               shared_table: str, executions: Executions, bucket: Any,
                                                               size: int, raw: bool) -> None:
    env = environments.shared(primary, shared_table, settings(bucket), handler=APP)
    event = {"marker": marker(), "size": size, "raw": raw}
    first, again = env.invoke(event, timeout=60), env.invoke(event, timeout=60)
    assert first.status == 200 and first.error_type is None, first.body[:300]
    assert len(first.body) >= size * 0.99 and again.body == first.body
    assert executions.count(event["marker"]) == 1
    if raw or size >= MIB:  # (half a MiB of base64 text compresses into the record itself; random bytes do not)
        objects = bucket[2].list_objects_v2(Bucket=bucket[0], Prefix="idempotency-results/").get("Contents", [])
        assert any(item["Size"] >= size * 0.7 for item in objects)


@pytest.mark.parametrize(("form", "size"), [("v2", 4 * MIB), ("url", 4 * MIB), ("alb", MIB - 4096)])
def test_a_large_http_response_replays_byte_for_byte(form: str, size: int, primary: str, environments: Environments,
                                                    shared_table: str, executions: Executions, bucket: Any) -> None:
    env = environments.shared(primary, shared_table, {k: v for k, v in settings(bucket).items()
                                                      if k != "IDEMPOTENCY_KEY_JMESPATH"}, handler=APP)
    mark = marker()
    body = json.dumps({"marker": mark, "size": size})
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    request = (http_events.alb("POST", "/reports", headers, body) if form == "alb" else
               http_events.v2("POST", "/reports", headers, body, function_url=form == "url"))
    first, again = env.invoke(request, timeout=60).json(), env.invoke(request, timeout=60).json()
    assert first["statusCode"] == again["statusCode"] == 200 and first["isBase64Encoded"] is True
    assert again["body"] == first["body"] and len(first["body"]) >= size * 0.99
    replayed = {k.lower(): v for k, v in again["headers"].items()}
    assert replayed["idempotent-replayed"] == "true"
    assert executions.count(mark) == 1
