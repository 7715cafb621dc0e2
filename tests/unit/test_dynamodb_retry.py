"""dynamodb.retry: botocore's standard retry mode as data. Its decisions, backoffs and retry quota are checked
against botocore's own standard mode (driven by hand with DynamoDB's real service model) on generated sequences
of answers, and its modeled errors against botocore's DynamoDB model."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.loaders import create_loader
from botocore.retries import quota, standard
from botocore.session import Session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.stores.dynamodb.retry import MODELED_ERRORS, RETRYABLE_MODELED, Retry

_MODEL = Session().get_service_model("dynamodb")


class Response:
    """Just what botocore's retry checkers read from an HTTP response."""

    def __init__(self, status: int, body: bytes = b"{}", headers: dict | None = None) -> None:
        self.status_code = status
        self.content = body
        self.headers = headers or {}


class BotocoreStandard:
    """botocore's standard retry mode as a client registers it (botocore.retries.standard.register_retry_handler),
    with the jitter pinned and DynamoDB's own operation models."""

    def __init__(self, max_attempts: int, random: Any) -> None:
        throttling = standard.ThrottlingErrorDetector(standard.RetryEventAdapter())
        backoff = standard.ExponentialBackoff(service_name="dynamodb", throttling_detector=throttling, random=random)
        self.policy = standard.RetryPolicy(
            retry_checker=standard.StandardRetryConditions(max_attempts=max_attempts), retry_backoff=backoff
        )
        self.quota = standard.RetryQuotaChecker(quota.RetryQuota(), throttling)

    def delay(self, operation: str, attempt: int, request_context: dict, *, status: int | None = None,
              code: str | None = None, headers: dict | None = None, failed_send: bool = False,
              crc_mismatch: bool = False) -> float | None:
        response = None
        if status is not None:
            headers = dict(headers or {})
            if crc_mismatch:
                headers["x-amz-crc32"] = str(zlib.crc32(b"{}") ^ 1)
            response = Response(status, b"{}", headers)
        context = standard.RetryContext(
            attempt_number=attempt,
            operation_model=_MODEL.operation_model(operation),
            parsed_response=None if code is None else {"Error": {"Code": code, "Message": ""}},
            http_response=response,
            caught_exception=EndpointConnectionError(endpoint_url="http://x", error="refused") if failed_send else None,
            request_context=request_context,
        )
        if self.policy.should_retry(context) and self.quota.acquire_retry_quota(context):
            return self.policy.compute_retry_delay(context)
        return None

    def succeeded(self, request_context: dict) -> None:
        self.quota.release_retry_quota(request_context, Response(200))

    @property
    def capacity(self) -> int:
        return self.quota._quota.available_capacity  # the one figure botocore keeps no public name for


def ours(status=None, code=None, attempt=1, max_attempts=3, operation="PutItem", headers=None, **flags):
    """Our decision's wait at the top of the jitter's range (random() == 1.0), or None."""
    got = Retry(max_attempts, random=lambda: 1.0).delay(operation, attempt, status=status, code=code,
                                                        headers=headers, **flags)
    return None if got is None else got[0]


# -- decisions and backoff ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code", ["ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded", "Throttling"]
)
def test_throttles_retry_from_a_one_second_base(code):
    assert ours(400, code, attempt=1) == 1.0
    assert ours(400, code, attempt=2) == 2.0


@pytest.mark.parametrize(("status", "code"), [(500, "InternalServerError"), (503, "503"), (502, "502"), (504, "504")])
def test_server_errors_retry_from_dynamodbs_25ms_base(status, code):
    assert ours(status, code, attempt=1) == pytest.approx(0.025)
    assert ours(status, code, attempt=3, max_attempts=4) == pytest.approx(0.1)


def test_backoff_is_capped_at_20_seconds():
    assert ours(400, "ThrottlingException", attempt=9, max_attempts=10) == 20


def test_retry_after_header_raises_the_delay():
    assert ours(500, "InternalServerError", headers={"x-amz-retry-after": "1500"}) == pytest.approx(1.5)
    # At most 5 s more than the backoff drawn; nonsense is ignored.
    assert ours(500, "InternalServerError", headers={"x-amz-retry-after": "30000"}) == pytest.approx(5.025)
    for value in ("-1", "x", ""):
        assert ours(500, "InternalServerError", headers={"x-amz-retry-after": value}) == pytest.approx(0.025)


def test_a_failed_send_retries_as_transient():
    # A refused connection, a read timeout, a connection lost: no status, no code.
    assert ours(failed_send=True) == pytest.approx(0.025)


@pytest.mark.parametrize(
    "code", ["ConditionalCheckFailedException", "ValidationException", "ResourceNotFoundException",
             "AccessDeniedException", "TransactionConflictException"],
)
def test_client_errors_do_not_retry(code):
    assert ours(400, code) is None


def test_a_modeled_retryable_error_retries_on_writes_only():
    assert ours(400, "ReplicatedWriteConflictException", operation="UpdateItem") == pytest.approx(0.025)
    assert ours(400, "ReplicatedWriteConflictException", operation="GetItem") is None


