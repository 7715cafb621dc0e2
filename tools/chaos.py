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
soon after it ends, where clock skew matters.

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

from tests.support import downloads
from tests.support.dynamodb_local import DynamoDBLocal, create_table, wait_for
from tests.support.fault_proxy import KINDS, FaultProxy, even_mix
from tests.support.rie import ROOT, Invocation, LambdaEnvironment, _session_members, ensure_layer, unpack_layer

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
# The claim margin docs/reliability.md promises (Clocks), written here rather than read from the layer: a change to the
# layer's constant is then caught by the soak, not followed by it.
CLAIM_MARGIN_S = 1.0


@dataclass(frozen=True)
class Settings:
    invocations: int = 10_000  # copies delivered, duplicates included (resends come on top)
    duplicates: float = 0.30  # fraction of the copies that repeat an earlier key
    fault_rate: float = 0.05  # fraction of store requests faulted, shared evenly among `faults`
    kill_rate: float = 0.02  # fraction of invocations whose environment is SIGKILLed mid-invocation
    environments: int = min(32, 3 * (os.cpu_count() or 2))  # 6 on 2 cores: most invocations wait on I/O
    seed: int = 1
    timeout: int = 4  # the function's timeout, seconds: a killed claim lasts this long
    attempts: int = 20  # a copy's attempt budget; its resends span well past a killed claim
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
    python: str | None = None  # the runtime's Python version; default 3.12 when found

    def check(self) -> None:
        for name in ("duplicates", "fault_rate", "kill_rate", "overrun"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a fraction between 0 and 1, not {getattr(self, name)}")
        if self.duplicates >= 1 or self.invocations < 1 or self.environments < 1 or self.attempts < 1:
            raise ValueError("need invocations >= 1, duplicates < 1, environments >= 1 and attempts >= 1")
        if self.timeout < 2:
            raise ValueError("the timeout must leave the handler and the layer room: at least 2 s")
        unknown = set(self.faults) - set(KINDS)
        if unknown or not self.faults:
            raise ValueError(f"fault kinds are some of {', '.join(KINDS)}, not {sorted(unknown) or 'none'}")


@dataclass
class Copy:
    """One delivery of a key's event; `attempts` counts its sends so far."""

    key: str
    index: int  # 0: the key's first copy
    attempts: int = 0


@dataclass
class Attempt:
    id: str
    key: str
    started: float
    ended: float = 0.0
    outcome: str = ""  # ok, in_progress, store, claim_conflict, killed, timeout, connection, unexpected:<what>
    body: bytes | None = None
    killed: bool = False  # SIGKILLed before its answer came
    skewed: bool = False  # sent to an environment whose clock runs ahead
    sent_at: float = 0.0  # time.time() when sent, by the soak's own clock


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


def overruns(settings: Settings, key: str) -> bool:
    """Whether `key`'s first execution works past the function's timeout."""
    return random.Random(f"{settings.seed}:overrun:{key}").random() < settings.overrun


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
    """SIGKILL every process of the environment (RIE and the runtime share the session RIE's start made)."""
    process = env.process
    if process is None:
        return
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
        self._envs = itertools.count(1)
        self._live: set[LambdaEnvironment] = set()  # started and not yet stopped, so an abort stops them all
        self._closing = False
        self.proxy: FaultProxy | None = None
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
        workers = [Worker(self, slot) for slot in range(s.environments)]
        try:
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

    def environment(self) -> LambdaEnvironment:
        """A fresh environment, started (the runtime inits on its first invocation, as a cold start does)."""
        s = self.settings
        assert self.proxy is not None
        serial = next(self._envs)
        variables = {**CREDENTIALS, "AWS_ENDPOINT_URL_DYNAMODB": self.proxy.endpoint, "IDEMPOTENCY_TABLE": self.table,
                     "IDEMPOTENCY_KEY_JMESPATH": "key", "IDEMPOTENCY_PAYLOAD_JMESPATH": "payload",
                     "CHAOS_RUNS_FILE": str(self.runs_file)}
        skewed = bool(s.skew_s) and serial % 2 == 1
        if skewed:
            variables.update(LD_PRELOAD=faketime_library(), FAKETIME=f"{s.skew_s:+.3f}")
        env = LambdaEnvironment(
            self.python, self.task_root, version=self.python_version, handler=HANDLER, opt_dir=self.opt_dir,
            timeout=s.timeout, function_name=FUNCTION, log_path=self.logs / f"env-{serial}.log", env=variables,
        )
        env.skewed = skewed
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
                 "work_ms": self.settings.work_ms, "attempt": attempt}
        if overruns(self.settings, copy.key):
            event["overrun"] = True
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

    def _report(self, client: Any) -> dict[str, Any]:
        s = self.settings
        assert self.proxy is not None
        runs = self._runs()
        attempts = self.attempts
        stuck, live_at_end = self._stuck(client)
        records = self._records(client)

        runs_of: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            runs_of.setdefault(run["key"], []).append(run)

        doubles, early = verdict(runs_of, attempts, timeout=s.timeout, skew_s=s.skew_s,
                                 overruns=lambda key: overruns(s, key))

        reruns = sum(len(found) - 1 for found in runs_of.values() if len(found) > 1)
        killed_after_effect = sum(1 for run in runs if (a := attempts.get(run.get("attempt") or "")) and a.killed)
        timed_out_after_effect = sum(1 for run in runs
                                     if (a := attempts.get(run.get("attempt") or "")) and a.outcome == "timeout")

        answers: dict[str, set[bytes]] = {}
        first_success: dict[str, float] = {}
        first_attempt: dict[str, float] = {}
        touched: set[str] = set()  # keys a kill or a timeout reached
        fresh = replays = 0
        for attempt in attempts.values():
            first_attempt[attempt.key] = min(first_attempt.get(attempt.key, attempt.started), attempt.started)
            if attempt.killed or attempt.outcome == "timeout":
                touched.add(attempt.key)
            if attempt.outcome == "ok" and attempt.body is not None:
                answers.setdefault(attempt.key, set()).add(attempt.body)
                first_success[attempt.key] = min(first_success.get(attempt.key, attempt.ended), attempt.ended)
        run_ids = {key: {r["run"] for r in found} for key, found in runs_of.items()}
        own = {(r["key"], r["run"], r.get("attempt")) for r in runs}
        divergent = []
        for key, bodies in answers.items():
            values = [json.loads(body) for body in bodies]
            if len(bodies) > 1 or any(v.get("key") != key or v.get("run") not in run_ids.get(key, ()) for v in values):
                divergent.append(key)
        for attempt in attempts.values():
            if attempt.outcome == "ok" and attempt.body is not None:
                value = json.loads(attempt.body)
                if (attempt.key, value.get("run"), attempt.id) in own:
                    fresh += 1
                else:
                    replays += 1

        def latencies(keys: Iterable[str]) -> dict[str, float | int | None]:
            values = sorted((first_success[k] - first_attempt[k]) * 1000 for k in keys if k in first_success)
            return {"keys": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
                    "max": round(values[-1], 1) if values else None}

        keys = {copy.key for copy in self.copies}
        named = {record_id(key): key for key in keys}
        faults = self.proxy.snapshot()
        figures = {
            "copies": len(self.copies),
            "keys": len(keys),
            "duplicates": len(self.copies) - len(keys),
            "invocations_sent": len(attempts),
            "resends": len(attempts) - len(self.copies),
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
            "doubles": len(doubles),
            "early": len(early),
            "overrun_keys": sum(overruns(s, key) for key in keys),
            "divergent": len(divergent),
            "lost": len(self.lost),
            "stuck": len(stuck),
            "stuck_claims_live_at_end": live_at_end,
            "completed_records": sum(item["status"]["S"] == "COMPLETED" for item in records),
            "latency_ms": {"all": latencies(keys), "untouched": latencies(keys - touched),
                           "touched": latencies(keys & touched)},
            "wall_s": round(self.ended - self.started, 1),
            "clock_offset_ms": self._clock_offsets(runs, attempts),
        }
        failed = [name for name in ("doubles", "early", "divergent", "lost", "stuck") if figures[name]]
        return {
            "settings": {**asdict(s), "faults": list(s.faults), "spike_ms": list(s.spike_ms)},
            "figures": figures,
            "faults_by_operation": self.proxy.operations(),
            "examples": {"doubles": doubles[:20], "early": early[:20], "divergent": sorted(divergent)[:20],
                         "lost": sorted({c.key for c in self.lost})[:20],
                         "stuck": sorted(named.get(i, i) for i in stuck)[:20]},
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


def verdict(runs_of: Mapping[str, list[dict[str, Any]]], attempts: Mapping[str, Attempt], *, timeout: float,
            skew_s: float, overruns: Callable[[str], bool] = lambda key: True,
            margin_s: float = CLAIM_MARGIN_S) -> tuple[list[str], list[str]]:
    """Keys run twice, and keys re-run early, from the handlers' own lines (in the order they started).

    A run is justified only when it is a key's first or every run before it was excused: a run after one that
    was not (it answered, or timed out though its handler did not overrun) is a double, whatever became of
    it. A justified re-run is early when it started before an excused run it follows was over (its deadline:
    the soak's send time plus the function's timeout) or before that run's claim could have ended (the
    deadline plus the margin, which a copy whose clock runs `skew_s` ahead sees that much early)."""

    def skew(run: Mapping[str, Any]) -> float:
        attempt = attempts.get(run.get("attempt") or "")
        return skew_s if attempt is not None and attempt.skewed else 0.0

    def started(run: Mapping[str, Any]) -> float:  # by the soak's clock: the handler's, less its skew
        return run["clock"] - skew(run)

    doubles, early = set(), set()
    for key, found in runs_of.items():
        ordered = sorted(found, key=started)
        for i, run in enumerate(ordered):
            for j, before in enumerate(ordered[:i]):
                if not _excused(before, attempts, overran=j == 0 and overruns(key)):
                    doubles.add(key)
                elif started(run) < (attempts[before["attempt"]].sent_at + timeout
                                     + max(0.0, margin_s - skew(run)) - EARLY_SLACK_S):
                    early.add(key)
    return sorted(doubles), sorted(early)


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
                self.send(copy)
        except BaseException as error:
            self.error = error
            self.soak.schedule.abort()
        finally:
            if self.env is not None:
                self.soak.retire(self.env)

    def send(self, copy: Copy) -> None:
        s, soak = self.soak.settings, self.soak
        copy.attempts += 1
        attempt = Attempt(f"{copy.key}.{copy.index}.{copy.attempts}", copy.key, time.monotonic(),
                          skewed=getattr(self.env, "skewed", False), sent_at=time.time())
        if self.rng.random() < s.kill_rate:
            self.kills_owed += 1
        kill_after = None
        if self.kills_owed:
            # Somewhere within a typical invocation of this environment, so most kills land mid-invocation;
            # one that comes too late is owed to the next invocation, so the kill rate holds.
            recent = sorted(self.durations) or [s.kill_window_ms / 1000]
            kill_after = self.rng.uniform(0, recent[len(recent) // 2])
        answer, attempt.killed = self.invoke(soak.event(copy, attempt.id), kill_after)
        attempt.ended = time.monotonic()
        if attempt.killed:
            self.kills_owed -= 1
        attempt.outcome = outcome(answer, attempt.killed, copy.key)
        if answer is not None and attempt.outcome == "ok":
            attempt.body = answer.body
        soak.record(attempt)
        if attempt.outcome == "ok":
            self.durations.append(attempt.ended - attempt.started)
            soak.schedule.settle()
        elif copy.attempts >= s.attempts:
            soak.lose(copy)
            soak.schedule.settle()
        else:
            delay = min(FIRST_RESEND_S * 2 ** (copy.attempts - 1), LAST_RESEND_S) * self.rng.uniform(0.5, 1)
            soak.schedule.resend(copy, delay)

    def invoke(self, event: dict[str, Any], kill_after: float | None) -> tuple[Invocation | None, bool]:
        """Send one invocation, with a kill `kill_after` seconds in when given: (the answer or None, killed)."""
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
        if killed:
            # A kill that raced the answer's arrival (already in the socket) came after the invocation was over.
            self.soak.count_kill("mid_invocation" if answer is None else "after_answer")
        if killed or answer is None:  # a lost sandbox is replaced, as Lambda does
            self.soak.retire(env)
            self.env = None
            self.env = self.soak.environment()
        # A kill after the answer came does not excuse that run: its invocation was over.
        return answer, killed and answer is None

    def _kill(self, env: LambdaEnvironment, guard: _Guard) -> None:
        with guard.lock:
            if guard.answered:
                self.soak.count_kill("too_late")
                return
            kill(env)
            guard.killed = True


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


def runtime_python(version: str | None = None) -> tuple[str, Path]:
    runtimes = downloads.runtimes()
    if not runtimes:
        raise RuntimeError("no Python 3.10-3.13 runtime found (python -m tests.support.downloads)")
    if version is None:
        version = "3.12" if "3.12" in runtimes else max(runtimes, key=lambda v: tuple(map(int, v.split("."))))
    if version not in runtimes:
        raise RuntimeError(f"no Python {version} runtime; found {', '.join(sorted(runtimes))}")
    return version, runtimes[version]


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
    return [
        f"chaos soak, {mode}: seed {s['seed']}, {s['environments']} environments (Python {s['python']}), function "
        f"timeout {s['timeout']} s, {s['fault_rate']:.0%} of store requests faulted, {s['kill_rate']:.0%} of "
        f"invocations killed",
        f"  invocations: {_n(f['copies'])} copies of {_n(f['keys'])} keys ({_n(f['duplicates'])} duplicates, "
        f"{f['duplicates'] / f['copies']:.0%}), {_n(f['invocations_sent'])} sent with resends",
        f"  answers: ok {_n(answers.get('ok', 0))} ({_n(f['first_runs_answered'])} first runs, "
        f"{_n(f['replays_answered'])} replays); retried later: {retry}"
        + (f"; UNEXPECTED {unexpected}" if unexpected else ""),
        f"  faults: {_n(f['faults_total'])} of {_n(f['store_requests'])} store requests ({share:.1f} %): {faults}"
        + (f"; DynamoDB Local itself broke {f['upstream_errors']}" if f["upstream_errors"] else ""),
        f"  kills: {_n(f['kills'])} environments SIGKILLed mid-invocation ({_n(f['kills_after_side_effect'])} after "
        f"the handler's side effect; {_n(f['kills_after_answer'])} more just after an answer came), "
        f"{_n(f['environments_started'])} environments started in all; timeouts "
        f"{_n(f['timeouts'])} ({_n(f['timeouts_after_side_effect'])} after the side effect)",
        f"  executions: {_n(f['executions'])} ({_n(f['re_executions'])} beyond one per key: re-runs after a kill or "
        f"a timeout, and doubles); {_n(f['completed_records'])} records completed",
        f"  doubles {f['doubles']}, early re-runs {f['early']}, divergent {f['divergent']}, lost {f['lost']}, "
        f"stuck {f['stuck']} ({_n(f['overrun_keys'])} keys overran the timeout on their first execution)",
        f"  first attempt to first success, ms: keys no kill touched {latency('untouched')}",
        f"                                      keys a kill touched   {latency('touched')}",
        f"  wall time {f['wall_s']:.1f} s",
        *([f"  clock: every second environment {s['skew_s']:+.3f} s (libfaketime); handlers saw the time "
           f"{f['clock_offset_ms']['skewed']} ms ahead of the send there, {f['clock_offset_ms']['others']} ms "
           "elsewhere (medians)"] if s["skew_s"] else []),
    ]


# -- command line --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(prog="./build.sh chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--invocations", type=int, default=d.invocations,
                   help="copies delivered, duplicates included (default: %(default)s)")
    p.add_argument("--duplicates", type=float, default=d.duplicates,
                   help="fraction of copies that are duplicates (default: %(default)s)")
    p.add_argument("--fault-rate", type=float, default=None,
                   help=f"fraction of store requests faulted (default: {d.fault_rate}; 0.3 with --compare-persistence)")
    p.add_argument("--faults", default=",".join(d.faults),
                   help="fault kinds sharing the fault rate evenly (default: %(default)s)")
    p.add_argument("--kill-rate", type=float, default=d.kill_rate,
                   help="fraction of invocations killed (default: %(default)s)")
    p.add_argument("--environments", type=int, default=d.environments,
                   help="execution environments at once (default: %(default)s, three per CPU)")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the plan, the faults and the kills (default: "
                   "%(default)s)")
    p.add_argument("--timeout", type=int, default=d.timeout, help="the function's timeout, seconds (default: "
                   "%(default)s)")
    p.add_argument("--attempts", type=int, default=d.attempts, help="attempt budget per copy (default: %(default)s)")
    p.add_argument("--work-ms", type=int, default=d.work_ms,
                   help="the handler's work after its side effect (default: %(default)s)")
    p.add_argument("--overrun", type=float, default=d.overrun,
                   help="fraction of keys whose first execution runs past the timeout (default: %(default)s)")
    p.add_argument("--python", default=None, help="the runtime's Python version (default: 3.12 when found)")
    p.add_argument("--skew", type=float, default=d.skew_s,
                   help="seconds every second environment's clock runs ahead, by libfaketime (default: %(default)s)")
    p.add_argument("--compare-persistence", action="store_true",
                   help="run twice, with and without the completion write's retries, at a high fault rate")
    p.add_argument("--json", type=Path, default=None,
                   help="where to write the figures (default: ~/.cache/idempotency-layer/chaos/chaos-<time>.json)")
    return p


def default_json_path(compare: bool) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return cache / "idempotency-layer" / "chaos" / f"chaos-{'compare-' if compare else ''}{stamp}.json"


def _commit() -> str | None:
    """The checked-out commit, with `+dirty` when the work tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop what the soak started


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    fault_rate = args.fault_rate if args.fault_rate is not None else (0.3 if args.compare_persistence else 0.05)
    base = Settings(invocations=args.invocations, duplicates=args.duplicates, fault_rate=fault_rate,
                    kill_rate=args.kill_rate, environments=args.environments, seed=args.seed, timeout=args.timeout,
                    attempts=args.attempts, work_ms=args.work_ms, overrun=args.overrun, python=args.python,
                    skew_s=args.skew,
                    faults=tuple(kind.strip() for kind in args.faults.split(",") if kind.strip()))
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
            reports.append(soak(settings, work=work / f"soak-{i}", dynamodb_endpoint=ddb.endpoint, opt_dir=opt_dir,
                                say=lambda line: print(line, file=sys.stderr, flush=True)))
            print("\n".join(report_lines(reports[-1])), flush=True)
    finally:
        ddb.stop()
        shutil.rmtree(work, ignore_errors=True)
    document: dict[str, Any] = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
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
