"""The record protocol, checked exhaustively: every interleaving of a few invocations of one key.

- `MemoryDynamoDB` gives DynamoDB's semantics for the four item operations the layer sends (PutItem,
  UpdateItem, DeleteItem, GetItem): condition and update expressions evaluated per item, atomically,
  `ReturnValuesOnConditionCheckFailure=ALL_OLD`, and DynamoDB's refusal of unused expression names and values.
  It sits under the layer's real `DynamoDBStore`, so the store's own conditions are what gets checked.
- `explore` runs 2 or 3 invocations of one key through the real `Cycle`, each in a thread that may only move
  when the scheduler lets it. Every request, handler run, crash and clock advance is a step; a stateless
  depth-first search replays the run from scratch for each sequence of choices until every one was taken.
- At every step a request may: succeed; be refused without landing (a throttle); land with its reply lost
  (the caller sees a failure); land with its reply lost and be retried later by the SDK; or its environment
  may die before or after it lands. A handler run may die before or after its side effect. The clock may jump
  to the next moment something changes: an invocation's deadline (Lambda stops it), or some environment seeing
  a claim expire. Environments may have skewed clocks.

Invariants, checked on every history:
- the handler runs at most once, unless every earlier run's invocation died without completing;
- every replay equals the result its record was completed with, and a run's own answer is its handler's;
- every write after a claim is conditioned on the writer's own owner token, and at most one completion lands;
- no history ends with a live claim past the deadline of the invocation that made it (no stuck key).

`python -m tools.model` runs a deeper search than the suite's.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from idempotency_layer import errors
from idempotency_layer.config import Attributes
from idempotency_layer.cycle import CLAIM_MARGIN_MS, Cycle
from idempotency_layer.dynamodb import Deadline, DynamoDBError
from idempotency_layer.invocation import Invocation as Served
from idempotency_layer.store import DynamoDBStore
from tests.support.memory_dynamodb import CHECK_FAILED, MemoryDynamoDB
from tests.support.memory_dynamodb import copy as _copy

KEY = "order-1"
T0 = 1_800_000_000.0  # virtual epoch seconds at the start of every history
TIMEOUT_MS = 10_000  # each invocation's time budget
TTL_SECONDS = 3600
EPSILON = 0.001


# --- the scheduler ---------------------------------------------------------------------------------------

class _EnvironmentTransport:
    """An environment's transport: every request is a step the scheduler decides, on behalf of the invocation
    the environment is running."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.current: Invocation | None = None

    def call(self, operation: str, params: dict, deadline: Deadline | None = None) -> dict:
        # The model's requests take no time, so a deadline never cuts one short (tests/store covers that).
        return self.world.request(self.current, operation, params)


class _Died(BaseException):
    """The environment is gone: raised in its thread so the layer's code stops touching the world."""


class HandlerFailed(Exception):
    """The handler raised before its side effect."""


@dataclass(frozen=True)
class Bounds:
    invocations: int = 2
    faults: int = 1  # requests refused, or landed with their reply lost
    crashes: int = 1
    advances: int = 2  # clock jumps
    skew_s: tuple[float, ...] = (0.0,)  # each environment's clock offset, cycled over the environments
    environments: int = 0  # invocation i runs in environment i % environments, one at a time; 0: one each
    cache: bool = False  # the environments' local cache of completed records (IDEMPOTENCY_LOCAL_CACHE_SIZE)


@dataclass
class Pending:
    kind: str  # start, request, retry, effect
    operation: str = ""
    params: dict | None = None
    action: str | None = None


@dataclass
class Environment:
    skew: float
    cycle: Cycle | None = None  # None until its first invocation starts, and again after it died
    busy: bool = False


