"""Check and its verdicts: what every backend's checks (and doctor's own) return, one line each; and what they
share: how long a probe record may outlive doctor, and what a boto3 call's failure was."""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
PROBE_SECONDS = 120  # how long a probe record could outlive a doctor that dies mid-probe


if TYPE_CHECKING:
    class _CheckFields(NamedTuple):
        name: str
        status: str  # PASS, WARN or FAIL
        detail: str
        fix: str | None = None
else:
    _CheckFields = namedtuple("Check", ("name", "status", "detail", "fix"), defaults=(None,))


class Check(_CheckFields):
    __slots__ = ()


_MISSING_QUEUE = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})
_THROTTLED = frozenset({"Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded",
                        "ServiceUnavailable", "ServiceUnavailableException", "InternalFailure",
                        "InternalServerError", "ServiceException"})


def aws_failure(error: BaseException) -> tuple[str, str]:
    """What a boto3 call's failure was (an error code or type) and the kind of fix it needs: "missing",
    "transient" (a timeout, a 5xx, a throttle: retry) or "access" (credentials, permissions, the name)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # a ClientError: the service answered
        answer: dict[str, Any] = response["Error"] if isinstance(response.get("Error"), dict) else {}
        code = str(answer.get("Code") or type(error).__name__)
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
        if code in _MISSING_QUEUE or code == "ResourceNotFoundException":
            return code, "missing"
        if code in _THROTTLED or (isinstance(status, int) and status >= 500):
            return code, "transient"
        return code, "access"
    kind = type(error).__name__
    if kind in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ProfileNotFound"):
        return kind, "access"
    return kind, "transient"  # timeouts, refused connections, broken answers: the endpoint did not answer