def test_429_retries_as_a_throttle_unless_its_code_is_modeled():
    assert ours(429, "SomethingNew") == 1.0
    assert ours(429, "ResourceNotFoundException") is None


def test_crc32_mismatch_retries():
    assert ours(200, crc_mismatch=True) == pytest.approx(0.025)
    assert ours(200) is None


def test_max_attempts_counts_the_first_attempt():
    assert ours(500, "InternalServerError", attempt=2, max_attempts=3) is not None
    assert ours(500, "InternalServerError", attempt=3, max_attempts=3) is None
    assert ours(500, "InternalServerError", attempt=1, max_attempts=1) is None


# -- the retry quota ------------------------------------------------------------------------------------------


def test_the_quota_stops_retries_after_sustained_failure():
    retry = Retry(10, random=lambda: 0.0)
    granted = sum(retry.delay("GetItem", 1, status=500, code="InternalServerError") is not None for _ in range(100))
    assert granted == 500 // 14  # botocore's quota: 500 tokens, 14 a transient retry
    assert retry.delay("GetItem", 1, status=400, code="ThrottlingException") is not None  # a throttle costs 5
    retry.succeeded(0)  # a call that needed no retry gives back one token
    assert retry.capacity == 500 - 35 * 14 - 5 + 1


def test_a_success_after_retries_gives_back_what_the_last_retry_took():
    retry = Retry(3, random=lambda: 0.0)
    _, taken = retry.delay("PutItem", 1, status=400, code="ThrottlingException")
    assert (taken, retry.capacity) == (5, 495)
    retry.succeeded(taken)
    assert retry.capacity == 500
    retry.succeeded(14)
    assert retry.capacity == 500  # never above its capacity


# -- against botocore's standard mode -------------------------------------------------------------------------

OUTCOMES = [  # (status, code, failed_send, crc_mismatch)
    (200, None, False, False),
    (400, "ThrottlingException", False, False),
    (400, "ProvisionedThroughputExceededException", False, False),
    (400, "RequestLimitExceeded", False, False),
    (400, "ConditionalCheckFailedException", False, False),
    (400, "ValidationException", False, False),
    (400, "ResourceNotFoundException", False, False),
    (400, "ReplicatedWriteConflictException", False, False),
    (400, "TransactionConflictException", False, False),
    (400, "RequestTimeout", False, False),
    (400, "PriorRequestNotComplete", False, False),
    (429, "SomethingNew", False, False),
    (429, "ResourceNotFoundException", False, False),
    (429, "ReplicatedWriteConflictException", False, False),
    (500, "InternalServerError", False, False),
    (503, "503", False, False),
    (502, "502", False, False),
    (504, "504", False, False),
    (None, None, True, False),  # no answer
    (200, None, False, True),  # damaged body
    (500, "InternalServerError", False, True),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_attempts=st.integers(1, 10),
    calls=st.lists(
        st.tuples(
            st.sampled_from(["PutItem", "GetItem", "UpdateItem", "DeleteItem"]),
            st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=10),
            st.sampled_from([None, "1500", "-1", "x", "30000"]),
        ),
        min_size=1,
        max_size=60,
    ),
    jitter=st.floats(0, 1),
)
def test_retry_decisions_and_quota_are_botocores(max_attempts, calls, jitter):
    theirs = BotocoreStandard(max_attempts, random=lambda: jitter)
    mine = Retry(max_attempts, random=lambda: jitter)
    for operation, outcomes, retry_after in calls:
        request_context: dict = {}
        taken = 0
        for attempt, (status, code, failed_send, crc_bad) in enumerate(outcomes, start=1):
            if status is not None and status < 300 and not crc_bad:
                theirs.succeeded(request_context)
                mine.succeeded(taken)
                break
            headers = None if status is None else {"x-amz-retry-after": retry_after} if retry_after else {}
            # A damaged answer is not parsed: neither side sees its code.
            flags = {"status": status, "code": None if crc_bad else code, "headers": headers,
                     "failed_send": failed_send, "crc_mismatch": crc_bad}
            expected = theirs.delay(operation, attempt, request_context, **flags)
            got = mine.delay(operation, attempt, **flags)
            assert (got is None) == (expected is None), (operation, attempt, flags)
            if got is None:
                break
            assert got[0] == pytest.approx(expected)
            taken = got[1]
        assert mine.capacity == theirs.capacity


def test_the_modeled_errors_are_botocores_dynamodb_model():
    model = create_loader().load_service_model("dynamodb", "service-2")
    for operation, errors in MODELED_ERRORS.items():
        shapes = model["operations"][operation].get("errors", [])
        assert {shape["shape"] for shape in shapes} == errors, operation
        retryable = {s["shape"] for s in shapes if model["shapes"][s["shape"]].get("retryable") is not None}
        assert retryable == RETRYABLE_MODELED.get(operation, set()), operation
        # None of them retryable as a throttle: that would change its backoff base and quota cost.
        assert not any(model["shapes"][s].get("retryable", {}).get("throttling") for s in retryable)
