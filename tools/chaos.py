"""The fault-injection soak (`./build.sh chaos`, `python -m tools.chaos`; issue 10).

Several execution environments (the Runtime Interface Emulator and awslambdaric, the built layer attached with
AWS_LAMBDA_EXEC_WRAPPER, `tests/e2e/apps/chaos.py` as the function) run copies of the same events concurrently,
the way Lambda retries and SQS redeliveries arrive, against DynamoDB Local behind the fault proxy. Environments are
SIGKILLed mid-invocation at a configured rate and replaced by fresh ones, as Lambda replaces a lost sandbox.
Callers resend every copy until it succeeds (a first run or a replay), within an attempt budget, treating the
in-progress and store errors as "retry later".

The verdict is drawn from the function's own side effects (one line per execution, naming the delivery
attempt) and from what callers were answered, never from the layer's logs:

- doubles: keys executed again after an execution that was not lost after its side effect (killed by us,
  gone on its own, or timed out because its handler overran on purpose), whatever became of the later one;
  a timeout the handler did not cause excuses nothing;
- divergent: keys whose successful answers differ, or name a run that never happened for that key;
- lost: copies that never succeeded within the attempt budget;
- stuck: records still INPROGRESS at the end, with every invocation over and every claim's deadline passed;
- early: re-runs that started while an earlier killed or timed-out run may still have been running (before
  its invocation's deadline), or before its claim could have ended (the deadline plus the claim margin, less
  the re-running environment's skew): two executions at once, or a claim taken over too soon.

A share of the keys (`overrun`) run past the function's timeout on their first execution, with a duplicate
whose caller keeps resending it (0.1 s to 2 s apart) while the claim is live, so the claim is taken over
soon after it ends, where clock skew matters; another share (`slow`) works seconds on every execution.

Every key not meant to overrun must finish inside the timeout, its completion included, or the README's limit (a
handler cut off after its side effect runs again) turns into a double by the soak's rule. On a loaded machine a cold
start takes longer, so a fixed margin gives way (issue 42: a slow key of 2 s in a 4 s timeout, a cold start slowed by
load and one latency spike on its claim). Before the run, a probe times invocations in as many environments of the
run's kind as it has, started at once as the run's are, on the machine as it is (`Soak.measure`); the run's timeout is
raised, when it must be, to hold the longest work and a reserve derived from that (`reserve_s`, `fitted_timeout`), and
the attempt budget with it, so that a copy's resends span as many killed claims as at the asked timeout
(`fitted_attempts`). The report shows the probe, the reserve term by term, the inits the run's environments really
took, a slow key's longest answered invocation, and any key that timed out though it was not meant to overrun
(`margin_timeouts`: the margin, or the layer, gave way; it excuses nothing, a re-run after it is a double).

`--batch sqs|kafka` delivers the copies as messages in batches (SQS-shaped, or Amazon MSK-shaped over two
partitions), each record claimed by the layer on its own; what a batch's answer reports, and every record of a
batch that failed whole, comes back in a later batch. `--purge F` has an operator purge a share of the keys once a
copy succeeded (with the CLI's own code) and send one more copy, which must run again (stale: it did not); the
environments then keep a local cache, which the purge must reach. Runs after a purge are judged on their own.

Every run after a key's first is a double, an early re-run (both fail the soak) or a documented crash-window
re-run (after a kill or an overrun, once that run's claim could have ended), reported apart. An answer the soak
does not expect (`Runtime.ExitError` among them) fails it too: an environment is killed as one (the emulator
stopped first), so no such answer is the kill's own doing.

`--durable` runs the durable soak instead (tools/durable_soak.py: durable executions fed twice, with AWS's durable
execution SDK and its local runner; `--durable --help` for its flags).

`--compare-persistence` runs the soak twice at a high fault rate: with the built layer, and with a copy of it
whose completion write is not retried (COMPLETE_MARGIN_MS made huge, so its first failure gives up).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import heapq
import http.client
import itertools
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import boto3

from tests.support.dynamodb_local import DynamoDBLocal, create_table, wait_for
from tests.support.fault_proxy import KINDS, FaultProxy, even_mix
from tests.support.rie import ROOT, Invocation, LambdaEnvironment, _session_members, ensure_layer, unpack_layer
from tools.runtime import runtime_python, terminated

APP = ROOT / "tests" / "e2e" / "apps" / "chaos.py"
HANDLER = "chaos.handler"
FUNCTION = "chaos-soak"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos", "AWS_REGION": "us-east-1",
               "AWS_DEFAULT_REGION": "us-east-1"}
# What a caller retries later, like any client of a function behind this layer.
RETRY_LATER = {"IdempotencyAlreadyInProgressError": "in_progress", "IdempotencyPersistenceLayerError": "store",
               "IdempotencyClaimConflictError": "claim_conflict"}
TIMED_OUT = b"Task timed out after"  # the emulator's answer when it killed the runtime at the function's timeout
FIRST_RESEND_S, LAST_RESEND_S = 0.1, 2.0  # callers' backoff between resends of one copy, with jitter
NO_PERSISTENCE_MARGIN_MS = 10**9  # COMPLETE_MARGIN_MS in the patched copy: no completion retry ever fits
PROGRESS_EVERY_S = 15.0
# Slack for the early-rerun check: the handler reads its clock after its claim, and the soak's send time is
# before the emulator sets the deadline, so both err on the lenient side already; this covers clock reads.
EARLY_SLACK_S = 0.05
# Batch mode: the queue, and the MSK cluster and topic (two partitions) the messages come from.
QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:chaos"
CLUSTER_ARN = "arn:aws:kafka:us-east-1:123456789012:cluster/chaos/0b1f6e5a-11aa-4f2b-9c3d-5e6f7a8b9c0d-1"
TOPIC = "orders"
# The claim margin docs/reliability.md promises (Clocks), written here rather than read from the layer: a change to the
# layer's constant is then caught by the soak, not followed by it.
CLAIM_MARGIN_S = 1.0
# The time an invocation needs beside its handler's work (issue 42). A key meant to finish inside the timeout must do
# so on a loaded machine too, or its timeout (or a completion cut at the deadline) lets the next copy run it again:
# the README's limit, which the soak counts as a double. So the timeout a run uses is derived, at its start, from what
# the probe measures on this machine as loaded as it is then (`Soak.measure`, `Timing`): the slowest cold invocation of
# as many environments as the run has, started at once as the run's are (a cold start, its init check, a claim, a
# completion and the answer; with a large result's extra when keys have them), times LOAD_FACTOR (headroom for load
# that comes after the probe: both cores of an idle machine taken by other work halve the time the run gets), plus
# FAULTED_REQUESTS of the invocation's store requests each delayed by the longest fault the proxy makes (the longest
# latency spike, or the client's first backoff after a throttle, and a retry), plus the completion's margin before the
# deadline.
LOAD_FACTOR = 2.0
FAULTED_REQUESTS = 2
THROTTLE_BACKOFF_S = 1.0  # the client's first backoff after a throttle, at most (full jitter from a 1 s base)
RETRY_S = 0.1  # a faulted request's retry itself
# The completion's last attempt ends RETURN_MARGIN_MS (300 ms) before the deadline; 50 ms more for its start.
COMPLETION_MARGIN_S = 0.35
PROBE_WARM = 3  # warm invocations the probe times after the cold ones (and as many large ones, when keys have them)
PROBE_TIMEOUT = 60  # the probe environments' own timeout: a slow machine is measured, not cut off


@dataclass(frozen=True)
class Settings:
    invocations: int = 10_000  # copies delivered, duplicates included (resends come on top)
    duplicates: float = 0.30  # fraction of the copies that repeat an earlier key
    fault_rate: float = 0.05  # fraction of store requests faulted, shared evenly among `faults`
    kill_rate: float = 0.02  # fraction of invocations whose environment is SIGKILLed mid-invocation
    environments: int = min(32, 3 * (os.cpu_count() or 2))  # 6 on 2 cores: most invocations wait on I/O
    seed: int = 1
    # The function's timeout, seconds: a killed claim lasts this long. With `fit_timeout`, the least the run uses.
    timeout: int = 4
    # A copy's attempt budget; its resends span well past a killed claim. Raised with a fitted timeout
    # (`fitted_attempts`).
    attempts: int = 20
    work_ms: int = 20  # the handler's work after its side effect: the window a kill lands in after it
    # A kill lands at most this long after the invocation was sent; once the environment's own invocation
    # times are known, within their median instead.
    kill_window_ms: int = 60
    spike_ms: tuple[int, int] = (200, 1000)  # a latency spike's range
    faults: tuple[str, ...] = KINDS
    persistent: bool = True  # False: the completion write is not retried (a patched copy of the layer)
    # Every second environment's clock runs this many seconds ahead (libfaketime in its runtime; the emulator,
    # which sets the deadline, keeps the true time, as Lambda's service does).
    skew_s: float = 0.0
    # Fraction of keys whose first execution works past the function's timeout (the emulator stops it).
    overrun: float = 0.01
    # Fraction of keys whose handler works seconds on every execution (`slow_ms`, well inside the timeout, as the
    # README asks: the run's timeout is fitted to it, see `fit_timeout`), so kills land in long work and duplicates
    # meet long claims.
    slow: float = 0.03
    slow_ms: tuple[int, int] = (1000, 2000)  # a slow key's work, drawn per key in this range
    # True: the run's timeout is `timeout` or, when that is too short, the least whole number of seconds that holds
    # the longest work and the reserve derived from the probe's measured invocation times (`fitted_timeout`), so a key
    # meant to finish inside the timeout does, on a loaded machine too; `attempts` is raised with it
    # (`fitted_attempts`). False: `timeout` and `attempts` exactly, whatever margin they leave.
    fit_timeout: bool = True
    python: str | None = None  # the runtime's Python version; default 3.12 when found
    # None: every copy is a whole event. "sqs" or "kafka": copies are messages, delivered in batches of 1 to
    # `batch_size` (SQS-shaped, or Amazon MSK-shaped over two partitions), each record claimed on its own; the
    # records a batch's answer reports failed, and every record of a batch that failed whole, come back in later
    # batches, as the queue or the partition redelivers them.
    batch: str | None = None
    batch_size: int = 4
    # Fraction of keys an operator purges once a copy of theirs succeeded (`idempotency-layer purge`'s own code),
    # then sends one more copy of, which must run again: once. The environments keep a local cache, which a purge
    # must reach.
    purge: float = 0.0
    # Fraction of keys (whole events) whose result is over a record (LARGE_BYTES of base64 text): kept in the
    # large-results bucket, on moto's S3 server (IDEMPOTENCY_LARGE_RESULTS_BUCKET), and replayed from it.
    large: float = 0.0

    def check(self) -> None:
        for name in ("duplicates", "fault_rate", "kill_rate", "overrun", "slow"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a fraction between 0 and 1, not {getattr(self, name)}")
        if not 0 < self.slow_ms[0] <= self.slow_ms[1]:
            raise ValueError(f"slow_ms is a range of milliseconds, low to high, not {self.slow_ms}")
        if self.duplicates >= 1 or self.invocations < 1 or self.environments < 1 or self.attempts < 1:
            raise ValueError("need invocations >= 1, duplicates < 1, environments >= 1 and attempts >= 1")
        if self.timeout < 2:
            raise ValueError("the timeout must leave the handler and the layer room: at least 2 s")
        if self.batch not in (None, "sqs", "kafka") or not 1 <= self.batch_size <= 10:
            raise ValueError("batch is sqs or kafka, of 1 to 10 records")
        if not 0 <= self.purge <= 1:
            raise ValueError(f"purge is a fraction between 0 and 1, not {self.purge}")
        unknown = set(self.faults) - set(KINDS)
        if unknown or not self.faults:
            raise ValueError(f"fault kinds are some of {', '.join(KINDS)}, not {sorted(unknown) or 'none'}")


@dataclass
class Copy:
    """One delivery of a key's event; `attempts` counts its sends so far."""

    key: str
    index: int  # 0: the key's first copy
    attempts: int = 0
    after_purge: bool = False  # sent once its key was purged: it must run again


