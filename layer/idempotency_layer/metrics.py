"""What each invocation did: counted while it runs, then written as one CloudWatch embedded metric format (EMF)
document on stdout (IDEMPOTENCY_METRICS=emf) and one INFO line (when the layer logs at INFO or below).

Imported by `interceptor.build` only when one of the two is asked for: otherwise nothing here runs, and an
invocation's `Invocation.tally` is None (counting then costs one test of it). The executor and the cycle count into
the invocation's `Tally` (batch records from several threads at once), and time every request of the store in it
(`with inv.timed:`, the tally itself). No event or result content ever reaches a document or a line: keys are
hashed, the rest are counts, names of outcomes and of exception types.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

import orjson

from .log import LOGGER_NAME

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

logger = logging.getLogger(LOGGER_NAME)

# The counts, in the order documents and lines give them (docs/metrics-and-logs.md says what each counts).
COUNTS = (
    "FirstExecutions",
    "OwnerInvocations",
    "ExecutionsCompleted",
    "Replays",
    "LocalCacheReplays",
    "InProgressConflicts",
    "Waits",
    "WaitsReplayed",
    "WaitsClaimed",
    "WaitsTimedOut",
    "PayloadMismatches",
    "PassThroughs",
    "Releases",
    "ReleaseFailures",
    "CompletionRetries",
    "CompletionFailures",
    "ResultsTooLarge",
    "LargeResults",
    "LargeResultFailures",
    "StoreErrors",
    "AnonymousScope",
    "RecordIntegrityFailures",
)
SOURCES = ("event", "batch", "http", "durable", "execution")
DIMENSIONS = ("FunctionName", "Source")

# What an invocation's line says of each outcome; `outcome` picks one from its counts.
_OUTCOMES = {
    "first_run": "first run: the handler ran and its result was stored",
    "released": "first run, released: the handler failed or its answer is not kept, so a retry runs it again",
    "release_failed": "first run, not released: the handler failed or its answer is not kept, and the release "
                      "failed; copies are refused as in progress until the claim expires, then one runs it again",
    "not_completed": "first run, not completed: the handler ran but its result was not stored; a later copy "
                     "runs it again (once the claim expires, if it is still there)",
    "replay": "replay of the stored result: the handler did not run",
    "local_cache_replay": "replay from the local cache: the handler did not run, one read confirmed the record",
    "in_progress": "in progress in another invocation: the handler did not run",
    "mismatch": "payload mismatch: the key was used before with another payload; the handler did not run",
    "passed_through": "passed through: no key, the handler ran without idempotency",
    "durable": "a durable execution's invocation: passed through, never claimed",
    "execution_claimed": "first invocation of a durable execution: it claimed the key and ran; the claim stays "
                         "until the execution succeeds or fails",
    "execution_owner": "an invocation of the durable execution that owns the key: it ran",
    "execution_completed": "the durable execution that owns the key succeeded: the key is completed for "
                           "duplicate executions",
    "execution_released": "the durable execution that owns the key failed: released, so a later delivery runs again",
    "store_error": "store error: the store could not be used; the handler did not run",
    "record_refused": "record refused: the completed record failed its authentication (IDEMPOTENCY_RECORD_MAC_KEY) "
                      "and was not used; the handler did not run",
    "not_claimed": "no claim made: the key was refused, or this environment runs no handler",
}
# Batch lines name counts of records by these words.
_WORDS = {
    "FirstExecutions": "first run(s)", "OwnerInvocations": "owner invocation(s)",
    "ExecutionsCompleted": "execution(s) completed",
    "Replays": "replay(s)", "LocalCacheReplays": "local-cache replay(s)",
    "InProgressConflicts": "in progress", "PayloadMismatches": "mismatch(es)", "PassThroughs": "passed through",
    "Waits": "wait(s)", "Releases": "released", "ReleaseFailures": "release failure(s)",
    "CompletionRetries": "completion retries",
    "CompletionFailures": "completion failure(s)", "ResultsTooLarge": "too large", "StoreErrors": "store error(s)",
    "LargeResults": "result(s) in the bucket", "LargeResultFailures": "bucket write failure(s)",
    "WaitsReplayed": "wait(s) ended in a replay", "WaitsClaimed": "wait(s) ended in a claim",
    "WaitsTimedOut": "wait(s) timed out",
    "AnonymousScope": "anonymous scope",
    "RecordIntegrityFailures": "record(s) refused as not authentic",
}


class Tally:
    """One invocation's counts; safe to add to from several threads (a batch's claims, completions, releases).

    Also the context manager every store request of the invocation is made in (`Invocation.timed`): the request
    is counted with its time, and as a store error when it raised."""

    __slots__ = ("_lock", "_started", "counts", "key", "kind", "records", "store_requests", "store_s")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.kind = "event"  # event, batch, http, durable or execution: set by the runner that serves the invocation
        self.key: str | None = None  # a whole event's or a request's stored key
        self.records = 0  # a batch's
        self.store_s = 0.0  # time spent in the store's requests, summed (a batch's concurrent ones too)
        self.store_requests = 0
        self._lock = threading.Lock()
        self._started: list[float] = []  # the start of each request in flight

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def add_many(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                if n:
                    self.counts[name] = self.counts.get(name, 0) + n

    def stored(self, seconds: float, failed: bool) -> None:
        with self._lock:
            self.store_s += seconds
            self.store_requests += 1
            if failed:
                self.counts["StoreErrors"] = self.counts.get("StoreErrors", 0) + 1

    # One tally times every request of its invocation, a batch's concurrent ones too, so the starts are a stack:
    # concurrent requests may pop each other's, which leaves the sum of their times, all that is reported, as it
    # is. No object is made per request, list.append and list.pop need no lock, and `stored` is written out again
    # rather than called: this runs on every request.
    def __enter__(self) -> None:
        self._started.append(time.perf_counter())

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        seconds = time.perf_counter() - self._started.pop()
        with self._lock:
            self.store_s += seconds
            self.store_requests += 1
            if kind is not None:
                self.counts["StoreErrors"] = self.counts.get("StoreErrors", 0) + 1


def outcome(tally: Tally) -> str | None:
    """The one outcome of a whole event or a request (a key of _OUTCOMES); None for a batch."""
    if tally.kind == "batch":
        return None
    if tally.kind == "durable":
        return "durable"
    counts = tally.counts
    if counts.get("PassThroughs"):
        return "passed_through"
    if counts.get("PayloadMismatches"):
        return "mismatch"
    if counts.get("InProgressConflicts"):
        return "in_progress"
    if tally.kind == "execution" and (counts.get("FirstExecutions") or counts.get("OwnerInvocations")):
        return _execution(counts)
    if counts.get("FirstExecutions"):
        if counts.get("ReleaseFailures"):
            return "release_failed"
        if counts.get("Releases"):
            return "released"
        return "not_completed" if counts.get("CompletionFailures") else "first_run"
    if counts.get("Replays"):
        return "replay"
    if counts.get("LocalCacheReplays"):
        return "local_cache_replay"
    if counts.get("StoreErrors"):
        return "store_error"
    if counts.get("RecordIntegrityFailures"):
        return "record_refused"
    return "not_claimed"


def _execution(counts: dict[str, int]) -> str:
    """What an invocation of the durable execution that holds its key did with the claim."""
    if counts.get("ReleaseFailures"):
        return "release_failed"
    if counts.get("Releases"):
        return "execution_released"
    if counts.get("ExecutionsCompleted"):
        return "not_completed" if counts.get("CompletionFailures") else "execution_completed"
    return "execution_claimed" if counts.get("FirstExecutions") else "execution_owner"


def filter_level(env: Any) -> str | None:
    """The level a document must carry to pass Lambda's log-level filter, or None when it needs none. Under
    AWS_LAMBDA_LOG_FORMAT=JSON, Lambda takes a stdout line without a "level" member as INFO and drops it when the
    function's application log level (AWS_LAMBDA_LOG_LEVEL) is WARN or above: the metrics would be lost."""
    if (env.get("AWS_LAMBDA_LOG_FORMAT") or "").upper() != "JSON":
        return None
    level = (env.get("AWS_LAMBDA_LOG_LEVEL") or "").upper()
    return level if level in ("WARN", "ERROR", "FATAL") else None