@dataclass
class Invocation:
    index: int
    environment: Environment
    thread: threading.Thread | None = None
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    pending: Pending | None = None
    started_at: float | None = None
    deadline: float | None = None  # true time after which Lambda stops it
    dead: bool = False
    finished: bool = False
    owners: set[str] = field(default_factory=set)  # tokens whose claim landed
    tokens: set[str] = field(default_factory=set)  # tokens it sent a claim with, landed or not
    claimed_at: dict[str, float] = field(default_factory=dict)  # owner token -> when that claim landed
    outcome: tuple = ()
    ran: str | None = None  # the value its handler returned


@dataclass
class Effect:
    invocation: int
    at: float


class Violation(AssertionError):
    pass


@dataclass
class History:
    choices: list[str]
    requests: list[tuple[str, dict, str]]  # (operation, params, "ok" | CHECK_FAILED) in the order they landed
    replies: list[Any]  # what each landed request answered (the response, or the ALL_OLD item), same order


class World:
    def __init__(self, bounds: Bounds, choose: Callable[[int], int]) -> None:
        self.bounds = bounds
        self.choose = choose
        self.now = T0
        self.db = MemoryDynamoDB()
        self.faults = self.crashes = self.advances = 0
        self.effects: list[Effect] = []
        self.completions: list[tuple[int, str]] = []  # (invocation, owner) of every completion that landed
        self.back = threading.Semaphore(0)
        self.choices: list[str] = []
        self.requests: list[tuple[str, dict, str]] = []
        self.replies: list[Any] = []
        count = bounds.environments or bounds.invocations
        self.environments = [Environment(bounds.skew_s[e % len(bounds.skew_s)]) for e in range(count)]
        self.invocations = [Invocation(i, self.environments[i % count]) for i in range(bounds.invocations)]
        self.violation: str | None = None

    # -- what runs in the invocations' threads ------------------------------------------------------------

    def fail(self, invocation: Invocation, problem: str) -> None:
        """Record a broken invariant and stop the invocation (as a death, which no layer code can catch and
        go on from); the history reports it when it ends."""
        if self.violation is None:
            self.violation = f"invocation {invocation.index}: {problem}"
        invocation.dead = True
        raise _Died

    def gate(self, invocation: Invocation, pending: Pending) -> Pending:
        if invocation.dead:
            raise _Died
        invocation.pending = pending
        self.back.release()  # tell the scheduler we are waiting
        invocation.go.acquire()
        invocation.pending = None
        if pending.action in ("die", "die-after"):
            invocation.dead = True
            if pending.action == "die":
                raise _Died
        return pending

    def request(self, invocation: Invocation, operation: str, params: dict) -> dict:
        if operation == "PutItem":
            invocation.tokens.add(params["Item"]["owner"]["S"])
        self._check_fenced(invocation, operation, params)
        pending = self.gate(invocation, Pending("request", operation, params))
        action = pending.action
        if action == "throttle":
            raise DynamoDBError(operation, "ThrottlingException", "Rate of requests exceeds the allowed throughput",
                                status=400)
        reply = self._land(invocation, operation, params)
        if action == "die-after":
            raise _Died
        if action == "lost":
            # Uncertain, as the transports mark an attempt that got no answer.
            raise DynamoDBError(operation, "ReadTimeoutError", "Read timeout on endpoint URL", uncertain=True)
        if action == "lost-retry":  # the SDK sends the same request again, later
            self.gate(invocation, Pending("retry", operation, params))
            reply = self._land(invocation, operation, params)
        if isinstance(reply, DynamoDBError):
            raise reply
        return reply

    def _land(self, invocation: Invocation, operation: str, params: dict) -> Any:
        try:
            reply = self.db.apply(operation, params)
            outcome = "ok"
        except DynamoDBError as error:
            if error.code != CHECK_FAILED:
                self.fail(invocation, f"{operation} refused by DynamoDB's rules: {error.message}")
            reply, outcome = error, CHECK_FAILED
        self.requests.append((operation, _copy(params), outcome))
        self.replies.append(reply.item if isinstance(reply, DynamoDBError) else reply)
        if operation == "PutItem" and outcome == "ok":
            invocation.owners.add(params["Item"]["owner"]["S"])
            invocation.claimed_at[params["Item"]["owner"]["S"]] = self.now
        if operation == "UpdateItem" and outcome == "ok":
            self.completions.append((invocation.index, params["ExpressionAttributeValues"][":me"]["S"]))
        return reply

    def _check_fenced(self, invocation: Invocation, operation: str, params: dict) -> None:
        if operation == "PutItem" and "ConditionExpression" not in params:
            self.fail(invocation, "an unconditional PutItem")
        if operation in ("UpdateItem", "DeleteItem"):
            me = params.get("ExpressionAttributeValues", {}).get(":me", {}).get("S")
            if params.get("ConditionExpression") != "#o = :me" or params["ExpressionAttributeNames"]["#o"] != "owner":
                self.fail(invocation, f"{operation} not conditioned on the owner")
            # A completion must carry a claim that landed; a release may withdraw a claim whose outcome it never
            # heard (its own token, so it deletes nothing of anyone else's).
            if me not in (invocation.owners if operation == "UpdateItem" else invocation.tokens):
                self.fail(invocation, f"{operation} fenced with a token it never claimed")

    def handler(self, invocation: Invocation) -> Callable[[], str]:
        def invoke() -> str:
            pending = self.gate(invocation, Pending("effect"))
            if pending.action == "raise":
                raise HandlerFailed
            value = f"result of invocation {invocation.index}"
            self._effect(invocation)
            if pending.action == "die-after":
                raise _Died
            invocation.ran = value
            return value

        return invoke

    def _effect(self, invocation: Invocation) -> None:
        for earlier in self.effects:
            before = self.invocations[earlier.invocation]
            completed = any(i == before.index for i, _ in self.completions)
            if before.index == invocation.index:
                self.fail(invocation, "ran its handler twice")
            if not before.dead or completed:
                self.fail(invocation, f"the handler ran twice: at +{self.now - T0:.3f}s after invocation "
                          f"{before.index} at +{earlier.at - T0:.3f}s, which "
                          + ("completed" if completed else "was still alive"))
        self.effects.append(Effect(invocation.index, self.now))

    def body(self, invocation: Invocation) -> None:
        environment = invocation.environment
        try:
            self.gate(invocation, Pending("start"))
            environment.busy = True
            invocation.started_at = self.now
            invocation.deadline = self.now + TIMEOUT_MS / 1000
            if environment.cycle is None:  # a fresh environment: its init builds the store and the cycle
                gated = _EnvironmentTransport(self)
                store = DynamoDBStore(gated, "idempotency", Attributes())
                environment.cycle = Cycle(store, TTL_SECONDS, cache_size=8 if self.bounds.cache else 0,
                                          clock=lambda: self.now + environment.skew, sleep=lambda _: None)
            environment.cycle.store.transport.current = invocation
            # As the runtime computes it: Lambda's deadline minus this environment's clock.
            remaining_ms = int((invocation.deadline - (self.now + environment.skew)) * 1000)
            outcome = environment.cycle.run(Served(remaining_ms), KEY, self.handler(invocation))
            if invocation.dead:
                # The layer caught the death (a BaseException) on its completion path and went on; a dead
                # environment answers nothing and is replaced.
                raise _Died
            invocation.outcome = ("ok", outcome.value, outcome.replayed)
        except _Died:
            invocation.outcome = ("died",)
            environment.cycle = None  # Lambda replaces a dead environment
        except HandlerFailed:
            invocation.outcome = ("handler-failed",)
        except errors.IdempotencyAlreadyInProgressError:
            invocation.outcome = ("busy",)
        except errors.IdempotencyPersistenceLayerError:
            invocation.outcome = ("store-error",)
        except BaseException as error:  # any other escape is itself a finding
            invocation.outcome = ("raised", f"{type(error).__name__}: {error}")
        finally:
            if invocation.dead:  # whatever the layer made of its death: Lambda replaces the environment
                invocation.outcome = ("died",)
                environment.cycle = None
            invocation.finished = True
            environment.busy = False
            self.back.release()

    # -- the scheduler ---------------------------------------------------------------------------------

    def _wait_all(self, moving: list[Invocation]) -> None:
        for _ in moving:
            self.back.acquire()

    def _release(self, invocation: Invocation, action: str) -> None:
        invocation.pending.action = action
        invocation.go.release()
        self.back.acquire()  # until it waits again or finishes

    def _kill_expired(self) -> None:
        for invocation in self.invocations:
            if (invocation.pending is not None and invocation.deadline is not None
                    and self.now > invocation.deadline and not invocation.dead):
                # Lambda stops the invocation at its deadline, wherever it is.
                self._release(invocation, "die")

    def _next_moment(self) -> float | None:
        """The next time at which something changes: a deadline passes, or some clock sees a claim expire."""
        moments = [i.deadline + EPSILON for i in self.invocations
                   if i.deadline is not None and not i.finished and i.deadline + EPSILON > self.now]
        item = self.db.item(KEY)
        if item is not None and item.get("status", {}).get("S") == "INPROGRESS":
            until = int(item["in_progress_until"]["N"]) / 1000
            for environment in self.environments:
                moment = until - environment.skew + EPSILON
                if moment > self.now:
                    moments.append(moment)
        return min(moments) if moments else None

    def actions(self) -> list[tuple[str, Invocation | None, str]]:
        found: list[tuple[str, Invocation | None, str]] = []
        for invocation in self.invocations:
            pending = invocation.pending
            if pending is None:
                continue
            kinds = ["ok"]
            if pending.kind == "start" and invocation.environment.busy:
                continue  # an environment runs one invocation at a time
            if pending.kind == "request":
                if self.faults < self.bounds.faults:
                    kinds += ["throttle", "lost", "lost-retry"]
                if self.crashes < self.bounds.crashes:
                    kinds += ["die", "die-after"]
            elif pending.kind == "effect":
                if self.faults < self.bounds.faults:
                    kinds.append("raise")
                if self.crashes < self.bounds.crashes:
                    kinds += ["die", "die-after"]
            elif pending.kind == "retry" and self.crashes < self.bounds.crashes:
                kinds.append("die")
            for kind in kinds:
                what = f"{pending.kind}/{pending.operation}" if pending.operation else pending.kind
                label = f"{invocation.index}:{what}:{kind}"
                found.append((label, invocation, kind))
        if self.advances < self.bounds.advances and found:
            moment = self._next_moment()
            if moment is not None:
                found.append((f"clock+{moment - T0:.3f}s", None, "advance"))
        return found

    def run(self) -> History:
        for invocation in self.invocations:
            invocation.thread = threading.Thread(target=self.body, args=(invocation,), daemon=True)
            invocation.thread.start()
        self._wait_all(self.invocations)
        while True:
            options = self.actions()
            if not options:
                break
            label, invocation, kind = options[self.choose(len(options))]
            self.choices.append(label)
            if kind == "advance":
                self.advances += 1
                self.now = self._next_moment()
                self._kill_expired()
                continue
            if kind in ("throttle", "lost", "lost-retry", "raise"):
                self.faults += 1
            if kind in ("die", "die-after"):
                self.crashes += 1
            self._release(invocation, kind)
        for invocation in self.invocations:
            invocation.thread.join(5)
            if invocation.thread.is_alive():
                raise Violation(f"invocation {invocation.index} never finished: {self.choices}")
        self._check_end()
        return History(self.choices, self.requests, self.replies)

    def _check_end(self) -> None:
        if self.violation is not None:
            raise Violation(self.violation)
        for invocation in self.invocations:
            if invocation.outcome[0] == "raised":
                raise Violation(f"invocation {invocation.index}: {invocation.outcome[1]}")
        if len({owner for _, owner in self.completions}) > 1:
            raise Violation(f"completions of {len(self.completions)} claims landed: {self.completions}")
        completed_value = None
        if self.completions:
            completer = self.invocations[self.completions[0][0]]
            completed_value = completer.ran
        for invocation in self.invocations:
            if invocation.outcome[0] != "ok":
                continue
            _, value, replayed = invocation.outcome
            if replayed and value != completed_value:
                raise Violation(f"invocation {invocation.index} replayed {value!r}, the record holds "
                                f"{completed_value!r}")
            if not replayed and value != invocation.ran:
                raise Violation(f"invocation {invocation.index} answered {value!r}, its handler returned "
                                f"{invocation.ran!r}")
        # Stuck: a claim must end by the deadline of the invocation that made it, by every clock.
        item = self.db.item(KEY)
        if item is not None and item["status"]["S"] == "INPROGRESS":
            owner = item["owner"]["S"]
            maker = next(i for i in self.invocations if owner in i.owners)
            until = int(item["in_progress_until"]["N"]) / 1000
            # The claim lasts the invocation's remaining time as the claim was sent, plus the skew margin: its
            # deadline, moved by no more than how long after the start the claim landed, plus the margin.
            latest = maker.deadline + (maker.claimed_at[owner] - maker.started_at) + CLAIM_MARGIN_MS / 1000 + EPSILON
            if until > latest:
                raise Violation(f"a claim outlives its invocation's deadline by {until - maker.deadline:.3f}s")