@dataclass
class Attempt:
    id: str
    key: str  # the copy's key; in batch mode "batch", its keys in `keys`
    started: float
    ended: float = 0.0
    outcome: str = ""  # ok, in_progress, store, claim_conflict, killed, timeout, connection, unexpected:<what>
    body: bytes | None = None
    killed: bool = False  # SIGKILLed before its answer came
    skewed: bool = False  # sent to an environment whose clock runs ahead
    sent_at: float = 0.0  # time.time() when sent, by the soak's own clock
    kill_sent: bool = False  # a kill was sent while it ran (before its answer, or racing it)
    environment: int = 0  # the serial of the environment it was sent to (its log: logs/env-<serial>.log)
    keys: tuple[str, ...] = ()  # every key it carried (a batch's records; a whole event's one key)


def faketime_library() -> str:
    """libfaketime's multithreaded library (Debian's `faketime` package), for an environment's skewed clock."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        raise RuntimeError("a skewed clock needs libfaketime: apt-get install -y faketime")
    return found[0]


def record_id(key: str) -> str:
    """The layer's record key for `key` (docs/how-it-works.md: `<prefix>#<sha256 of the canonical JSON>`)."""
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return f"{FUNCTION}#{hashlib.sha256(canonical).hexdigest()}"


LARGE_BYTES = 700_000
LARGE_BUCKET = "chaos-large-results"


def large(settings: Settings, key: str) -> bool:
    """Whether `key`'s result is too large for a record (whole events only)."""
    return settings.batch is None and random.Random(f"{settings.seed}:large:{key}").random() < settings.large


def overruns(settings: Settings, key: str) -> bool:
    """Whether `key`'s first execution works past the function's timeout (whole events only)."""
    return settings.batch is None and random.Random(f"{settings.seed}:overrun:{key}").random() < settings.overrun


def slow(settings: Settings, key: str) -> bool:
    """Whether `key`'s handler works `slow_ms` on every execution."""
    return random.Random(f"{settings.seed}:slow:{key}").random() < settings.slow and not overruns(settings, key)


def work_ms(settings: Settings, key: str) -> int:
    """How long `key`'s handler works after its side effect: `slow_ms` for a slow key, else `work_ms`."""
    if not slow(settings, key):
        return settings.work_ms
    rng = random.Random(f"{settings.seed}:slow:{key}")
    rng.random()  # slow()'s draw: the same keys and the same work as before `slow_ms` was a setting
    return int(rng.uniform(settings.slow_ms[0] / 1000, settings.slow_ms[1] / 1000) * 1000)


@dataclass(frozen=True)
class Timing:
    """What the probe measured at a run's start, send to answer, in environments of the run's own kind (its layer,
    Python, settings and clocks) on this machine as loaded as it was then, straight to DynamoDB Local (the faults are
    allowed for apart): the slowest first (cold) invocation of the environments started at once, the median of the
    warm invocations, and the slowest warm invocation with a large result (None when keys have none)."""

    cold_ms: float
    warm_ms: float
    large_ms: float | None = None

    @property
    def overhead_s(self) -> float:
        """The longest invocation without work: a cold one, with a large result's extra when keys have them."""
        extra = max(0.0, self.large_ms - self.warm_ms) if self.large_ms is not None else 0.0
        return (self.cold_ms + extra) / 1000


def fault_delay_s(settings: Settings) -> float:
    """The longest one faulted store request adds to an invocation: the longest latency spike, or the client's first
    backoff after a throttle, and the retry."""
    if not settings.fault_rate:
        return 0.0
    return max(settings.spike_ms[1] / 1000, THROTTLE_BACKOFF_S) + RETRY_S


def reserve_s(settings: Settings, timing: Timing) -> float:
    """The time an invocation is given beside its handler's work: the probe's measured invocation times
    LOAD_FACTOR, FAULTED_REQUESTS faulted requests, and the completion's margin before the deadline."""
    return LOAD_FACTOR * timing.overhead_s + FAULTED_REQUESTS * fault_delay_s(settings) + COMPLETION_MARGIN_S


def longest_work_s(settings: Settings) -> float:
    """The longest a handler meant to finish inside the timeout works after its side effect."""
    return max(settings.work_ms, settings.slow_ms[1] if settings.slow else 0) / 1000