def document(tally: Tally, namespace: str, function_name: str, timestamp_ms: int,
             request_id: str | None = None, level: str | None = None) -> dict[str, Any]:
    """The invocation's EMF document: `Invocations` (1), a batch's `Records`, every count that is not zero, and
    `StoreTime` when the store was asked anything. Zero counts are left out: the document stays small, and a
    count that never happens never becomes a metric (CloudWatch bills each metric that receives data)."""
    values: dict[str, int | float] = {"Invocations": 1}
    if tally.kind == "batch":
        values["Records"] = tally.records
    counts = tally.counts
    for name in COUNTS:
        if counts.get(name):
            values[name] = counts[name]
    definitions = [{"Name": name, "Unit": "Count"} for name in values]
    if tally.store_requests:
        values["StoreTime"] = round(tally.store_s * 1000, 3)
        definitions.append({"Name": "StoreTime", "Unit": "Milliseconds"})
    doc: dict[str, Any] = {
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [list(DIMENSIONS)],
                "Metrics": definitions,
            }],
        },
        "FunctionName": function_name,
        "Source": tally.kind,
        **values,
    }
    # Not metrics: searchable members of the log event, to find the invocation and its record.
    if tally.key is not None:
        doc["idempotency_key"] = tally.key
    if request_id:
        doc["requestId"] = request_id
    if level is not None:
        doc["level"] = level  # filter_level's: so Lambda's log-level filter keeps the document
    return doc