class _Chooser:
    """Follows `prefix`, then takes the first option at every later choice; `trace` says what it took of how many."""

    def __init__(self, prefix: list[int]) -> None:
        self.prefix = prefix
        self.trace: list[tuple[int, int]] = []

    def choose(self, n: int) -> int:
        position = len(self.trace)
        choice = self.prefix[position] if position < len(self.prefix) else 0
        self.trace.append((choice, n))
        return choice


def _histories(bounds: Bounds, limit: int | None = None) -> Iterator[History]:
    """Every history within `bounds`, depth first (stateless: each one replayed from the start)."""
    prefix: list[int] = []
    count = 0
    while True:
        chooser = _Chooser(prefix)
        trace = chooser.trace
        world = World(bounds, chooser.choose)
        try:
            yield world.run()
        except Violation as violation:
            raise Violation(f"{violation}\n  history: {' -> '.join(world.choices)}") from None
        count += 1
        if limit is not None and count >= limit:
            return
        while trace and trace[-1][0] == trace[-1][1] - 1:
            trace.pop()
        if not trace:
            return
        prefix = [choice for choice, _ in trace[:-1]] + [trace[-1][0] + 1]


def explore(bounds: Bounds, sample_every: int = 0, limit: int | None = None) -> tuple[int, list[History]]:
    """Explore every history within `bounds`; raise Violation on the first broken invariant.

    Returns how many histories were explored and every `sample_every`-th one (for replay on DynamoDB)."""
    count = 0
    sample: list[History] = []
    quiet = logging.getLogger("idempotency_layer")
    quiet.addHandler(logging.NullHandler())  # the layer's own warnings, thousands of times, say nothing here
    for history in _histories(bounds, limit):
        if sample_every and count % sample_every == 0:
            sample.append(history)
        count += 1
    return count, sample


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--invocations", type=int, default=3)
    parser.add_argument("--faults", type=int, default=2)
    parser.add_argument("--crashes", type=int, default=1)
    parser.add_argument("--advances", type=int, default=3)
    parser.add_argument("--skew", type=float, nargs="*", default=[0.0], help="clock offsets in seconds")
    parser.add_argument("--environments", type=int, default=0, help="0: one per invocation")
    parser.add_argument("--cache", action="store_true")
    options = parser.parse_args()
    bounds = Bounds(options.invocations, options.faults, options.crashes, options.advances, tuple(options.skew),
                    options.environments, options.cache)
    started = time.monotonic()
    count, _ = explore(bounds)
    print(f"{count} histories explored within {bounds}, no invariant broken ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
