"""IDEMPOTENCY_CALLER_HEADERS in process on DynamoDB Local (issue 28): a caller header a request of some format
comes without is said once per environment and format, at WARNING, so a header that never reaches the function in
that format (as cookies never reached it in payload 2.0's headers) does not scope every caller together silently."""

from __future__ import annotations

import logging

from tests.store import test_metrics_counts as _metrics_tests
from tests.support.http_events import rest, v2

build = _metrics_tests.build  # the fixture: functions built from settings, behind the counting proxy


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "IDEMPOTENCY_CALLER_HEADERS" in r.getMessage()]


def test_a_caller_header_a_format_comes_without_is_said_once_per_format(build, caplog) -> None:
    function = build(IDEMPOTENCY_CALLER_HEADERS="Cookie, X-Tenant", IDEMPOTENCY_METRICS="off")
    caplog.set_level(logging.WARNING, logger="idempotency_layer")

    def v2_request(key: str) -> dict:
        event = v2("POST", "/orders", {"Idempotency-Key": key}, "{}")
        event["cookies"] = ["session=alice"]
        return event

    for key in ("a1", "a2", "a3"):
        function(v2_request(key))
    said = _said(caplog)
    # The cookie came (in the cookies list); the tenant header never did: said once for payload 2.0.
    assert len(said) == 1 and "'x-tenant'" in said[0] and "payload 2.0" in said[0], said
    assert "alice" not in caplog.text
    for key in ("b1", "b2"):
        function(rest("POST", "/orders", {"Idempotency-Key": key, "Cookie": "session=bob"}, "{}"))
    said = _said(caplog)
    assert len(said) == 2 and "'x-tenant'" in said[1] and "REST" in said[1], said
    assert len(function.runs) == 5