def line(tally: Tally, error: BaseException | None = None) -> tuple[str, dict[str, Any]]:
    """The invocation's INFO line, and its fields for JSON formatters."""
    store = f"store {tally.store_s * 1000:.1f} ms in {tally.store_requests} request(s)"
    raised = "" if error is None else f"; raised {type(error).__name__}"
    counts = {name: tally.counts[name] for name in COUNTS if tally.counts.get(name)}
    fields: dict[str, Any] = {
        "idempotency_key": tally.key,
        "idempotency_source": tally.kind,
        "idempotency_store_ms": round(tally.store_s * 1000, 3),
        "idempotency_store_requests": tally.store_requests,
        "idempotency_counts": counts,
    }
    if tally.kind == "batch":
        fields["idempotency_records"] = tally.records
        said = ", ".join(f"{n} {_WORDS[name]}" for name, n in counts.items() if name != "StoreErrors") or "no claims"
        errors = f", {counts['StoreErrors']} store error(s)" if counts.get("StoreErrors") else ""
        return f"idempotency: batch of {tally.records} record(s): {said}; {store}{errors}{raised}", fields
    what = outcome(tally)
    assert what is not None
    fields["idempotency_outcome"] = what
    waited = ""
    if counts.get("Waits"):
        fields["idempotency_waited"] = True
        waited = "waited for another invocation, then "
    subject = f"key {tally.key}" if tally.key is not None else "no key"
    return f"idempotency: {tally.kind} {subject}: {waited}{_OUTCOMES[what]}; {store}{raised}", fields


class Observer:
    """Counts each invocation of one handler and writes what it did when it ends."""

    def __init__(self, emf: bool, namespace: str, function_name: str | None = None, out: Any = None) -> None:
        self.emf = emf
        self.namespace = namespace
        self.function_name = function_name or os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or "unknown"
        # Where documents go: by default stdout as the runtime set it up before importing the handler (awslambdaric
        # wraps it first), so a handler that swaps sys.stdout for its own file does not take the metrics with it.
        self.out = out if out is not None else sys.stdout
        self.level = filter_level(os.environ)

    def finish(self, tally: Tally, context: Any, error: BaseException | None) -> None:
        """Write the invocation's document and line. Never raises: the invocation's answer (the handler's result,
        or its exception) is already decided, and nothing written here may replace it."""
        if self.emf:
            try:
                doc = document(tally, self.namespace, self.function_name, int(time.time() * 1000),
                               getattr(context, "aws_request_id", None), self.level)
                out = self.out
                out.write(orjson.dumps(doc).decode() + "\n")  # one write: one line, whole
                out.flush()  # CloudWatch parses what reaches stdout
            except Exception as failure:
                _warn("writing the invocation's metrics failed (%s); the invocation is unaffected", failure)
        if logger.isEnabledFor(logging.INFO):
            try:
                message, fields = line(tally, error)
                logger.info("%s", message, extra=fields)
            except Exception as failure:
                _warn("writing the invocation's INFO line failed (%s)", failure)


def _warn(message: str, failure: Exception) -> None:
    # A log handler can fail too (the runtime's writes to a stdout the handler closed, and does not catch it).
    with contextlib.suppress(Exception):
        logger.warning(message, type(failure).__name__)