def fitted_timeout(settings: Settings, timing: Timing) -> int:
    """The run's timeout: `settings.timeout`, or the least whole seconds that hold the longest work and the reserve."""
    needed = longest_work_s(settings) + reserve_s(settings, timing)
    return max(settings.timeout, -int(-needed // 1))


def resend_span_s(attempts: int) -> float:
    """The least time a copy's resends span, `attempts` attempts in all: every backoff at its jitter's shortest."""
    return sum(min(FIRST_RESEND_S * 2 ** (n - 1), LAST_RESEND_S) * 0.5 for n in range(1, attempts))


def fitted_attempts(settings: Settings, timeout: int) -> int:
    """The attempt budget at `timeout`: `settings.attempts`, or more so that a copy's resends span as many killed
    claims (the timeout and the claim margin each) as they span at `settings.timeout` (a raised timeout makes each
    killed claim a copy waits out longer; the same budget would then lose copies the asked timeout keeps)."""
    needed = resend_span_s(settings.attempts) * (timeout + CLAIM_MARGIN_S) / (settings.timeout + CLAIM_MARGIN_S)
    attempts = settings.attempts
    while resend_span_s(attempts) < needed:
        attempts += 1
    return attempts


def margin_timeouts(runs_of: Mapping[str, list[dict[str, Any]]], attempts: Mapping[str, Attempt],
                    overruns: Callable[[str], bool], skew_s: float = 0.0) -> list[str]:
    """Keys with an execution that timed out though it was not meant to overrun (any but an overrunning key's first
    execution): the soak's own margin gave way (the machine, or faults beyond those it allows for), or the layer held
    the function past its deadline. It excuses nothing: the verdict counts a re-run after it a double either way."""
    def started(run: Mapping[str, Any]) -> float:  # by the soak's clock, as `_judged` orders runs
        attempt = attempts.get(run.get("attempt") or "")
        return run["clock"] - (skew_s if attempt is not None and attempt.skewed else 0.0)

    found = set()
    for key, runs in runs_of.items():
        outcomes = [getattr(attempts.get(run.get("attempt") or ""), "outcome", None)
                    for run in sorted(runs, key=started)]
        if "timeout" in (outcomes[1:] if overruns(key) else outcomes):
            found.add(key)
    return sorted(found)


def message_id(key: str) -> str:
    return f"msg-{key}"


def kafka_position(key: str) -> tuple[int, int]:
    """The partition and offset of `key`'s message: two partitions, offsets rising with the key."""
    n = int(key[1:])
    return n % 2, n // 2


def stored_id(settings: Settings, key: str) -> str:
    """The layer's record key for `key`'s copies: the whole event's key expression (`key`), or a batch record's
    delivery identity (its messageId; its cluster, topic, partition and offset)."""
    if settings.batch == "sqs":
        return record_id(message_id(key))
    if settings.batch == "kafka":
        return record_id([CLUSTER_ARN, TOPIC, *kafka_position(key)])
    return record_id(key)


def payload(key: str) -> dict[str, Any]:
    return {"key": key, "amount": int(key[1:]) % 997}


def batch_event(settings: Settings, copies: list[Copy], attempt: str, receives: Counter[str]) -> dict[str, Any]:
    """One delivery of `copies` as Lambda's SQS or Amazon MSK event source mapping sends it; `receives` counts each
    message's deliveries so far (SQS's ApproximateReceiveCount). `attempt` names the delivery for the handler's
    lines."""
    import base64
    import uuid

    now = int(time.time() * 1000)

    def body(copy: Copy) -> str:
        return json.dumps({"key": copy.key, "payload": payload(copy.key), "work_ms": work_ms(settings, copy.key)})

    if settings.batch == "sqs":
        records = []
        for copy in copies:
            receives[copy.key] += 1
            text = body(copy)
            records.append({
                "messageId": message_id(copy.key), "receiptHandle": uuid.uuid4().hex, "body": text,
                "attributes": {"ApproximateReceiveCount": str(receives[copy.key]), "SentTimestamp": str(now),
                               "SenderId": "AIDAIENQZJOLO23YVJ4VO", "ApproximateFirstReceiveTimestamp": str(now)},
                "messageAttributes": {}, "md5OfBody": hashlib.md5(text.encode()).hexdigest(),
                "eventSource": "aws:sqs", "eventSourceARN": QUEUE_ARN, "awsRegion": "us-east-1"})
        return {"Records": records, "attempt": attempt}
    lists: dict[str, list[dict[str, Any]]] = {}
    for copy in sorted(copies, key=lambda c: kafka_position(c.key)[::-1]):
        partition, offset = kafka_position(copy.key)
        lists.setdefault(f"{TOPIC}-{partition}", []).append({
            "topic": TOPIC, "partition": partition, "offset": offset, "timestamp": now,
            "timestampType": "CREATE_TIME", "key": base64.b64encode(copy.key.encode()).decode(),
            "value": base64.b64encode(body(copy).encode()).decode(), "headers": []})
    return {"eventSource": "aws:kafka", "eventSourceArn": CLUSTER_ARN,
            "bootstrapServers": "b-1.chaos.kafka.us-east-1.amazonaws.com:9098", "records": lists, "attempt": attempt}


def batch_failures(settings: Settings, value: Any, copies: list[Copy]) -> set[str] | None:
    """The keys of `copies` a batch's answer says must come back (a partial batch response), or None when the
    answer is not one (the whole batch comes back)."""
    if value is None:
        return set()
    items = value.get("batchItemFailures") if isinstance(value, dict) else None
    if not isinstance(items, list):
        return None
    failed: set[str] = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        for copy in copies:
            if settings.batch == "sqs" and identifier == message_id(copy.key):
                failed.add(copy.key)
            elif settings.batch == "kafka" and isinstance(identifier, dict):
                partition, offset = kafka_position(copy.key)  # that partition comes back from that offset on
                if identifier.get("partition") == f"{TOPIC}-{partition}" and offset >= identifier.get("offset", 0):
                    failed.add(copy.key)
    return failed


def plan(settings: Settings) -> list[Copy]:
    """The copies in delivery order: each key's first copy in turn, duplicates near it (half of them within
    as many slots as there are environments, so they run at the same time) or some way after it."""
    rng = random.Random(f"{settings.seed}:plan")
    duplicates = round(settings.invocations * settings.duplicates)
    keys = settings.invocations - duplicates
    slots = [(float(i), Copy(f"k{i:06d}", 0)) for i in range(keys)]
    seen = Counter[int]()
    e = settings.environments
    # A key that overruns gets a duplicate at once, which waits on its claim and takes it over at the end.
    overrunning = [i for i in range(keys) if overruns(settings, f"k{i:06d}")][:duplicates]
    for i in overrunning:
        seen[i] += 1
        slots.append((i + rng.uniform(0, e), Copy(f"k{i:06d}", seen[i])))
    for _ in range(duplicates - len(overrunning)):
        i = rng.randrange(keys)
        seen[i] += 1
        offset = rng.uniform(0, e) if rng.random() < 0.5 else rng.uniform(e, 100 * e)
        slots.append((i + offset, Copy(f"k{i:06d}", seen[i])))
    slots.sort(key=lambda slot: slot[0])
    return [copy for _, copy in slots]


class Schedule:
    """Copies waiting to be sent: resends when their backoff is over, first, then fresh copies in order."""

    def __init__(self, copies: Iterable[Copy]) -> None:
        self._fresh = deque(copies)
        self._resends: list[tuple[float, int, Copy]] = []
        self._order = itertools.count()
        self._open = len(self._fresh)
        self._cond = threading.Condition()

    def take(self) -> Copy | None:
        """The next copy to send; None once every copy is settled."""
        with self._cond:
            while self._open > 0:
                now = time.monotonic()
                if self._resends and self._resends[0][0] <= now:
                    return heapq.heappop(self._resends)[2]
                if self._fresh:
                    return self._fresh.popleft()
                self._cond.wait(self._resends[0][0] - now if self._resends else None)
            return None

    def take_more(self, n: int) -> list[Copy]:
        """Up to `n` more copies that are due now, without waiting (the rest of a batch)."""
        found: list[Copy] = []
        with self._cond:
            now = time.monotonic()
            while len(found) < n and self._resends and self._resends[0][0] <= now:
                found.append(heapq.heappop(self._resends)[2])
            while len(found) < n and self._fresh:
                found.append(self._fresh.popleft())
        return found

    def add(self, copy: Copy) -> None:
        """One more copy to settle, due now (the copy an operator sends after a purge)."""
        with self._cond:
            self._open += 1
            heapq.heappush(self._resends, (time.monotonic(), next(self._order), copy))
            self._cond.notify()

    def resend(self, copy: Copy, delay: float) -> None:
        with self._cond:
            heapq.heappush(self._resends, (time.monotonic() + delay, next(self._order), copy))
            self._cond.notify()

    def settle(self) -> None:
        with self._cond:
            self._open -= 1
            if self._open <= 0:
                self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._open = 0
            self._cond.notify_all()

    @property
    def open(self) -> int:
        with self._cond:
            return self._open


class _Guard:
    """Decides, under its lock, whether a kill or the answer came first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered = False
        self.killed = False


def kill(env: LambdaEnvironment) -> None:
    """Kill the environment as one, as Lambda loses a sandbox: the emulator is stopped first (SIGSTOP: from then on
    it answers nothing), then every process of its session (RIE and the runtime share the one RIE's start made) is
    SIGKILLed. Killed one at a time, the runtime could die first and the emulator, still running, answer
    `Runtime.ExitError` for the invocation, which the soak then read as the invocation's own end (issue 28: one
    double, in one of three runs of seed 1)."""
    process = env.process
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGSTOP)
    for pid in _session_members(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Soak:
    """One soak run: environments, callers and a killer against a table behind a fault proxy."""

    def __init__(self, settings: Settings, *, work: Path, dynamodb_endpoint: str, python: Path, python_version: str,
                 opt_dir: Path, say: Callable[[str], None] = print) -> None:
        settings.check()
        self.settings = settings
        self.work = work
        self.python, self.python_version = python, python_version
        self.opt_dir = opt_dir
        self.say = say
        self.dynamodb_endpoint = dynamodb_endpoint
        self.runs_file = work / "runs.jsonl"
        self.task_root = work / "task"
        self.logs = work / "logs"
        self.table = f"chaos-{settings.seed}-{os.urandom(4).hex()}"
        self.copies = plan(settings)
        self.schedule = Schedule(self.copies)
        self._lock = threading.Lock()
        self.attempts: dict[str, Attempt] = {}
        self.outcomes: Counter[str] = Counter()
        self.kills = Counter[str]()
        self.lost: list[Copy] = []
        self.receives = Counter[str]()  # each message's deliveries (batch mode)
        self.purged: dict[str, float] = {}  # key -> when (time.time()) its record was purged
        self.purges_refused = 0
        self._store: Any = None  # the operator's, for purges
        self.first_sent: dict[str, float] = {}  # key -> the monotonic time its first copy was sent
        self.first_ok: dict[str, float] = {}  # key -> the monotonic time a copy of it first succeeded
        self._batches = itertools.count(1)
        self._envs = itertools.count(1)
        self._live: set[LambdaEnvironment] = set()  # started and not yet stopped, so an abort stops them all
        self._closing = False
        self.proxy: FaultProxy | None = None
        self.s3: Any = None  # moto's server, holding the large-results bucket (Settings.large)
        self.timing: Timing | None = None  # what the probe measured (Settings.fit_timeout)
        # The timeout and attempt budget asked for; settings holds those the run uses (`fit_timeout`).
        self.asked_timeout, self.asked_attempts = settings.timeout, settings.attempts
        self.started = self.ended = 0.0

    # -- the run --------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        s = self.settings
        self.task_root.mkdir(parents=True)
        self.logs.mkdir()
        shutil.copy(APP, self.task_root / APP.name)
        client = dynamodb_client(self.dynamodb_endpoint)
        create_table(client, self.table)
        host, port = self.dynamodb_endpoint.rsplit("//", 1)[1].rsplit(":", 1)
        rates = even_mix(s.fault_rate, s.faults)
        self.proxy = FaultProxy(host, int(port), rates, seed=s.seed, spike=(s.spike_ms[0] / 1000, s.spike_ms[1] / 1000))
        if s.large:
            from tests.support.sqs_server import SQSServer

            self.s3 = SQSServer(self.work / "moto.log").start()
            boto3.client("s3", endpoint_url=self.s3.endpoint, region_name="us-east-1", aws_access_key_id="a",
                         aws_secret_access_key="b").create_bucket(Bucket=LARGE_BUCKET)
        workers: list[Worker] = []
        try:
            if s.fit_timeout:
                self.timing = self.measure()
                timeout = fitted_timeout(s, self.timing)
                if timeout != s.timeout:
                    attempts = fitted_attempts(s, timeout)
                    self.say(f"  timeout {timeout} s, not {s.timeout} s: the longest work ({longest_work_s(s):.2f} s) "
                             f"and the reserve ({reserve_s(s, self.timing):.2f} s, from a cold invocation of "
                             f"{self.timing.cold_ms:.0f} ms here now) need it; {attempts} attempts a copy, not "
                             f"{s.attempts}, to span as many killed claims")
                    self.settings = s = replace(s, timeout=timeout, attempts=attempts)
            workers += [Worker(self, slot) for slot in range(s.environments)]
            self.started = time.monotonic()
            for worker in workers:
                worker.start()
            self._watch(workers)
            self.ended = time.monotonic()
            errors = [worker.error for worker in workers if worker.error is not None]
            if errors:
                raise RuntimeError(f"a caller failed: {errors[0]!r}") from errors[0]
            # Every environment is stopped: nothing can touch the table any more.
            return self._report(client)
        finally:
            self._close(workers)
            self.proxy.close()
            if self.s3 is not None:
                self.s3.stop()
            with contextlib.suppress(Exception):
                client.delete_table(TableName=self.table)

    def _watch(self, workers: list[Worker]) -> None:
        last = time.monotonic()
        while any(worker.is_alive() for worker in workers):
            for worker in workers:
                worker.join(timeout=0.5)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                with self._lock:
                    sent, ok, kills = len(self.attempts), self.outcomes["ok"], self.kills["mid_invocation"]
                self.say(f"  ... {len(self.copies) - self.schedule.open}/{len(self.copies)} copies settled, "
                         f"{sent} invocations sent, {ok} answered, {kills} kills, "
                         f"{self.proxy.faults() if self.proxy else 0} faults, {last - self.started:.0f} s")

    def _close(self, workers: list[Worker]) -> None:
        """Stop every environment still running (after an error or an interrupt; none after a clean run)."""
        self.schedule.abort()
        for _ in range(2):  # again after the callers ended, for one that was starting an environment
            with self._lock:
                self._closing = True
                live = list(self._live)
            for env in live:
                self.retire(env)
            for worker in workers:
                if worker.is_alive():
                    worker.join(timeout=self.settings.timeout + 35)

    def variables(self, *, endpoint: str, table: str, runs_file: Path, skewed: bool) -> dict[str, str]:
        """An environment's variables: the layer's settings for this run against `endpoint` and `table`, the
        handler's runs file, and the skewed clock when `skewed`."""
        s = self.settings
        variables = {**CREDENTIALS, "AWS_ENDPOINT_URL_DYNAMODB": endpoint, "IDEMPOTENCY_TABLE": table,
                     "IDEMPOTENCY_KEY_JMESPATH": "key", "IDEMPOTENCY_PAYLOAD_JMESPATH": "payload",
                     "CHAOS_RUNS_FILE": str(runs_file)}
        if s.batch is not None:  # each record keyed by its delivery identity, its payload fingerprinted
            del variables["IDEMPOTENCY_KEY_JMESPATH"]
            variables["IDEMPOTENCY_PAYLOAD_JMESPATH"] = ("json_parse(body).payload" if s.batch == "sqs"
                                                         else "json_parse(base64_decode(value)).payload")
        if s.purge:
            variables["IDEMPOTENCY_LOCAL_CACHE_SIZE"] = "256"  # a purge must reach it
        if self.s3 is not None:
            variables.update(IDEMPOTENCY_LARGE_RESULTS_BUCKET=LARGE_BUCKET, AWS_ENDPOINT_URL_S3=self.s3.endpoint)
        if skewed:
            variables.update(LD_PRELOAD=faketime_library(), FAKETIME=f"{s.skew_s:+.3f}")
        return variables

    def measure(self) -> Timing:
        """Time invocations before the run, on this machine as loaded as it is now: `environments` environments of
        this run's kind (every second one skewed, when clocks are) started at once, as the run's are, each timed on
        its first invocation (a cold start); then PROBE_WARM warm invocations in one of them and, when keys have large
        results, PROBE_WARM with one. Their own table, runs file and logs (logs/probe-*.log), straight to DynamoDB
        Local: nothing of it reaches the run's figures, and the faults are allowed for apart (`reserve_s`)."""
        s = self.settings
        probe = self.work / "probe"
        probe.mkdir()
        table = f"{self.table}-probe"
        client = dynamodb_client(self.dynamodb_endpoint)
        create_table(client, table)
        keys = itertools.count()

        def event(large_result: bool = False) -> dict[str, Any]:
            i = next(keys)
            key, attempt = f"p{i:06d}", f"probe.{i}"
            if s.batch is not None:
                return batch_event(replace(s, slow=0.0, work_ms=0), [Copy(key, 0)], attempt, Counter())
            found: dict[str, Any] = {"key": key, "payload": payload(key), "work_ms": 0, "attempt": attempt}
            if large_result:
                found["large"] = LARGE_BYTES
            return found

        def timed(env: LambdaEnvironment, found: dict[str, Any]) -> float:
            began = time.monotonic()
            answer = env.invoke(found, timeout=PROBE_TIMEOUT + 30)
            took = (time.monotonic() - began) * 1000
            if answer.status != 200 or answer.error_type is not None or answer.body.startswith(TIMED_OUT):
                raise RuntimeError(f"the timing probe's invocation failed: {answer.body[:300]!r}\n{env.logs()[-2000:]}")
            return took

        envs = [LambdaEnvironment(
            self.python, self.task_root, version=self.python_version, handler=HANDLER, opt_dir=self.opt_dir,
            timeout=PROBE_TIMEOUT, function_name=FUNCTION, log_path=self.logs / f"probe-{n}.log",
            env=self.variables(endpoint=self.dynamodb_endpoint, table=table, runs_file=probe / "runs.jsonl",
                               skewed=bool(s.skew_s) and n % 2 == 1),
        ) for n in range(s.environments)]
        cold: list[float] = []
        errors: list[BaseException] = []

        def first(env: LambdaEnvironment, found: dict[str, Any]) -> None:
            try:
                cold.append(timed(env, found))
            except BaseException as error:
                errors.append(error)

        try:
            for env in envs:
                env.start()
            threads = [threading.Thread(target=first, args=(env, event()), daemon=True) for env in envs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            warm = sorted(timed(envs[0], event()) for _ in range(PROBE_WARM))
            large_ms = (max(timed(envs[0], event(large_result=True)) for _ in range(PROBE_WARM))
                        if self.s3 is not None and s.batch is None else None)
        finally:
            for env in envs:
                env.stop()
            with contextlib.suppress(Exception):
                client.delete_table(TableName=table)
        return Timing(cold_ms=round(max(cold), 1), warm_ms=round(warm[len(warm) // 2], 1),
                      large_ms=None if large_ms is None else round(large_ms, 1))

    def environment(self) -> LambdaEnvironment:
        """A fresh environment, started (the runtime inits on its first invocation, as a cold start does)."""
        s = self.settings
        assert self.proxy is not None
        serial = next(self._envs)
        skewed = bool(s.skew_s) and serial % 2 == 1
        variables = self.variables(endpoint=self.proxy.endpoint, table=self.table, runs_file=self.runs_file,
                                   skewed=skewed)
        env = LambdaEnvironment(
            self.python, self.task_root, version=self.python_version, handler=HANDLER, opt_dir=self.opt_dir,
            timeout=s.timeout, function_name=FUNCTION, log_path=self.logs / f"env-{serial}.log", env=variables,
        )
        env.skewed = skewed
        env.serial = serial
        with self._lock:
            if self._closing:
                raise RuntimeError("the soak is closing: no new environment")
            self._live.add(env)
        try:
            return env.start()
        finally:
            # A close that came while this one was starting found nothing to stop yet (a SIGTERMed soak left
            # emulators running so): stop it now.
            with self._lock:
                closing = self._closing
            if closing:
                env.stop()

    def retire(self, env: LambdaEnvironment) -> None:
        env.stop()
        with self._lock:
            self._live.discard(env)

    def event(self, copy: Copy, attempt: str) -> dict[str, Any]:
        # `attempt` differs per delivery, as a redelivered message's receipt handle does; it is neither key
        # nor payload, so every copy is the same operation with the same payload.
        event = {"key": copy.key, "payload": {"key": copy.key, "amount": int(copy.key[1:]) % 997},
                 "work_ms": work_ms(self.settings, copy.key), "attempt": attempt}
        if overruns(self.settings, copy.key):
            event["overrun"] = True
        if large(self.settings, copy.key):
            event["large"] = LARGE_BYTES
        return event

    def record(self, attempt: Attempt) -> None:
        with self._lock:
            self.attempts[attempt.id] = attempt
            self.outcomes[attempt.outcome] += 1

    def count_kill(self, what: str) -> None:
        with self._lock:
            self.kills[what] += 1

    def lose(self, copy: Copy) -> None:
        with self._lock:
            self.lost.append(copy)

    def sent(self, key: str, at: float) -> None:
        with self._lock:
            self.first_sent.setdefault(key, at)

    def succeeded(self, copy: Copy, at: float) -> None:
        """A copy of `copy.key` succeeded: the first one of a key chosen for purging has its record purged, and one
        more copy follows, which must run again."""
        with self._lock:
            self.first_ok.setdefault(copy.key, at)
            purge = (not copy.after_purge and copy.key not in self.purged
                     and random.Random(f"{self.settings.seed}:purge:{copy.key}").random() < self.settings.purge)
            if purge:
                self.purged[copy.key] = 0.0  # claimed by this caller
        if purge:
            self._purge(copy.key)

    def _purge(self, key: str) -> None:
        """`idempotency-layer purge KEY --yes`, with its own code, against DynamoDB Local directly (an operator's
        requests do not cross the function's faults); a live claim is waited out, as an operator would."""
        from idempotency_layer.cli.records import Missing, Refused, purge

        for _ in range(20):
            try:
                purge(self._operator_store(), stored_id(self.settings, key), yes=True, force=False)
            except Missing:
                break  # nothing to purge (it expired): nothing to run again either
            except Refused:
                time.sleep(0.5)
                continue
            with self._lock:
                self.purged[key] = time.time()
            self.schedule.add(Copy(key, -1, after_purge=True))
            return
        with self._lock:
            del self.purged[key]
            self.purges_refused += 1

    def _operator_store(self) -> Any:
        with self._lock:
            if self._store is None:
                self._store = self._new_operator_store()
            return self._store

    def _new_operator_store(self) -> Any:
        from idempotency_layer.aws.target import Credentials, Target
        from idempotency_layer.config import Attributes
        from idempotency_layer.stores.dynamodb.client import Client
        from idempotency_layer.stores.dynamodb.store import DynamoDBStore

        credentials = Credentials(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"], None)
        target = Target(self.dynamodb_endpoint, CREDENTIALS["AWS_REGION"], lambda: credentials)
        return DynamoDBStore(Client(target, connect_timeout=2, read_timeout=5, max_attempts=3), self.table,
                             Attributes(), key_prefix="fn")

    # -- the verdict ----------------------------------------------------------------------------------------

    def _runs(self) -> list[dict[str, Any]]:
        if not self.runs_file.exists():
            return []
        return [json.loads(line) for line in self.runs_file.read_text().splitlines()]

    def _records(self, client: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        pages = client.get_paginator("scan").paginate(TableName=self.table, ConsistentRead=True)
        for page in pages:
            items += page["Items"]
        return items

    def _stuck(self, client: Any) -> tuple[list[str], int]:
        """Records still INPROGRESS once every claim's deadline has passed; and how many were live at first."""
        def in_progress() -> list[dict[str, Any]]:
            return [item for item in self._records(client) if item["status"]["S"] == "INPROGRESS"]

        live = [item for item in in_progress() if int(item["in_progress_until"]["N"]) >= time.time() * 1000]
        if live:  # nothing runs any more, so these can only expire: wait until they have
            until = max(int(item["in_progress_until"]["N"]) for item in live) / 1000
            wait_for(lambda: time.time() > until + 0.1, self.settings.timeout + 30, "the live claims' deadlines")
        return [item["id"]["S"] for item in in_progress()], len(live)

    @staticmethod
    def _clock_offsets(runs: list[dict[str, Any]], attempts: dict[str, Attempt]) -> dict[str, float | None]:
        """How far ahead of the soak's clock each kind of environment's handler saw the time (median, from the
        handler's own line against the time its invocation was sent): the skew really applied, or not."""
        offsets: dict[bool, list[float]] = {True: [], False: []}
        for run in runs:
            attempt = attempts.get(run.get("attempt") or "")
            if attempt is not None and "clock" in run:
                offsets[attempt.skewed].append((run["clock"] - attempt.sent_at) * 1000)
        return {"skewed": percentile(sorted(offsets[True]), 50), "others": percentile(sorted(offsets[False]), 50)}

    def _timing_figures(self) -> dict[str, Any]:
        """What the probe measured, the reserve and timeout derived from it, and the cold starts the run's own
        environments really took (the emulator's INIT REPORT lines): the margin, and what it was up against."""
        s = self.settings
        inits = []
        for log in sorted(self.logs.glob("env-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if "INIT REPORT(durationMs: " in line:
                    with contextlib.suppress(ValueError):
                        inits.append(float(line.split("durationMs: ", 1)[1].split(")", 1)[0]))
        inits.sort()
        timing = self.timing
        return {
            "probe": None if timing is None else asdict(timing),
            "reserve_s": None if timing is None else round(reserve_s(s, timing), 2),
            # reserve_s, term by term: LOAD_FACTOR times the measured overhead, the faults allowed for, the margin
            "reserve_terms": None if timing is None else {
                "load_factor": LOAD_FACTOR, "overhead_s": round(timing.overhead_s, 3),
                "faulted_requests": FAULTED_REQUESTS, "fault_delay_s": fault_delay_s(s),
                "completion_margin_s": COMPLETION_MARGIN_S},
            "longest_work_s": longest_work_s(s),
            "asked_timeout_s": self.asked_timeout,
            "asked_attempts": self.asked_attempts,
            "timeout_s": s.timeout,
            "cold_starts": {"count": len(inits), "p50_ms": percentile(inits, 50),
                            "max_ms": round(inits[-1], 1) if inits else None},
        }

    def _report(self, client: Any) -> dict[str, Any]:
        s = self.settings
        assert self.proxy is not None
        runs = self._runs()
        attempts = self.attempts
        stuck, live_at_end = self._stuck(client)
        # A key whose every copy ran out of attempts leaves its last claim behind: that is the loss, counted once.
        lost_ids = {stored_id(s, copy.key) for copy in self.lost}
        stuck = [i for i in stuck if i not in lost_ids]
        records = self._records(client)

        def skew(run: Mapping[str, Any]) -> float:
            attempt = attempts.get(run.get("attempt") or "")
            return s.skew_s if attempt is not None and attempt.skewed else 0.0

        # A purge starts a key anew: its runs after the purge are judged on their own ("<key>+purged").
        runs_of: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            purged_at = self.purged.get(run["key"])
            after = bool(purged_at) and run["clock"] - skew(run) > purged_at
            runs_of.setdefault(run["key"] + ("+purged" if after else ""), []).append(run)

        def overran(key: str) -> bool:
            return "+" not in key and overruns(s, key)

        doubles, early = verdict(runs_of, attempts, timeout=s.timeout, skew_s=s.skew_s, overruns=overran)
        margin = margin_timeouts(runs_of, attempts, overran, skew_s=s.skew_s)
        windowed = windowed_reruns(runs_of, attempts, timeout=s.timeout, skew_s=s.skew_s, overruns=overran)
        # A key purged whose copy after the purge did not run again: the purge did not take (a replay from a cache).
        stale = sorted(key for key, at in self.purged.items() if at and f"{key}+purged" not in runs_of)

        reruns = sum(len(found) - 1 for found in runs_of.values() if len(found) > 1)
        killed_after_effect = sum(1 for run in runs if (a := attempts.get(run.get("attempt") or "")) and a.killed)
        timed_out_after_effect = sum(1 for run in runs
                                     if (a := attempts.get(run.get("attempt") or "")) and a.outcome == "timeout")

        touched = {key for a in attempts.values() if a.killed or a.outcome == "timeout" for key in a.keys}
        epoch_of = {r["run"]: key for key, found in runs_of.items() for r in found}
        own = {(r["key"], r["run"], r.get("attempt")) for r in runs}
        answers: dict[str, set[bytes]] = {}  # per key and epoch: a whole event's answers
        fresh = replays = 0
        for attempt in attempts.values():
            if s.batch is None and attempt.outcome == "ok" and attempt.body is not None:
                value = json.loads(attempt.body)
                answers.setdefault(epoch_of.get(value.get("run"), attempt.key), set()).add(attempt.body)
                if (attempt.key, value.get("run"), attempt.id) in own:
                    fresh += 1
                else:
                    replays += 1
                if ".-1." in attempt.id and epoch_of.get(value.get("run")) != f"{attempt.key}+purged":
                    stale.append(attempt.key)  # answered after its purge with what ran before it
        divergent = []
        for epoch, bodies in answers.items():
            values = [json.loads(body) for body in bodies]
            key = epoch.split("+")[0]
            if len(bodies) > 1 or any(v.get("key") != key or epoch_of.get(v.get("run")) != epoch for v in values):
                divergent.append(epoch)
        stale = sorted(set(stale))

        def latencies(keys: Iterable[str]) -> dict[str, float | int | None]:
            values = sorted((self.first_ok[k] - self.first_sent[k]) * 1000 for k in keys
                            if k in self.first_ok and k in self.first_sent)
            return {"keys": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
                    "max": round(values[-1], 1) if values else None}

        keys = {copy.key for copy in self.copies}
        named = {stored_id(s, key): key for key in keys}
        faults = self.proxy.snapshot()
        figures = {
            "copies": len(self.copies),
            "keys": len(keys),
            "duplicates": len(self.copies) - len(keys),
            "invocations_sent": len(attempts),
            "resends": len(attempts) - len(self.copies),
            "attempts_max": max((copy.attempts for copy in self.copies), default=0),  # of the budget, `attempts`
            "answers": dict(sorted(self.outcomes.items())),
            "first_runs_answered": fresh,
            "replays_answered": replays,
            "store_requests": faults["requests"],
            "faults": {kind: faults[kind] for kind in KINDS},
            "faults_total": sum(faults[kind] for kind in KINDS),
            "upstream_errors": faults["upstream_error"],
            "kills": self.kills["mid_invocation"],
            "kills_after_side_effect": killed_after_effect,
            "kills_after_answer": self.kills["after_answer"],
            "kills_too_late": self.kills["too_late"],
            "timeouts": self.outcomes["timeout"],
            "timeouts_after_side_effect": timed_out_after_effect,
            "environments_started": next(self._envs) - 1,
            "executions": len(runs),
            "re_executions": reruns,
            "crash_window_reruns": windowed,
            "doubles": len(doubles),
            "early": len(early),
            "overrun_keys": sum(overruns(s, key) for key in keys),
            "slow_keys": sum(slow(s, key) for key in keys),
            # The longest answered invocation of a slow key (whole events), against the timeout: the margin it left.
            "slow_answered_max_ms": max((round((a.ended - a.started) * 1000, 1) for a in attempts.values()
                                         if a.outcome == "ok" and s.batch is None and slow(s, a.key)), default=None),
            # Keys with an execution that timed out though it was not meant to overrun: the soak's margin gave way.
            "margin_timeouts": len(margin),
            "divergent": len(divergent),
            "purged": sum(1 for at in self.purged.values() if at),
            "purges_refused": self.purges_refused,
            "stale": len(stale),
            # Keys whose result is over a record, and records pointing into the large-results bucket.
            "large_keys": sum(1 for key in keys if large(s, key)),
            "large_in_bucket": sum(1 for record in records
                                   if str(record.get("result_format", {}).get("S", "")).startswith("s3:")),
            "lost": len(self.lost),
            "stuck": len(stuck),
            "stuck_claims_live_at_end": live_at_end,
            "completed_records": sum(item["status"]["S"] == "COMPLETED" for item in records),
            "latency_ms": {"all": latencies(keys), "untouched": latencies(keys - touched),
                           "touched": latencies(keys & touched)},
            "wall_s": round(self.ended - self.started, 1),
            "clock_offset_ms": self._clock_offsets(runs, attempts),
            "timing": self._timing_figures(),
        }
        figures["unexpected"] = sum(n for name, n in self.outcomes.items() if name.startswith("unexpected"))
        figures["exit_error_answers_of_kills"] = self.kills["exit_error_answers"]
        failed = [name for name in ("doubles", "early", "divergent", "lost", "stuck", "unexpected", "stale")
                  if figures[name]]
        # What happened to each key that failed the verdict: its attempts and runs, and its record, for diagnosis.
        failing = sorted({*(k.split("+")[0] for k in (*doubles, *early, *divergent, *margin)), *stale,
                          *(c.key for c in self.lost), *(named.get(i, i) for i in stuck),
                          *(k for a in attempts.values() if a.outcome.startswith("unexpected") for k in a.keys)})[:10]
        by_id = {stored_id(s, key): key for key in failing}
        stored = {by_id[item["id"]["S"]]: item for item in records if item["id"]["S"] in by_id}
        histories = {key: {
            "attempts": [{"id": a.id, "outcome": a.outcome, "environment": a.environment, "killed": a.killed,
                          "kill_sent": a.kill_sent, "sent_s": round(a.started - self.started, 3),
                          "took_s": round(a.ended - a.started, 3)}
                         for a in sorted(attempts.values(), key=lambda a: a.started) if key in a.keys],
            "runs": [{"run": r["run"], "attempt": r.get("attempt"), "clock": r.get("clock")}
                     for r in runs if r["key"] == key],
            "purged_at": self.purged.get(key),
            "record": stored.get(key),
        } for key in failing}
        return {
            "settings": {**asdict(s), "faults": list(s.faults), "spike_ms": list(s.spike_ms),
                         "slow_ms": list(s.slow_ms), "asked_timeout": self.asked_timeout,
                         "asked_attempts": self.asked_attempts},
            "figures": figures,
            "faults_by_operation": self.proxy.operations(),
            "examples": {"doubles": doubles[:20], "early": early[:20], "divergent": sorted(divergent)[:20],
                         "lost": sorted({c.key for c in self.lost})[:20],
                         "stuck": sorted(named.get(i, i) for i in stuck)[:20], "stale": stale[:20],
                         "margin_timeouts": margin[:20]},
            "histories": histories,
            "passed": not failed,
            "failed": failed,
        }


def _excused(run: Mapping[str, Any], attempts: Mapping[str, Attempt], overran: bool = True) -> bool:
    """A run whose environment was lost before its answer (killed by us, or gone on its own), or that timed
    out because its handler overran (`overran`: its key's first run, of a key that overruns): it may run
    again. A timeout the handler did not cause (the layer's own writes) excuses nothing."""
    attempt = attempts.get(run.get("attempt") or "")
    if attempt is None:
        return False
    return attempt.killed or attempt.outcome == "connection" or (attempt.outcome == "timeout" and overran)


def _judged(runs_of: Mapping[str, list[dict[str, Any]]], attempts: Mapping[str, Attempt], *, timeout: float,
            skew_s: float, overruns: Callable[[str], bool], margin_s: float) -> Iterable[tuple[str, str]]:
    """(key, "double" | "early" | "windowed") for every run after a key's first: a double follows a run that was not
    excused; an early one follows only excused runs but started before one of them was over, or before its claim
    could have ended; a windowed one is the documented re-run after a crash (it started after every excused run's
    deadline plus the margin, less the re-running environment's skew)."""

    def skew(run: Mapping[str, Any]) -> float:
        attempt = attempts.get(run.get("attempt") or "")
        return skew_s if attempt is not None and attempt.skewed else 0.0

    def started(run: Mapping[str, Any]) -> float:  # by the soak's clock: the handler's, less its skew
        return run["clock"] - skew(run)

    for key, found in runs_of.items():
        ordered = sorted(found, key=started)
        for i, run in enumerate(ordered[1:], start=1):
            kinds = set()
            for j, before in enumerate(ordered[:i]):
                if not _excused(before, attempts, overran=j == 0 and overruns(key)):
                    kinds.add("double")
                elif started(run) < (attempts[before["attempt"]].sent_at + timeout
                                     + max(0.0, margin_s - skew(run)) - EARLY_SLACK_S):
                    kinds.add("early")
            yield key, "double" if "double" in kinds else "early" if "early" in kinds else "windowed"


def verdict(runs_of: Mapping[str, list[dict[str, Any]]], attempts: Mapping[str, Attempt], *, timeout: float,
            skew_s: float, overruns: Callable[[str], bool] = lambda key: True,
            margin_s: float = CLAIM_MARGIN_S) -> tuple[list[str], list[str]]:
    """Keys run twice, and keys re-run early, from the handlers' own lines (in the order they started).

    A run is justified only when it is a key's first or every run before it was excused: a run after one that
    was not (it answered, or timed out though its handler did not overrun) is a double, whatever became of
    it. A justified re-run is early when it started before an excused run it follows was over (its deadline:
    the soak's send time plus the function's timeout) or before that run's claim could have ended (the
    deadline plus the margin, which a copy whose clock runs `skew_s` ahead sees that much early)."""
    doubles, early = set(), set()
    for key, kind in _judged(runs_of, attempts, timeout=timeout, skew_s=skew_s, overruns=overruns, margin_s=margin_s):
        if kind == "double":
            doubles.add(key)
        elif kind == "early":
            early.add(key)
    return sorted(doubles), sorted(early)


def windowed_reruns(runs_of: Mapping[str, list[dict[str, Any]]], attempts: Mapping[str, Attempt], *, timeout: float,
                    skew_s: float, overruns: Callable[[str], bool] = lambda key: True,
                    margin_s: float = CLAIM_MARGIN_S) -> int:
    """How many re-runs are the documented ones: after a crash or an overrun, once its claim could have ended."""
    return sum(kind == "windowed" for _, kind in _judged(runs_of, attempts, timeout=timeout, skew_s=skew_s,
                                                         overruns=overruns, margin_s=margin_s))


class Worker(threading.Thread):
    """One caller and the environment it feeds, replaced after every kill."""

    def __init__(self, soak: Soak, slot: int) -> None:
        super().__init__(name=f"chaos-caller-{slot}", daemon=True)
        self.soak = soak
        self.rng = random.Random(f"{soak.settings.seed}:caller:{slot}")
        self.env: LambdaEnvironment | None = None
        self.error: BaseException | None = None
        self.kills_owed = 0
        self.durations: deque[float] = deque(maxlen=50)  # of recent answered invocations, seconds

    def run(self) -> None:
        try:
            self.env = self.soak.environment()
            while (copy := self.soak.schedule.take()) is not None:
                if self.soak.settings.batch is None:
                    self.send(copy)
                else:
                    more = self.rng.randint(0, self.soak.settings.batch_size - 1)
                    self.send_batch([copy, *self.soak.schedule.take_more(more)])
        except BaseException as error:
            self.error = error
            self.soak.schedule.abort()
        finally:
            if self.env is not None:
                self.soak.retire(self.env)

    def _kill_after(self) -> float | None:
        """When to kill the next invocation, or None."""
        s = self.soak.settings
        if self.rng.random() < s.kill_rate:
            self.kills_owed += 1
        if not self.kills_owed:
            return None
        # Somewhere within a typical invocation of this environment, so most kills land mid-invocation; one that
        # comes too late is owed to the next invocation, so the kill rate holds.
        recent = sorted(self.durations) or [s.kill_window_ms / 1000]
        return self.rng.uniform(0, recent[len(recent) // 2])

    def _attempt(self, name: str, keys: tuple[str, ...]) -> Attempt:
        for key in keys:
            self.soak.sent(key, time.monotonic())
        return Attempt(name, keys[0] if len(keys) == 1 and self.soak.settings.batch is None else "batch",
                       time.monotonic(), skewed=getattr(self.env, "skewed", False), sent_at=time.time(),
                       environment=getattr(self.env, "serial", 0), keys=keys)

    def _settle(self, copy: Copy, ok: bool) -> None:
        """`copy`'s fate after an attempt: settled once it succeeded, lost once its attempts are spent, else resent
        after a backoff."""
        soak = self.soak
        if ok:
            soak.schedule.settle()
            soak.succeeded(copy, time.monotonic())
        elif copy.attempts >= soak.settings.attempts:
            soak.lose(copy)
            soak.schedule.settle()
        else:
            delay = min(FIRST_RESEND_S * 2 ** (copy.attempts - 1), LAST_RESEND_S) * self.rng.uniform(0.5, 1)
            soak.schedule.resend(copy, delay)

    def send(self, copy: Copy) -> None:
        soak = self.soak
        copy.attempts += 1
        attempt = self._attempt(f"{copy.key}.{copy.index}.{copy.attempts}", (copy.key,))
        answer, attempt.killed, attempt.kill_sent = self.invoke(soak.event(copy, attempt.id), self._kill_after())
        attempt.ended = time.monotonic()
        if attempt.killed:
            self.kills_owed -= 1
        attempt.outcome = outcome(answer, attempt.killed, copy.key)
        if answer is not None and attempt.outcome == "ok":
            attempt.body = answer.body
            self.durations.append(attempt.ended - attempt.started)
        soak.record(attempt)
        self._settle(copy, attempt.outcome == "ok")

    def send_batch(self, copies: list[Copy]) -> None:
        """One delivery of `copies` as a batch; each record that must come back is redelivered later, alone or with
        others, as the queue (the partition) does. Kafka brings a partition's offset once per batch."""
        soak = self.soak
        if soak.settings.batch == "kafka":
            unique: dict[str, Copy] = {}
            for copy in copies:
                if copy.key in unique:
                    soak.schedule.resend(copy, 0.0)  # the same offset twice in one batch: not Kafka's way
                else:
                    unique[copy.key] = copy
            copies = list(unique.values())
        for copy in copies:
            copy.attempts += 1
        attempt = self._attempt(f"b{next(soak._batches):06d}", tuple(copy.key for copy in copies))
        event = batch_event(soak.settings, copies, attempt.id, soak.receives)
        answer, attempt.killed, attempt.kill_sent = self.invoke(event, self._kill_after())
        attempt.ended = time.monotonic()
        if attempt.killed:
            self.kills_owed -= 1
        attempt.outcome = batch_outcome(answer, attempt.killed)
        failed = None
        if answer is not None and attempt.outcome == "ok":
            failed = batch_failures(soak.settings, answer.json(), copies)
            if failed is None:
                attempt.outcome = "unexpected:not-a-partial-batch-response"
            else:
                self.durations.append(attempt.ended - attempt.started)
        soak.record(attempt)
        for copy in copies:
            self._settle(copy, failed is not None and copy.key not in failed)

    def invoke(self, event: dict[str, Any], kill_after: float | None) -> tuple[Invocation | None, bool, bool]:
        """Send one invocation, with a kill `kill_after` seconds in when given: (the answer or None, killed, a
        kill was sent)."""
        env = self.env
        assert env is not None
        guard = _Guard()
        timer = None
        if kill_after is not None:
            timer = threading.Timer(kill_after, self._kill, (env, guard))
            timer.daemon = True
            timer.start()
        answer: Invocation | None
        try:
            answer = env.invoke(event, timeout=self.soak.settings.timeout + 30)
        except (OSError, http.client.HTTPException):
            answer = None
        with guard.lock:
            guard.answered = True
            killed = guard.killed
        if timer is not None:
            timer.cancel()
        if killed and answer is not None and answer.error_type == "Runtime.ExitError":
            # The runtime's death, reported by an emulator our kill had not yet stopped: the kill's own doing.
            self.soak.count_kill("exit_error_answers")
            answer = None
        if killed:
            # A kill that raced the answer's arrival (already in the socket) came after the invocation was over.
            self.soak.count_kill("mid_invocation" if answer is None else "after_answer")
        if killed or answer is None:  # a lost sandbox is replaced, as Lambda does
            self.soak.retire(env)
            self.env = None
            self.env = self.soak.environment()
        # A kill after the answer came does not excuse that run: its invocation was over.
        return answer, killed and answer is None, killed

    def _kill(self, env: LambdaEnvironment, guard: _Guard) -> None:
        with guard.lock:
            if guard.answered:
                self.soak.count_kill("too_late")
                return
            kill(env)
            guard.killed = True


def batch_outcome(answer: Invocation | None, killed: bool) -> str:
    """What a batch's caller (the event source mapping) makes of its answer; "ok" reads the partial response next."""
    if answer is None:
        return "killed" if killed else "connection"
    if answer.body.startswith(TIMED_OUT):
        return "timeout"
    if answer.error_type is not None:
        return RETRY_LATER.get(answer.error_type, f"unexpected:{answer.error_type}")
    try:
        answer.json()
    except ValueError:
        return "unexpected:not-json"
    return "ok" if answer.status == 200 else "unexpected:wrong-answer"


def outcome(answer: Invocation | None, killed: bool, key: str) -> str:
    """What a caller makes of an answer."""
    if answer is None:
        return "killed" if killed else "connection"
    if answer.body.startswith(TIMED_OUT):
        return "timeout"
    error = answer.error_type
    if error is not None:
        return RETRY_LATER.get(error, f"unexpected:{error}")
    try:
        value = answer.json()
    except ValueError:
        return "unexpected:not-json"
    if answer.status != 200 or not isinstance(value, dict) or value.get("key") != key or "run" not in value:
        return "unexpected:wrong-answer"
    return "ok"


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return None
    rank = max(1, -(-len(values) * q // 100))
    return round(values[int(rank) - 1], 1)


def dynamodb_client(endpoint: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"],
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


def without_persistence(opt_dir: Path, dest: Path) -> Path:
    """A copy of the unpacked layer whose completion write gives up at its first failure."""
    shutil.copytree(opt_dir, dest, symlinks=True)
    cycle = dest / "python" / "idempotency_layer" / "cycle.py"
    text = cycle.read_text()
    if "COMPLETE_MARGIN_MS" not in text:
        raise RuntimeError(f"{cycle} has no COMPLETE_MARGIN_MS to patch: the completion retry has moved")
    # Read when an invocation starts, so rebinding it at the end of the module is enough.
    cycle.write_text(text + f"\n\nCOMPLETE_MARGIN_MS = {NO_PERSISTENCE_MARGIN_MS}  # chaos soak: no completion retry\n")
    return dest


def soak(settings: Settings, *, work: Path, dynamodb_endpoint: str, opt_dir: Path,
         say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one soak in `work` (which must be empty or missing); the report as `report_lines` prints it."""
    version, python = runtime_python(settings.python)
    work.mkdir(parents=True, exist_ok=True)
    if not settings.persistent:
        opt_dir = without_persistence(opt_dir, work / "opt-no-persistence")
    report = Soak(settings, work=work, dynamodb_endpoint=dynamodb_endpoint, python=python, python_version=version,
                  opt_dir=opt_dir, say=say).run()
    report["settings"]["python"] = version
    return report


# -- printing ------------------------------------------------------------------------------------------------


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,}"


def report_lines(report: Mapping[str, Any]) -> list[str]:
    s, f = report["settings"], report["figures"]
    answers = f["answers"]
    retry = ", ".join(f"{name} {_n(answers.get(name, 0))}" for name in ("in_progress", "store", "claim_conflict",
                                                                          "killed", "timeout", "connection"))
    unexpected = {k: v for k, v in answers.items() if k.startswith("unexpected")}
    faults = ", ".join(f"{kind} {_n(count)}" for kind, count in f["faults"].items())
    share = f["faults_total"] / f["store_requests"] * 100 if f["store_requests"] else 0.0

    def latency(name: str) -> str:
        lat = f["latency_ms"][name]
        return f"{_n(lat['keys'])} keys: p50 {_n(lat['p50'])}, p99 {_n(lat['p99'])}, max {_n(lat['max'])}"

    mode = "persistent completion" if s["persistent"] else "completion NOT retried (patched copy of the layer)"
    if s.get("batch"):
        mode += f", {s['batch'].upper() if s['batch'] == 'sqs' else 'Kafka'} batches of 1 to {s['batch_size']} records"
    if s.get("purge"):
        mode += f", {s['purge']:.0%} of keys purged once done (local cache on)"
    if s.get("large"):
        mode += (f", {s['large']:.0%} of keys with results over a record ({_n(f['large_keys'])} keys, "
                 f"{_n(f['large_in_bucket'])} records pointing to S3)")
    return [
        f"chaos soak, {mode}: seed {s['seed']}, {s['environments']} environments (Python {s['python']}), function "
        f"timeout {s['timeout']} s, {s['fault_rate']:.0%} of store requests faulted, {s['kill_rate']:.0%} of "
        f"invocations killed",
        f"  invocations: {_n(f['copies'])} copies of {_n(f['keys'])} keys ({_n(f['duplicates'])} duplicates, "
        f"{f['duplicates'] / f['copies']:.0%}), {_n(f['invocations_sent'])} sent with resends (a copy took at most "
        f"{_n(f.get('attempts_max'))} of its {s['attempts']} attempts)",
        f"  answers: ok {_n(answers.get('ok', 0))} ({_n(f['first_runs_answered'])} first runs, "
        f"{_n(f['replays_answered'])} replays); retried later: {retry}"
        + (f"; UNEXPECTED {unexpected}" if unexpected else ""),
        f"  faults: {_n(f['faults_total'])} of {_n(f['store_requests'])} store requests ({share:.1f} %): {faults}"
        + (f"; DynamoDB Local itself broke {f['upstream_errors']}" if f["upstream_errors"] else ""),
        f"  kills: {_n(f['kills'])} environments SIGKILLed mid-invocation ({_n(f['kills_after_side_effect'])} after "
        f"the handler's side effect; {_n(f['kills_after_answer'])} more just after an answer came), "
        f"{_n(f['environments_started'])} environments started in all; timeouts "
        f"{_n(f['timeouts'])} ({_n(f['timeouts_after_side_effect'])} after the side effect)",
        f"  executions: {_n(f['executions'])} ({_n(f['re_executions'])} beyond one per key, of which "
        f"{_n(f['crash_window_reruns'])} documented crash-window re-runs: after a kill or an overrun, once its claim "
        f"could have ended); {_n(f['completed_records'])} records completed",
        *([f"  purges: {_n(f['purged'])} keys purged and sent again ({_n(f['purges_refused'])} refused); stale "
           f"{f['stale']} (a copy after its purge that did not run again)"] if s.get("purge") else []),
        f"  doubles {f['doubles']}, early re-runs {f['early']}, divergent {f['divergent']}, lost {f['lost']}, "
        f"stuck {f['stuck']}, unexpected answers {f['unexpected']} ({_n(f['overrun_keys'])} keys overran the "
        f"timeout on their first execution, {_n(f['slow_keys'])} worked seconds every time)",
        f"  first attempt to first success, ms: keys no kill touched {latency('untouched')}",
        f"                                      keys a kill touched   {latency('touched')}",
        f"  wall time {f['wall_s']:.1f} s",
        _timing_line(s, f),
        *([f"  clock: every second environment {s['skew_s']:+.3f} s (libfaketime); handlers saw the time "
           f"{f['clock_offset_ms']['skewed']} ms ahead of the send there, {f['clock_offset_ms']['others']} ms "
           "elsewhere (medians)"] if s["skew_s"] else []),
    ]


def _timing_line(s: Mapping[str, Any], f: Mapping[str, Any]) -> str:
    timing = f.get("timing") or {}
    probe, inits = timing.get("probe"), timing.get("cold_starts") or {}
    if probe:
        terms = timing["reserve_terms"]
        large = f", {_n(probe['large_ms'])} with a large result" if probe.get("large_ms") is not None else ""
        derived = (f"probe at the start: slowest of {s['environments']} cold invocations at once "
                   f"{_n(probe['cold_ms'])} ms, warm {_n(probe['warm_ms'])} ms{large}; reserve {timing['reserve_s']} s "
                   f"({terms['load_factor']} x {terms['overhead_s']} s + {terms['faulted_requests']} x "
                   f"{terms['fault_delay_s']} s faults + {terms['completion_margin_s']} s) beside the longest work "
                   f"({timing['longest_work_s']} s): timeout {s['timeout']} s (asked {timing['asked_timeout_s']} s), "
                   f"{s['attempts']} attempts a copy (asked {timing['asked_attempts']})")
    else:
        derived = f"timeout {s['timeout']} s as asked (not fitted)"
    slowest = f["slow_answered_max_ms"]
    return (f"  margin: {derived}; the run's inits (INIT REPORT) p50 {_n(inits.get('p50_ms'))} ms, max "
            f"{_n(inits.get('max_ms'))} ms" + (f"; a slow key's longest answered invocation {_n(slowest)} ms"
                                               if slowest is not None else "")
            + f"; keys timed out though not meant to overrun: {f['margin_timeouts']}")


# -- command line --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(prog="./build.sh chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--fault-rate", type=float, default=None,
                   help=f"fraction of store requests faulted (default: {d.fault_rate}; 0.3 with --compare-persistence)")
    p.add_argument("--faults", default=",".join(d.faults),
                   help="fault kinds sharing the fault rate evenly (default: %(default)s)")
    add_soak_options(p, d, "the longest work and the reserve measured at the start")
    p.add_argument("--purge", type=float, default=d.purge,
                   help="fraction of keys purged once done, then sent again (default: %(default)s)")
    p.add_argument("--compare-persistence", action="store_true",
                   help="run twice, with and without the completion write's retries, at a high fault rate")
    p.add_argument("--json", type=Path, default=None,
                   help="where to write the figures (default: ~/.cache/idempotency-layer/chaos/chaos-<time>.json)")
    return p


def add_soak_options(p: argparse.ArgumentParser, d: Settings, timeout_needs: str) -> None:
    """The options every soak over these environments takes (this one and tools/valkey_soak.py): the plan, the
    kills, the timing, the runtime, batches, large results, skew. `timeout_needs`: what a fitted timeout holds."""
    p.add_argument("--invocations", type=int, default=d.invocations,
                   help="copies delivered, duplicates included (default: %(default)s)")
    p.add_argument("--duplicates", type=float, default=d.duplicates,
                   help="fraction of copies that are duplicates (default: %(default)s)")
    p.add_argument("--kill-rate", type=float, default=d.kill_rate,
                   help="fraction of invocations killed (default: %(default)s)")
    p.add_argument("--environments", type=int, default=d.environments,
                   help="execution environments at once (default: %(default)s, three per CPU)")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the plan, the faults and the kills (default: "
                   "%(default)s)")
    p.add_argument("--timeout", type=int, default=d.timeout,
                   help=f"the function's timeout, seconds, at least: raised when {timeout_needs} need more "
                        "(default: %(default)s)")
    p.add_argument("--exact-timeout", action="store_true",
                   help="keep --timeout and --attempts as given, whatever margin they leave on this machine")
    p.add_argument("--attempts", type=int, default=d.attempts,
                   help="attempt budget per copy, raised with a fitted timeout (default: %(default)s)")
    p.add_argument("--work-ms", type=int, default=d.work_ms,
                   help="the handler's work after its side effect (default: %(default)s)")
    p.add_argument("--overrun", type=float, default=d.overrun,
                   help="fraction of keys whose first execution runs past the timeout (default: %(default)s)")
    p.add_argument("--slow", type=float, default=d.slow,
                   help="fraction of keys whose handler works seconds (default: %(default)s)")
    p.add_argument("--python", default=None, help="the runtime's Python version (default: 3.12 when found)")
    p.add_argument("--batch", choices=("sqs", "kafka"), default=None,
                   help="deliver copies as SQS or Amazon MSK batches, each record claimed on its own")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="records per batch, at most (default: %(default)s)")
    p.add_argument("--large", type=float, default=d.large,
                   help="fraction of keys whose result is too large for a record, kept in S3 (moto's server) "
                        "(default: %(default)s)")
    p.add_argument("--skew", type=float, default=d.skew_s,
                   help="seconds every second environment's clock runs ahead, by libfaketime (default: %(default)s)")


def soak_settings(args: argparse.Namespace, **chosen: Any) -> Settings:
    """The Settings `add_soak_options`' options give, with the soak's own fields in `chosen`."""
    return Settings(invocations=args.invocations, duplicates=args.duplicates, kill_rate=args.kill_rate,
                    environments=args.environments, seed=args.seed, timeout=args.timeout, attempts=args.attempts,
                    work_ms=args.work_ms, overrun=args.overrun, slow=args.slow, python=args.python,
                    batch=args.batch, batch_size=args.batch_size, skew_s=args.skew, large=args.large,
                    fit_timeout=not args.exact_timeout, **chosen)


def faults_of(text: str) -> tuple[str, ...]:
    """`--faults`' kinds, as given (comma-separated)."""
    return tuple(kind.strip() for kind in text.split(",") if kind.strip())


def default_json_path(compare: bool) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return cache / "idempotency-layer" / "chaos" / f"chaos-{'compare-' if compare else ''}{stamp}.json"


def commit() -> str | None:
    """The checked-out commit, with `+dirty` when the work tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    if "--durable" in (sys.argv[1:] if argv is None else argv):  # durable executions fed twice: its own soak
        from tools import durable_soak

        return durable_soak.main([arg for arg in (sys.argv[1:] if argv is None else argv) if arg != "--durable"])
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, terminated)
    fault_rate = args.fault_rate if args.fault_rate is not None else (0.3 if args.compare_persistence else 0.05)
    base = soak_settings(args, fault_rate=fault_rate, purge=args.purge, faults=faults_of(args.faults))
    try:
        base.check()
    except ValueError as error:
        print(f"chaos: {error}", file=sys.stderr)
        return 2
    runs = [base, replace(base, persistent=False)] if args.compare_persistence else [base]
    work = Path(tempfile.mkdtemp(prefix="idempotency-chaos-"))
    ddb = DynamoDBLocal(work / "dynamodb.log")
    reports: list[dict[str, Any]] = []
    try:
        layer = ensure_layer()
        opt_dir = unpack_layer(layer, work / "opt")
        ddb.start()
        for i, settings in enumerate(runs):
            if i:  # compared at the first run's timeout, not one fitted again
                first = reports[0]["settings"]
                settings = replace(settings, timeout=first["timeout"], attempts=first["attempts"], fit_timeout=False)
            reports.append(soak(settings, work=work / f"soak-{i}", dynamodb_endpoint=ddb.endpoint, opt_dir=opt_dir,
                                say=lambda line: print(line, file=sys.stderr, flush=True)))
            print("\n".join(report_lines(reports[-1])), flush=True)
    finally:
        ddb.stop()
        shutil.rmtree(work, ignore_errors=True)
    document: dict[str, Any] = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit(),
        "layer": {"zip": layer.name, "sha256": hashlib.sha256(layer.read_bytes()).hexdigest()},
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "command": ["./build.sh", "chaos", *(argv if argv is not None else sys.argv[1:])],
    }
    if args.compare_persistence:
        persistent, bare = reports
        document.update(persistent=persistent, without_persistence=bare)
        print(f"\nwith and without persistence, {base.fault_rate:.0%} of store requests faulted:")
        for name, r in (("persistent completion", persistent), ("completion not retried", bare)):
            fig = r["figures"]
            print(f"  {name:<23} doubles {fig['doubles']}, early {fig['early']}, stuck {fig['stuck']}, "
                  f"divergent {fig['divergent']}, lost {fig['lost']}")
        passed = persistent["passed"]
    else:
        document.update(reports[0])
        passed = reports[0]["passed"]
    path = args.json or default_json_path(args.compare_persistence)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"figures written to {path}")
    if not passed:
        print("chaos: FAILED (" + ", ".join(reports[0]["failed"]) + ")", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
