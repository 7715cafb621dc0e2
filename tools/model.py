"""The layer, checked exhaustively: every interleaving of a few invocations, on the real executor, cycle and store.

- The table is `tests.support.memory_dynamodb.MemoryDynamoDB` (DynamoDB's semantics for the layer's requests;
  tests/store/test_protocol_model_on_dynamodb.py checks its answers against DynamoDB Local). Each environment is
  the layer as the interceptor assembles it: `sources.plan` for each event, an `executor.Executor` over a `Cycle`
  over a `DynamoDBStore`, with its local cache and its lasting state; a dead environment is replaced by a fresh one.
- Every invocation runs in a thread of its own, and a batch's concurrent claims, completions and releases in
  threads the executor's pool starts; each thread (an actor) moves only when the scheduler lets it. Every request,
  every side effect of the handler (one per record of a batch) and every backoff sleep is a step; a stateless
  depth-first search replays the run from scratch for each sequence of choices until every one was taken.
- Time is virtual: `time.monotonic` (deadlines, waits, backoffs) and each environment's clock (skewed by a fixed
  offset) read the world's clock, which moves only when the search jumps it to the next moment something changes:
  an invocation's deadline (Lambda stops it there), a claim or a record expiring by some environment's clock, a
  sleep ending.
- At each request: it succeeds; is refused without landing (a throttle); lands with its reply lost (the caller
  sees a failure that leaves open whether it landed); is left in flight, its caller told it ran out of time, and
  lands at any later step, after its caller gave up or died included; or its environment dies before or after it
  lands. A handler's side effect may fail (the handler raises, or reports its record failed) or its environment die
  before or after it, or take long: end shortly before its deadline (`Bounds.slow_s`), so completions, their
  retries and backoffs run with that little time left. An operator may purge a record at any step (the CLI's
  purge: a live claim is refused).
- Durable executions (`Bounds(kind="durable")`, IDEMPOTENCY_DURABLE=execution): each of `invocations` executions of
  one input is invoked by the durable service up to `attempts` times, one invocation after another, each with the
  envelope as the service sends it (the execution's ARN, a new checkpoint token, the operations checkpointed so
  far). Its workflow, as AWS's SDK runs one: a step (the side effect, checkpointed once it ran; it may fail, and the
  execution answers FAILED), a wait (the invocation answers PENDING), then the step's receipt (SUCCEEDED). The
  service invokes it again after a wait, a raise or a death, never after SUCCEEDED or FAILED nor past its execution
  timeout (`floor_s`, also IDEMPOTENCY_IN_PROGRESS_SECONDS). A completion or a release may meet an outage: it and
  every retry of it refused until the invocation's deadline.

Invariants, checked on every history:
- a handler runs again for a key only when every earlier run of it was released (its handler failed, or reported
  it), or died or ended without its completion landing, or its completed record was purged since or expired (by
  the re-running environment's clock); never while another run of the key is still going;
- every replay is the result a completion of that key stored, not purged before the replaying invocation last read
  the table, nor expired before it began; a run's own answer is its handler's;
- every write after a claim is conditioned on the writer's own owner token, a completion carries a claim that
  landed, no key its handler raised for or reported failed is completed, and no completed record is overwritten
  while it lives or deleted but by a purge;
- a batch answer keeps (names, or under a stream's checkpoint follows) every record its handler reported failed,
  and drops a record it did not run only when that record's key ran in it or was completed; a FIFO group's
  records after one that comes back come back too;
- an invocation that ends alive leaves no claim behind (unless a write of its own failed or it ended within the
  claim margin of its deadline), and no claim outlives its invocation's deadline (or the in-progress floor) by more
  than the claim margin;
- durable: an execution's workflow runs only while the execution holds the key (a live claim of its own, or its
  own completed record), and its step runs after another execution's only once that one released the key, or its
  completed record was purged or expired, or it is over and its lease ended; an invocation whose workflow ran
  answers what the workflow answered, SUCCEEDED only once the completion landed and FAILED only once no claim of
  the execution is left; one whose workflow did not run answers another execution's stored result (not purged,
  not expired; never the execution's own) or is refused as in progress only on another execution's live claim,
  both in the shapes the SDK writes; a lease ends within IDEMPOTENCY_IN_PROGRESS_SECONDS and the claim margin.

Where the search is too wide to take whole (batches of two records, two invocations, faults and crashes), `walk`
takes seeded random walks through it instead. `python -m tools.model --ci` runs the suite's slice, `--deep` the
deeper searches docs/reliability.md reports; `--help` lists the bounds one search can take.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import random as _random
import threading
import time as _real_time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from idempotency_layer import cycle as _cycle_module
from idempotency_layer import deadline as _deadline_module
from idempotency_layer import errors
from idempotency_layer.config import load
from idempotency_layer.cycle import CLAIM_DEADLINE_MARGIN_MS, CLAIM_MARGIN_MS, Cycle
from idempotency_layer.executor import Executor, Pool
from idempotency_layer.invocation import Invocation as Served
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.results import ValueResults
from idempotency_layer.sources import plan as plan_of
from idempotency_layer.stores.dynamodb import DynamoDBError
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.support.memory_dynamodb import CHECK_FAILED, MemoryDynamoDB
from tests.support.memory_dynamodb import copy as _copy

KEY = "order-1"  # the whole event's order id: its record's key is "fn#" and the digest of it
T0 = 1_800_000_000.0  # virtual epoch seconds at the start of every history
TIMEOUT_MS = 10_000  # each invocation's time budget
EPSILON = 0.001
TABLE = "idempotency"
QUEUE = "arn:aws:sqs:us-east-1:123456789012:orders"
STREAM = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
CLUSTER = "arn:aws:kafka:us-east-1:123456789012:cluster/orders/1"
# Durable executions of the function "fn": each delivery of the order is an execution of its own, named so.
EXECUTIONS = "arn:aws:lambda:us-east-1:123456789012:function:fn:$LATEST/durable-execution"
SUCCEEDED, FAILED, PENDING = "SUCCEEDED", "FAILED", "PENDING"
IN_PROGRESS_TYPE = f"{errors.__name__}.{errors.IdempotencyAlreadyInProgressError.__qualname__}"
# The durable execution timeout, and so IDEMPOTENCY_IN_PROGRESS_SECONDS as docs/durable.md asks, unless the bounds
# give a floor: three invocations' worth (TIMEOUT_MS each).
EXECUTION_TIMEOUT_S = 30


# --- the events ------------------------------------------------------------------------------------------------

def _body(n: int, order: str | None = None) -> str:
    return json.dumps({"n": n, "orderId": order or f"o-{n}"})


def events_for(kind: str, records: int, delivery: int) -> Any:
    """The event one invocation gets: the same operation every time, a batch's records redelivered with a higher
    receive count (SQS's sign of redelivery) from the second delivery on."""
    if kind == "whole":
        return {"orderId": KEY, "delivery": delivery}
    if kind in ("sqs", "fifo", "dup"):
        arn = QUEUE + (".fifo" if kind == "fifo" else "")
        return {"Records": [{
            "messageId": f"m-{n}", "receiptHandle": f"r-{delivery}-{n}",
            "body": _body(n, "o-dup" if kind == "dup" else None),
            "attributes": {"ApproximateReceiveCount": str(delivery), "MessageGroupId": "g"},
            "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": "us-east-1"} for n in range(records)]}
    if kind == "kinesis":
        return {"Records": [{
            "kinesis": {"partitionKey": "p", "sequenceNumber": f"{100 + n}", "data": base64.b64encode(
                _body(n).encode()).decode()},
            "eventSource": "aws:kinesis", "eventID": f"shardId-000000000001:{100 + n}", "eventSourceARN": STREAM,
            "awsRegion": "us-east-1"} for n in range(records)]}
    if kind == "kafka":
        lists: dict[str, list[Any]] = {}
        for n in range(records):
            partition = n % 2
            lists.setdefault(f"orders-{partition}", []).append({
                "topic": "orders", "partition": partition, "offset": 10 + n, "timestamp": 0,
                "timestampType": "CREATE_TIME", "value": base64.b64encode(_body(n).encode()).decode(), "headers": []})
        return {"eventSource": "aws:kafka", "eventSourceArn": CLUSTER, "records": lists}
    raise ValueError(f"unknown kind {kind!r}")


def _record_ids(event: Any) -> list[str]:
    if isinstance(event.get("Records"), list):
        return [r.get("messageId") or r["kinesis"]["sequenceNumber"] for r in event["Records"]]
    if isinstance(event.get("records"), dict):
        return [f"{r['partition']}@{r['offset']}" for rs in event["records"].values() for r in rs]
    return []


# --- the world's pieces ----------------------------------------------------------------------------------------

class _Died(BaseException):
    """The environment is gone: raised in its threads so the layer's code stops touching the world."""


class HandlerFailed(Exception):
    """The handler raised before its side effect."""


class Violation(AssertionError):
    pass


@dataclass(frozen=True)
class Bounds:
    invocations: int = 2
    faults: int = 1  # requests refused or landed with their reply lost; handlers that raise or report a record
    crashes: int = 1
    advances: int = 2  # clock jumps
    skew_s: tuple[float, ...] = (0.0,)  # each environment's clock offset, cycled over the environments
    environments: int = 0  # invocation i runs in environment i % environments, one at a time; 0: one each
    cache: bool = False  # the environments' local cache of completed records (IDEMPOTENCY_LOCAL_CACHE_SIZE)
    kind: str = "whole"  # whole, sqs, fifo, dup (an SQS batch of one key twice), kinesis, kafka
    records: int = 2  # a batch's records
    wait_s: float = 0.0  # IDEMPOTENCY_WAIT_SECONDS
    floor_s: int = 0  # IDEMPOTENCY_IN_PROGRESS_SECONDS
    ttl_s: int = 3600  # IDEMPOTENCY_TTL_SECONDS
    purges: int = 0  # an operator's purges
    late: int = 0  # requests left in flight, landing later
    precheck: str = "auto"  # IDEMPOTENCY_BATCH_PRECHECK
    checkpoint: bool = True  # IDEMPOTENCY_STREAM_FAILURES=checkpoint (False: records)
    # A handler may take long (once a history): its side effect happens this many seconds before its invocation's
    # deadline, so what follows (completions, their retries and backoffs) runs with that little time left.
    slow_s: tuple[float, ...] = ()
    # kind="durable": `invocations` executions of the same input (IDEMPOTENCY_DURABLE=execution), each invoked at
    # most `attempts` times by the durable service (after its wait, or after an invocation that failed or died);
    # `floor_s` is then the execution timeout and IDEMPOTENCY_IN_PROGRESS_SECONDS (EXECUTION_TIMEOUT_S when 0).
    attempts: int = 3
    # A completion or a release the table fails, and every retry of it, until its invocation's deadline (once).
    outages: int = 0


@dataclass
class Pending:
    kind: str  # start, request, effect, sleep
    what: str = ""  # the operation, or the record
    params: dict | None = None
    wake: float = 0.0  # a sleep's end
    action: str | None = None


@dataclass
class Actor:
    name: str  # deterministic: the invocation's index, then each child's place
    invocation: Invocation
    thread: threading.Thread | None = None
    pending: Pending | None = None
    go: threading.Event = field(default_factory=threading.Event)


@dataclass
class Environment:
    skew: float
    executor: Executor | None = None  # None until its first invocation starts, and again after it died
    busy: bool = False


@dataclass
class Invocation:
    index: int
    environment: Environment
    event: Any
    started_at: float | None = None
    last_landed: int = 0  # the step at which its last request landed while it ran
    deadline: float | None = None  # true time after which Lambda stops it
    remaining_ms: int = 0
    dead: bool = False
    finished: bool = False
    faulted: bool = False  # a completion or release of its own failed, or a request of its own was left in flight
    late: bool = False  # it ended with less than the claim margin left by its own clock: no time to withdraw
    outcome: tuple = ()
    values: dict[str, str] = field(default_factory=dict)  # key -> what its handler returned for it
    owners: dict[str, str] = field(default_factory=dict)  # owner token -> key, for claims that landed
    tokens: dict[str, str] = field(default_factory=dict)  # owner token -> key, for claims it sent
    claimed_at: dict[str, float] = field(default_factory=dict)  # owner token -> when that claim landed
    decided: dict[str, str] = field(default_factory=dict)  # key -> "complete" or "release", once a write was sent
    ran: list[tuple[str | None, int]] = field(default_factory=list)  # (key, record index) of each side effect
    failed: set[int] = field(default_factory=set)  # record indexes its handler reported failed
    unfinished: set[str] = field(default_factory=set)  # keys its handler raised for or reported failed
    execution: int | None = None  # durable: the execution it is an invocation of
    attempt: int = 0  # durable: its place among that execution's invocations
    workflow: Any = None  # durable: what its workflow answered, when the workflow ran in it
    outage: bool = False  # durable: the table fails its requests from its outage on
    sent_late: bool = False  # a request of its own was left in flight, to land later
    record_at_end: dict | None = None  # durable: the key's record when it ended
    ended_at: float = 0.0


@dataclass
class Execution:
    """A durable execution as the service keeps it: its checkpoints and whether its answer ended it."""
    index: int
    arn: str
    started_at: float | None = None
    ends_at: float = 0.0  # its execution timeout (IDEMPOTENCY_IN_PROGRESS_SECONDS, as the docs ask): none runs later
    checkpointed: bool = False  # its step (the charge) ran and was checkpointed, and its wait started
    failed: bool = False  # its step failed: the SDK replays that failure, the workflow answering FAILED
    settled: str | None = None  # SUCCEEDED or FAILED, once that answer reached the service
    lease_ms: int = 0  # in_progress_until of its latest claim that landed


@dataclass
class Effect:
    invocation: int
    key: str | None
    at: float


@dataclass
class Completion:
    invocation: int
    key: str
    owner: str
    value: str | None
    at: float
    step: int  # the search's step at which it landed: orders it against purges at the same virtual time
    expires_at: int


@dataclass
class History:
    choices: list[str]
    requests: list[tuple[str, dict, str]]  # (operation, params, "ok" | CHECK_FAILED) in the order they landed
    replies: list[Any]  # what each landed request answered (the response, or the ALL_OLD item), same order


class _Time:
    """The time module as the layer's deadline and cycle modules see it: monotonic time is the world's."""

    def __init__(self, world: World) -> None:
        self._world = world

    def monotonic(self) -> float:
        return self._world.now

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


class _Threads:
    """The executor's pool's threads: each call an actor of the invocation that maps, moving when the scheduler
    says, and the mapping thread waiting for them all (it does not run meanwhile)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def map(self, call: Callable[[Any], Any], items: list[Any]) -> Iterator[Any]:
        world = self.world
        parent = world.actor()
        results: list[Any] = [None] * len(items)
        done = threading.Event()
        left = [len(items)]

        def child(k: int, item: Any) -> None:
            try:
                results[k] = ("ok", call(item))
            except BaseException as error:  # a death, raised again in the mapping thread
                results[k] = ("raised", error)
            finally:
                with world.cond:
                    world.running -= 1
                    left[0] -= 1
                    if left[0] == 0:
                        world.running += 1  # the mapping thread goes on
                        done.set()
                    world.cond.notify_all()

        actors = [Actor(f"{parent.name}.{k}", parent.invocation) for k in range(len(items))]
        with world.cond:
            world.running += len(items) - 1  # the children run; the mapping thread waits
            for k, (actor, item) in enumerate(zip(actors, items, strict=True)):
                actor.thread = threading.Thread(target=world.acting, args=(actor, child, k, item), daemon=True)
                world.actors.append(actor)
            world.cond.notify_all()
        for actor in actors:
            assert actor.thread is not None
            actor.thread.start()
        done.wait()
        for kind, value in results:
            if kind == "raised":
                raise value
        return iter(value for _, value in results)


class _Transport:
    """An environment's transport: every request is a step the scheduler decides."""

    def __init__(self, world: World) -> None:
        self.world = world

    def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
        if deadline is not None and deadline.attempt_time() is None:  # as the client: no attempt may start
            from idempotency_layer.stores.dynamodb.errors import out_of_time

            raise out_of_time(operation)
        return self.world.request(operation, params)


# --- the world ---------------------------------------------------------------------------------------------------

class World:
    def __init__(self, bounds: Bounds, choose: Callable[[int], int]) -> None:
        self.bounds = bounds
        self.choose = choose
        self.now = T0
        self.db = MemoryDynamoDB()
        self.faults = self.crashes = self.advances = self.purged = self.lates = self.slowed = 0
        self.effects: list[Effect] = []
        self.completions: list[Completion] = []
        self.purges: list[tuple[str, int]] = []  # (key, step) of each record an operator deleted
        self.releases: list[tuple[int, str, int]] = []  # durable: (execution, key, step) of each release that landed
        self.inflight: list[tuple[Invocation, str, dict]] = []
        self.cond = threading.Condition()
        self.running = 0
        self.actors: list[Actor] = []
        self.choices: list[str] = []
        self.requests: list[tuple[str, dict, str]] = []
        self.replies: list[Any] = []
        self.violation: str | None = None
        self.history: History | None = None
        self.durable = bounds.kind == "durable"
        self.outaged = 0
        self.floor_s = bounds.floor_s or (EXECUTION_TIMEOUT_S if self.durable else 0)
        self.config = load({"IDEMPOTENCY_TABLE": TABLE, "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
                            "AWS_LAMBDA_FUNCTION_NAME": "fn", "AWS_REGION": "us-east-1",
                            "IDEMPOTENCY_KEY_JMESPATH": "orderId" if bounds.kind in ("whole", "durable") else
                            ("json_parse(body).orderId" if bounds.kind == "dup" else ""),
                            "IDEMPOTENCY_TTL_SECONDS": str(bounds.ttl_s),
                            "IDEMPOTENCY_IN_PROGRESS_SECONDS": str(self.floor_s),
                            "IDEMPOTENCY_WAIT_SECONDS": str(bounds.wait_s),
                            "IDEMPOTENCY_BATCH_PRECHECK": bounds.precheck,
                            "IDEMPOTENCY_STREAM_FAILURES": "checkpoint" if bounds.checkpoint else "records",
                            "IDEMPOTENCY_DURABLE": "execution" if self.durable else "pass"})
        self.keys = KeyDeriver(self.config.key_prefix, self.config.key_jmespath, self.config.payload_jmespath)
        # Durable: every execution's invocations, in order, each waiting for the one before it to end.
        slots = [(x, k) for x in range(bounds.invocations) for k in range(bounds.attempts)] if self.durable \
            else [(None, 0)] * bounds.invocations
        count = bounds.environments or len(slots)
        self.environments = [Environment(bounds.skew_s[e % len(bounds.skew_s)]) for e in range(count)]
        self.invocations = [Invocation(i, self.environments[i % count], None if self.durable else events_for(
            bounds.kind, bounds.records, i + 1), execution=x, attempt=k) for i, (x, k) in enumerate(slots)]
        self.executions = [Execution(x, f"{EXECUTIONS}/delivery-{x}/{x + 1:08x}") for x in range(bounds.invocations)
                           ] if self.durable else []
        self.durable_key = self.keys.key({"orderId": KEY}) if self.durable else None
        self.max_skew = max(bounds.skew_s)

    # -- the actors' side ------------------------------------------------------------------------------------

    def actor(self) -> Actor:
        current = threading.current_thread()
        return next(a for a in self.actors if a.thread is current)

    def acting(self, actor: Actor, body: Callable[..., Any], *args: Any) -> None:
        body(*args)

    def fail(self, problem: str) -> None:
        """Record a broken invariant and stop this invocation, as a death no layer code can catch and go on from."""
        invocation = self.actor().invocation
        if self.violation is None:
            self.violation = f"invocation {invocation.index}: {problem}"
        invocation.dead = True
        raise _Died

    def gate(self, pending: Pending) -> Pending:
        actor = self.actor()
        if actor.invocation.dead:
            raise _Died
        with self.cond:
            actor.pending = pending
            self.running -= 1
            self.cond.notify_all()
        actor.go.wait()
        actor.go.clear()
        actor.pending = None
        if actor.invocation.dead:
            raise _Died
        if pending.action in ("die", "die-after"):
            actor.invocation.dead = True
            if pending.action == "die":
                raise _Died
            # die-after: the caller lands its request, or makes its side effect, then raises the death itself
        return pending

    def sleep(self, seconds: float) -> None:
        self.gate(Pending("sleep", wake=self.now + max(0.0, seconds)))

    def request(self, operation: str, params: dict) -> dict:
        invocation = self.actor().invocation
        self._check_fenced(invocation, operation, params)
        if invocation.outage:  # the table down for the rest of the invocation: refused at once, no step
            action: str | None = "throttle"
        else:
            action = self.gate(Pending("request", operation, params)).action
        if action == "throttle":
            raise DynamoDBError(operation, "ThrottlingException", "Rate of requests exceeds the allowed throughput",
                                status=400)
        if action == "late":  # still in flight: the caller gives up; it lands at a later step
            self.inflight.append((invocation, operation, _copy(params)))
            raise DynamoDBError(operation, "InvocationDeadline", "no answer in the time the call had", uncertain=True)
        reply = self._land(invocation, operation, params)
        if action == "die-after":
            raise _Died
        if action == "lost":
            raise DynamoDBError(operation, "ReadTimeoutError", "Read timeout on endpoint URL", uncertain=True)
        if isinstance(reply, DynamoDBError):
            raise reply
        return reply

    def _check_fenced(self, invocation: Invocation, operation: str, params: dict) -> None:
        if operation == "PutItem":
            if "ConditionExpression" not in params:
                self.fail("an unconditional PutItem")
            owner = params["Item"]["owner"]["S"]
            invocation.tokens[owner] = params["Item"]["id"]["S"]
        if operation in ("UpdateItem", "DeleteItem"):
            me = params.get("ExpressionAttributeValues", {}).get(":me", {}).get("S")
            if params.get("ConditionExpression") != "#o = :me" or params["ExpressionAttributeNames"]["#o"] != "owner":
                self.fail(f"{operation} not conditioned on the owner")
            # A completion must carry a claim that landed; a release may withdraw a claim whose outcome it never
            # heard (its own token, so it deletes nothing of anyone else's). A durable execution's claim is the
            # execution's: any invocation of it may have made it.
            known: dict[str, str] = {}
            for mine in self._same_execution(invocation):
                known.update(mine.owners if operation == "UpdateItem" else mine.tokens)
            if me not in known:
                self.fail(f"{operation} fenced with a token it never claimed")
            key = known[me]
            invocation.decided.setdefault(key, "complete" if operation == "UpdateItem" else "release")

    def _land(self, invocation: Invocation, operation: str, params: dict) -> Any:
        key = (params.get("Item") or params.get("Key") or {}).get("id", {}).get("S")
        old = self.db.item(key) if key is not None else None
        try:
            reply = self.db.apply(operation, params)
            outcome = "ok"
        except DynamoDBError as error:
            if error.code != CHECK_FAILED:
                self._violation(invocation, f"{operation} refused by DynamoDB's rules: {error.message}")
                return error
            reply, outcome = error, CHECK_FAILED
        self.requests.append((operation, _copy(params), outcome))
        if not invocation.finished:
            invocation.last_landed = len(self.choices)
        self.replies.append(reply.item if isinstance(reply, DynamoDBError) else reply)
        if outcome != "ok":
            return reply
        if operation in ("PutItem", "DeleteItem") and old is not None and old["status"]["S"] == "COMPLETED":
            if operation == "DeleteItem":
                self._violation(invocation, "a completed record was deleted, not by a purge")
            elif int(old["expires_at"]["N"]) > self.now + self.max_skew + EPSILON:
                self._violation(invocation, "a live completed record was claimed over")
        if operation == "PutItem":
            owner = params["Item"]["owner"]["S"]
            invocation.owners[owner] = key
            invocation.claimed_at[owner] = self.now
            if invocation.execution is not None:
                self.executions[invocation.execution].lease_ms = int(params["Item"]["in_progress_until"]["N"])
        if operation == "DeleteItem" and invocation.execution is not None:
            self.releases.append((invocation.execution, key, len(self.choices)))
        if operation == "UpdateItem":
            if key in invocation.unfinished:
                self._violation(invocation, "completed a key whose handler raised or reported its record failed")
            owner = params["ExpressionAttributeValues"][":me"]["S"]
            result = params["ExpressionAttributeValues"].get(":result", {}).get("S")
            value = json.loads(result) if result is not None and result.startswith('"') else result
            self.completions.append(Completion(invocation.index, key, owner, value, self.now, len(self.choices),
                                               int(params["ExpressionAttributeValues"][":exp"]["N"])))
        return reply

    def _violation(self, invocation: Invocation, problem: str) -> None:
        if self.violation is None:
            self.violation = f"invocation {invocation.index}: {problem}"

    # -- the handler ---------------------------------------------------------------------------------------------

    def handler(self, event: Any, context: Any) -> Any:
        invocation = self.actor().invocation
        if invocation.execution is not None:
            return self._workflow(invocation)
        ids = _record_ids(event) if isinstance(event, dict) and self.bounds.kind != "whole" else []
        if not ids:
            key = self.keys.key(event)
            self._effect_gate(invocation, key, 0)
            value = f"result of invocation {invocation.index}"
            invocation.values[str(key)] = value
            return value
        failures = []
        batch = self.batch_of(invocation.event)
        stopped = False  # a FIFO handler stops at its first failure and reports the rest, as Lambda asks
        for index, identifier in enumerate(_record_ids(invocation.event)):
            if identifier not in ids:
                continue
            key = batch.units[index].key
            if stopped or self._effect_gate(invocation, key, index) == "fail":
                stopped = self.bounds.kind == "fifo"
                invocation.failed.add(index)
                invocation.unfinished.add(str(key))
                failures.append(self._failure(invocation.event, index, identifier))
        return {"batchItemFailures": failures}

    def _failure(self, event: Any, index: int, identifier: str) -> dict:
        if self.bounds.kind == "kafka":
            partition, _, offset = identifier.partition("@")
            return {"itemIdentifier": {"partition": f"orders-{partition}", "offset": int(offset)}}
        return {"itemIdentifier": identifier}

    def _effect_gate(self, invocation: Invocation, key: str | None, index: int) -> str | None:
        pending = self.gate(Pending("effect", str(index)))
        if pending.action == "raise":
            invocation.unfinished.update(k for k, _ in invocation.ran)  # a batch handler raised: none of it is done
            invocation.unfinished.add(str(key))
            raise HandlerFailed
        self._effect(invocation, key, index)
        if pending.action == "die-after":
            raise _Died
        return pending.action

    def _effect(self, invocation: Invocation, key: str | None, index: int) -> None:
        invocation.ran.append((key, index))
        if key is None:
            return
        if invocation.execution is not None:
            self._step(invocation, key)
            return
        for earlier in self.effects:
            if earlier.key != key:
                continue
            before = self.invocations[earlier.invocation]
            if before.index == invocation.index:
                self.fail(f"ran its handler twice for key {key}")
            if not self._excused(before, key):
                self.fail(f"the handler ran again for key {key} at +{self.now - T0:.3f}s after invocation "
                          f"{before.index} ran it at +{earlier.at - T0:.3f}s, which "
                          + ("completed it" if self._completion(before, key) else "was still running it"))
        self.effects.append(Effect(invocation.index, key, self.now))

    def _completion(self, invocation: Invocation, key: str) -> Completion | None:
        return next((c for c in self.completions if c.invocation == invocation.index and c.key == key), None)

    def _excused(self, before: Invocation, key: str) -> bool:
        """Whether a run of `key` by `before` may be followed by another: released by it; or it died or ended without
        its completion landing; or its completed record purged since, or expired by some environment's clock."""
        completion = self._completion(before, key)
        if completion is None:
            return before.dead or before.finished or before.decided.get(key) == "release"
        purged = any(k == key and step > completion.step for k, step in self.purges)
        return purged or self.now + self.max_skew + EPSILON >= completion.expires_at

    # -- durable executions -------------------------------------------------------------------------------------

    def _workflow(self, invocation: Invocation) -> dict:
        """The durable function, as AWS's SDK runs it: a step (the charge, the side effect, checkpointed once it
        ran), then a wait (the invocation answers PENDING), then the step's receipt as the execution's result. A
        later invocation replays what was checkpointed: the step's result, or its failure (answered FAILED)."""
        execution = self.executions[invocation.execution or 0]
        key = str(self.durable_key)
        self._check_holds(invocation, key, "ran its workflow")
        if execution.failed:
            answer: dict = {"Status": FAILED, "Error": {"ErrorMessage": "the charge was declined",
                                                       "ErrorType": "StepError"}}
        elif execution.checkpointed:
            answer = {"Status": SUCCEEDED, "Result": json.dumps(f"receipt of execution {execution.index}")}
        elif self._effect_gate(invocation, key, 0) == "fail":  # the step failed, and the execution with it
            execution.failed = True
            answer = {"Status": FAILED, "Error": {"ErrorMessage": "the charge was declined", "ErrorType": "StepError"}}
        else:
            execution.checkpointed = True  # the step's result checkpointed, then the wait's start
            answer = {"Status": PENDING}
        if answer["Status"] == FAILED:
            invocation.unfinished.add(key)  # never completed
        invocation.workflow = _copy(answer)
        return answer

    def _envelope(self, invocation: Invocation) -> dict:
        """What the durable service invokes with: the execution's ARN, a new checkpoint token each time, and the
        operations so far (the EXECUTION operation with the input, then the step and the wait once checkpointed)."""
        execution = self.executions[invocation.execution or 0]
        operations: list[dict] = [{"Id": execution.arn.rsplit("/", 1)[-1], "Type": "EXECUTION", "Status": "STARTED",
                                   "ExecutionDetails": {"InputPayload": json.dumps({"orderId": KEY})}}]
        if execution.checkpointed or execution.failed:
            operations.append({"Id": "charge", "Type": "STEP", "Status": FAILED if execution.failed else SUCCEEDED})
        if execution.checkpointed:
            operations.append({"Id": "wait", "Type": "WAIT", "Status": SUCCEEDED})
        return {"DurableExecutionArn": execution.arn,
                "CheckpointToken": f"token-{execution.index}-{invocation.attempt}",
                "InitialExecutionState": {"Operations": operations, "NextMarker": ""}}

    def _same_execution(self, invocation: Invocation) -> list[Invocation]:
        if invocation.execution is None:
            return [invocation]
        return [i for i in self.invocations if i.execution == invocation.execution]

    def _tokens_of(self, execution: int) -> set[str]:
        """Every owner token an invocation of `execution` claimed with (its ARN, unless the layer is broken)."""
        return {token for i in self.invocations if i.execution == execution for token in i.tokens}

    def _check_holds(self, invocation: Invocation, key: str, what: str) -> None:
        """The workflow runs only while its execution holds the key: a live claim of its own, or its own completed
        record (the execution invoked again after its completion landed unheard)."""
        item = self.db.item(key)
        clock_ms = int((self.now + invocation.environment.skew) * 1000)
        if item is None or item["owner"]["S"] not in self._tokens_of(invocation.execution or 0):
            self.fail(f"execution {invocation.execution} {what} without holding key {key}")
        if item["status"]["S"] == "INPROGRESS" and int(item["in_progress_until"]["N"]) < clock_ms:
            self.fail(f"execution {invocation.execution} {what} after its lease on key {key} ended")

    def _step(self, invocation: Invocation, key: str) -> None:
        """A step's side effect (the charge): its execution holds the key, and no other execution's step of the key
        ran before it unless that one is excused (within one execution steps are at-least-once, the SDK's)."""
        self._check_holds(invocation, key, "ran its step")
        for earlier in self.effects:
            before = self.invocations[earlier.invocation]
            if earlier.key != key or before.execution == invocation.execution or before.execution is None:
                continue
            if not self._durable_excused(before.execution, key, invocation):
                self.fail(f"execution {invocation.execution} ran the workflow's step for key {key} at "
                          f"+{self.now - T0:.3f}s after execution {before.execution} ran it at "
                          f"+{earlier.at - T0:.3f}s, which "
                          + ("SUCCEEDED" if self._durable_completion(before.execution, key) else "held the lease"))
        self.effects.append(Effect(invocation.index, key, self.now))

    def _durable_completion(self, execution: int, key: str) -> Completion | None:
        return next((c for c in self.completions
                     if c.key == key and self.invocations[c.invocation].execution == execution), None)

    def _durable_excused(self, execution: int, key: str, runner: Invocation) -> bool:
        """Whether a step of another execution may follow `execution`'s: its completed record purged since or
        expired; else it released the key (it FAILED); else it is over (settled, stopped, or never invoked again)
        and its lease has ended by the running environment's clock (the documented limit)."""
        completion = self._durable_completion(execution, key)
        if completion is not None:
            purged = any(k == key and step > completion.step for k, step in self.purges)
            return purged or self.now + self.max_skew + EPSILON >= completion.expires_at
        if any(x == execution and k == key for x, k, _ in self.releases):
            return True
        lease = self.executions[execution].lease_ms / 1000
        return self._over(execution) and lease <= self.now + runner.environment.skew + EPSILON

    def _over(self, execution: int) -> bool:
        """Whether the service will invoke `execution` no more: its answer ended it, its timeout passed, or its
        invocations are spent; and none of them is running."""
        state = self.executions[execution]
        mine = [i for i in self.invocations if i.execution == execution]
        if state.settled:
            return True
        if any(i.started_at is not None and not i.finished for i in mine):
            return False
        return (state.started_at is not None and self.now >= state.ends_at) or all(i.finished for i in mine)

    def _startable(self, invocation: Invocation) -> bool | None:
        """Whether the service may invoke this slot of its execution now (True), later (False), or never (None)."""
        if invocation.execution is None:
            return True
        state = self.executions[invocation.execution]
        if state.settled or (state.started_at is not None and self.now >= state.ends_at):
            return None
        if invocation.attempt == 0:
            return True
        before = self.invocations[invocation.index - 1]
        if before.finished:
            return None if before.started_at is None else True
        return False

    # -- an environment ----------------------------------------------------------------------------------------

    def executor_of(self, environment: Environment) -> Executor:
        if environment.executor is None:  # a fresh environment: its init builds the store, cycle and executor
            store = DynamoDBStore(_Transport(self), TABLE, self.config.attributes, key_prefix=self.config.key_prefix)
            cycle = Cycle(store, self.config.ttl_seconds, 8 if self.bounds.cache else 0,
                          clock=lambda: self.now + environment.skew, results=ValueResults(),
                          min_claim_ms=self.config.in_progress_seconds * 1000,
                          wait_seconds=self.config.wait_seconds, sleep=self.sleep, precheck=self.config.batch_precheck)
            pool = Pool()
            pool._threads = _Threads(self)  # the executor's own Pool.map, its threads the scheduler's actors
            environment.executor = Executor(cycle, self.handler, self.config, pool=pool)
        return environment.executor

    def batch_of(self, event: Any) -> Any:
        return plan_of(self.config, self.keys, event)

    def _start(self, invocation: Invocation) -> None:
        invocation.environment.busy = True
        invocation.started_at = self.now
        invocation.last_landed = len(self.choices)
        invocation.deadline = self.now + TIMEOUT_MS / 1000
        if invocation.execution is not None:  # the service stops an execution at its execution timeout
            execution = self.executions[invocation.execution]
            if execution.started_at is None:
                execution.started_at, execution.ends_at = self.now, self.now + self.floor_s
            invocation.deadline = min(invocation.deadline, execution.ends_at)
            invocation.event = self._envelope(invocation)
        # As the runtime computes it: Lambda's deadline minus this environment's clock.
        invocation.remaining_ms = int((invocation.deadline - (self.now + invocation.environment.skew)) * 1000)

    def body(self, invocation: Invocation) -> None:
        environment = invocation.environment
        try:
            if self.gate(Pending("start")).action == "skip":  # a durable execution's invocation that never came
                invocation.outcome = ("never",)
                return
            self._start(invocation)
            executor = self.executor_of(environment)
            event = _copy(invocation.event)
            value = executor.run(plan_of(self.config, self.keys, event), event, None, Served(invocation.remaining_ms))
            if invocation.dead:
                raise _Died  # the layer caught a death (a BaseException) on a write path and went on
            invocation.outcome = ("ok", value)
            if invocation.execution is not None and isinstance(value, dict) and value.get("Status") in (
                    SUCCEEDED, FAILED):
                self.executions[invocation.execution].settled = value["Status"]  # the execution ends so
        except _Died:
            invocation.outcome = ("died",)
        except HandlerFailed:
            invocation.outcome = ("handler-failed",)
        except errors.IdempotencyAlreadyInProgressError:
            invocation.outcome = ("busy",)
        except (errors.IdempotencyPersistenceLayerError, errors.IdempotencyBatchIncompleteError,
                errors.IdempotencyClaimConflictError) as error:
            invocation.outcome = ("refused", type(error).__name__)
        except BaseException as error:  # any other escape is itself a finding
            invocation.outcome = ("raised", f"{type(error).__name__}: {error}")
        finally:
            if invocation.dead:  # whatever the layer made of its death: Lambda replaces the environment
                invocation.outcome = ("died",)
                environment.executor = None
            invocation.finished = True
            if invocation.started_at is not None:
                left = invocation.started_at + invocation.remaining_ms / 1000 - self.now
                invocation.late = left < CLAIM_DEADLINE_MARGIN_MS / 1000
                environment.busy = False
            if invocation.execution is not None:
                invocation.record_at_end, invocation.ended_at = _copy(self.db.item(str(self.durable_key))), self.now
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    # -- the scheduler -------------------------------------------------------------------------------------------

    def _settle(self) -> None:
        with self.cond:
            while self.running > 0:
                self.cond.wait()

    def _release(self, actor: Actor, action: str) -> None:
        assert actor.pending is not None
        actor.pending.action = action
        with self.cond:
            self.running += 1
        actor.go.set()
        self._settle()

    def _kill_expired(self) -> None:
        for invocation in self.invocations:
            if invocation.deadline is not None and self.now > invocation.deadline and not invocation.finished:
                invocation.dead = True  # Lambda stops the invocation at its deadline, wherever it is
                for actor in self.actors:
                    if actor.invocation is invocation and actor.pending is not None:
                        self._release(actor, "die")

    def _moments(self) -> list[float]:
        """The next times at which something changes: a deadline passes, a sleep ends, a claim or a record expires
        by some environment's clock."""
        moments = [i.deadline + EPSILON for i in self.invocations if i.deadline is not None and not i.finished]
        moments += [a.pending.wake + EPSILON for a in self.actors
                    if a.pending is not None and a.pending.kind == "sleep"]
        for item in self.db.items.values():
            for environment in self.environments:
                moments.append(int(item["expires_at"]["N"]) + 1 - environment.skew + EPSILON)
                if item["status"]["S"] == "INPROGRESS":
                    moments.append(int(item["in_progress_until"]["N"]) / 1000 - environment.skew + EPSILON)
        return sorted(m for m in moments if m > self.now)

    def actions(self) -> list[tuple[str, Any, str]]:
        b = self.bounds
        found: list[tuple[str, Any, str]] = []
        for actor in sorted((a for a in self.actors if a.pending is not None), key=lambda a: a.name):
            pending = actor.pending
            assert pending is not None
            if pending.kind == "start" and (actor.invocation.environment.busy or not self._startable(actor.invocation)):
                continue  # an environment runs one invocation at a time; an execution's invocations one after another
            if pending.kind == "sleep" and pending.wake > self.now:
                continue
            kinds = ["ok"]
            if pending.kind == "request":
                if self.faults < b.faults:
                    kinds += ["throttle", "lost"]
                if self.lates < b.late:
                    kinds.append("late")
                if self.outaged < b.outages and pending.what in ("UpdateItem", "DeleteItem"):
                    kinds.append("outage")  # a completion or a release that does not land, retries and all
                if self.crashes < b.crashes:
                    kinds += ["die", "die-after"]
            elif pending.kind == "effect":
                if not self.slowed:
                    kinds += [f"slow-{seconds}" for seconds in b.slow_s]
                if self.faults < b.faults:
                    kinds += ["raise"] + (["fail"] if b.kind != "whole" else [])
                if self.crashes < b.crashes:
                    kinds += ["die", "die-after"]
            what = f"{pending.kind}/{pending.what}" if pending.what else pending.kind
            found += [(f"{actor.name}:{what}:{kind}", actor, kind) for kind in kinds]
        for n, (invocation, operation, _) in enumerate(self.inflight):
            found.append((f"land/{operation}/{invocation.index}", n, "land"))
        if self.purged < b.purges:
            for key in sorted(k[0] for k in self.db.items):
                found.append((f"purge/{key[-6:]}", key, "purge"))
        # Time passes by choice (bounded), or because nothing else can happen until it does (a sleep, a start
        # behind a busy environment): then it is no choice, and every invocation's deadline bounds it.
        waiting = any(a.pending is not None for a in self.actors)
        if (found and self.advances < b.advances) or (not found and waiting):
            moments = self._moments()
            if moments:
                found.append((f"clock+{moments[0] - T0:.3f}s", moments[0], "advance" if found else "wait"))
        return found

    def _skip_never(self) -> None:
        """Durable: the invocations the service will never make (their execution ended) end without starting."""
        for actor in sorted(self.actors, key=lambda a: a.invocation.index):
            pending = actor.pending
            if pending is not None and pending.kind == "start" and self._startable(actor.invocation) is None:
                self._release(actor, "skip")

    def _purge(self, key: str) -> None:
        """What `idempotency-layer purge KEY --yes` does: a live claim is refused; else the record is deleted."""
        item = self.db.item(key)
        if item is None:
            return
        if item["status"]["S"] == "INPROGRESS" and int(item["in_progress_until"]["N"]) >= self.now * 1000:
            return
        params = {"TableName": TABLE, "Key": {"id": {"S": key}}}
        self.replies.append(self.db.apply("DeleteItem", params))
        self.requests.append(("DeleteItem", params, "ok"))
        self.purges.append((key, len(self.choices)))

    def run(self) -> History:
        for invocation in self.invocations:
            actor = Actor(str(invocation.index), invocation)
            actor.thread = threading.Thread(target=self.acting, args=(actor, self.body, invocation), daemon=True)
            self.actors.append(actor)
        with self.cond:
            self.running = len(self.invocations)
        for actor in list(self.actors):
            assert actor.thread is not None
            actor.thread.start()
        self._settle()
        while True:
            self._skip_never()
            options = self.actions()
            if not options:
                break
            label, target, kind = options[self.choose(len(options))]
            self.choices.append(label)
            if kind in ("advance", "wait"):
                self.advances += kind == "advance"
                self.now = target
                self._kill_expired()
            elif kind == "purge":
                self.purged += 1
                self._purge(target)
            elif kind == "land":
                invocation, operation, params = self.inflight.pop(target)
                self._land(invocation, operation, params)
            elif kind == "outage":
                self.outaged += 1
                target.invocation.outage = True
                self._release(target, "throttle")
            elif kind.startswith("slow-"):  # the handler works until shortly before its deadline
                self.slowed += 1
                assert target.invocation.deadline is not None
                self.now = max(self.now, target.invocation.deadline - float(kind[5:]))
                self._kill_expired()
                self._release(target, "ok")
            else:
                if kind in ("throttle", "lost", "raise", "fail"):
                    self.faults += 1
                pending = target.pending
                if kind == "late" or (kind in ("throttle", "lost") and pending.what in ("UpdateItem", "DeleteItem")):
                    target.invocation.faulted = True  # a completion or release that failed may leave its claim
                if kind == "late":
                    self.lates += 1
                    target.invocation.sent_late = True
                if kind in ("die", "die-after"):
                    self.crashes += 1
                self._release(target, kind)
        for actor in self.actors:
            assert actor.thread is not None
            actor.thread.join(5)
            if actor.thread.is_alive():
                raise Violation(f"actor {actor.name} never finished: {self.choices}")
        self._check_end()
        return History(self.choices, self.requests, self.replies)

    # -- the checks at the end ----------------------------------------------------------------------------------

    def _check_end(self) -> None:
        if self.violation is not None:
            raise Violation(self.violation)
        for invocation in self.invocations:
            if invocation.outcome and invocation.outcome[0] == "raised":
                raise Violation(f"invocation {invocation.index}: {invocation.outcome[1]}")
            if invocation.outcome and invocation.outcome[0] == "ok":
                if self.durable:
                    self._check_execution_answer(invocation)
                elif self.bounds.kind == "whole":
                    self._check_answer(invocation)
                else:
                    self._check_batch(invocation)
        if self.durable:
            self._check_leases()
        else:
            self._check_claims()

    def _check_answer(self, invocation: Invocation) -> None:
        value = invocation.outcome[1]
        key = self.keys.key(invocation.event)
        own = invocation.values.get(str(key))
        if own is not None:
            if value != own:
                raise Violation(f"invocation {invocation.index} answered {value!r}, its handler returned {own!r}")
            return
        stored = [c for c in self.completions if c.key == key and c.value == value]
        if not stored:
            raise Violation(f"invocation {invocation.index} replayed {value!r}, which no completion of its key stored")
        completion = stored[0]
        assert invocation.started_at is not None
        purged = [step for k, step in self.purges if k == key and completion.step < step < invocation.last_landed]
        if purged:
            raise Violation(f"invocation {invocation.index} replayed {value!r}, whose record was purged before it "
                            "last read the table")
        if invocation.started_at - self.max_skew - EPSILON > completion.expires_at:
            raise Violation(f"invocation {invocation.index} replayed {value!r}, whose record had expired")

    def _group(self, index: int) -> str | None:
        """Record `index`'s ordering group as Lambda sees it: a shard, a Kafka partition, a FIFO message group."""
        kind = self.bounds.kind
        return {"kinesis": "shard", "kafka": f"orders-{index % 2}", "fifo": "g"}.get(kind)

    def _kept(self, invocation: Invocation, response: Any) -> set[int]:
        """The records Lambda sends again after this answer: those it names, and under a stream's checkpoint
        (Kinesis, Kafka) every later record of a group it names one of."""
        reported = {json.dumps(item.get("itemIdentifier"), sort_keys=True)
                    for item in response.get("batchItemFailures", []) if isinstance(item, dict)}
        ids = _record_ids(invocation.event)
        kept = {index for index, identifier in enumerate(ids)
                if json.dumps(self._failure(invocation.event, index, identifier)["itemIdentifier"], sort_keys=True)
                in reported}
        if self.bounds.kind == "kafka":  # one {partition, offset} per partition: Lambda resumes it from there
            for index, identifier in enumerate(ids):
                partition, _, offset = identifier.partition("@")
                named = [json.loads(r) for r in reported]
                if any(n.get("partition") == f"orders-{partition}" and n.get("offset", 1 << 62) <= int(offset)
                       for n in named if isinstance(n, dict)):
                    kept.add(index)
        if self.bounds.kind == "kinesis":
            first = min(kept, default=len(ids))
            kept |= set(range(first, len(ids)))
        return kept

    def _check_batch(self, invocation: Invocation) -> None:
        response = invocation.outcome[1]
        if not isinstance(response, dict) or not isinstance(response.get("batchItemFailures"), list):
            raise Violation(f"invocation {invocation.index} answered no batchItemFailures list: {response!r}")
        kept = self._kept(invocation, response)
        units = self.batch_of(invocation.event).units
        ran = {index for _, index in invocation.ran}
        ran_keys = {key for key, _ in invocation.ran} - invocation.unfinished  # a copy's key may run on another record
        for index, unit in enumerate(units):
            if index in invocation.failed and index not in kept:
                raise Violation(f"invocation {invocation.index} dropped record {index}, which its handler reported "
                                "failed")
            if index in kept or index in ran or unit.key in ran_keys:
                continue
            if unit.key is None or not any(c.key == unit.key for c in self.completions):
                raise Violation(f"invocation {invocation.index} dropped record {index} as done, but no run of its key "
                                "completed: it is lost")
        if self.bounds.kind == "fifo":  # a message group is processed in order: nothing after a kept record goes
            first = min(kept, default=len(units))
            if kept != set(range(first, len(units))):
                raise Violation(f"invocation {invocation.index} kept records {sorted(kept)} of a FIFO group: a later "
                                "one was dropped while an earlier one comes back")

    def _check_execution_answer(self, invocation: Invocation) -> None:
        """What a durable execution's invocation answered: its workflow's answer, passed on only once the claim
        followed it (SUCCEEDED: the key completed; FAILED: no claim of the execution left); or, its workflow not
        run, the first execution's result or the in-progress refusal of another execution's live claim."""
        answer, record, x = invocation.outcome[1], invocation.record_at_end, invocation.execution or 0
        mine = self._tokens_of(x)
        held = record is not None and record["owner"]["S"] in mine
        status = record["status"]["S"] if record is not None else None
        said = f"invocation {invocation.index} (execution {x})"
        if invocation.workflow is not None:
            if answer != invocation.workflow:
                raise Violation(f"{said} answered {answer!r}, its workflow answered {invocation.workflow!r}")
            if answer["Status"] == SUCCEEDED and not (held and status == "COMPLETED"):
                raise Violation(f"{said} answered SUCCEEDED, but its completion had not landed: the execution "
                                "ends with its key still claimed")
            late = any(i.sent_late for i in self._same_execution(invocation))  # a claim of its own may land after
            if answer["Status"] == FAILED and held and status == "INPROGRESS" and not late:
                raise Violation(f"{said} answered FAILED and left its lease behind")
            return
        given = answer.get("Status") if isinstance(answer, dict) else None
        if given == FAILED:
            error = answer.get("Error") or {}
            if error.get("ErrorType") != IN_PROGRESS_TYPE:
                raise Violation(f"{said}, a duplicate, answered FAILED with {error!r}")
            clock_ms = int((invocation.ended_at + invocation.environment.skew) * 1000)
            if held or status != "INPROGRESS" or int(record["in_progress_until"]["N"]) < clock_ms:  # type: ignore
                raise Violation(f"{said} was refused as in progress, but no other execution held a live claim "
                                "(the owner's own invocations are never refused)")
            return
        if given != SUCCEEDED or set(answer) != {"Status", "Result"}:
            raise Violation(f"{said}, a duplicate, answered {answer!r}")
        self._check_execution_replay(invocation, answer["Result"])

    def _check_execution_replay(self, invocation: Invocation, value: Any) -> None:
        key = str(self.durable_key)
        said = f"invocation {invocation.index} (execution {invocation.execution})"
        stored = [c for c in self.completions if c.key == key and c.value == value]
        if not stored:
            raise Violation(f"{said} replayed {value!r}, which no completion of its key stored")
        completion = stored[0]
        if self.invocations[completion.invocation].execution == invocation.execution:
            raise Violation(f"{said} was answered its own execution's result without running (the owner runs)")
        purged = [step for k, step in self.purges if k == key and completion.step < step < invocation.last_landed]
        if purged:
            raise Violation(f"{said} replayed {value!r}, whose record was purged before it last read the table")
        assert invocation.started_at is not None
        if invocation.started_at - self.max_skew - EPSILON > completion.expires_at:
            raise Violation(f"{said} replayed {value!r}, whose record had expired")

    def _check_leases(self) -> None:
        """Durable: an execution's lease ends within IDEMPOTENCY_IN_PROGRESS_SECONDS (the execution timeout) and
        the claim margin of the moment its claim landed, by the claiming environment's clock. (That a settled
        execution leaves no lease is checked on its answer.)"""
        for item in self.db.items.values():
            if item["status"]["S"] != "INPROGRESS":
                continue
            owner = item["owner"]["S"]
            maker = max((i for i in self.invocations if owner in i.claimed_at), key=lambda i: i.claimed_at[owner])
            state = self.executions[maker.execution or 0]
            until = int(item["in_progress_until"]["N"]) / 1000
            latest = (maker.claimed_at[owner] + max(self.floor_s, maker.remaining_ms / 1000)
                      + CLAIM_MARGIN_MS / 1000 + maker.environment.skew + EPSILON)
            if until > latest:
                raise Violation(f"execution {state.index}'s lease outlives IDEMPOTENCY_IN_PROGRESS_SECONDS by "
                                f"{until - latest:.3f}s")

    def _check_claims(self) -> None:
        for item in self.db.items.values():
            if item["status"]["S"] != "INPROGRESS":
                continue
            owner = item["owner"]["S"]
            maker = next(i for i in self.invocations if owner in i.owners or owner in i.tokens)
            assert maker.deadline is not None and maker.started_at is not None
            # Withdrawn: an invocation that ended alive leaves no claim behind, unless a request of its own failed
            # (a release refused, or a claim that landed after its release did).
            if maker.finished and not maker.dead and not maker.faulted and not maker.late:
                raise Violation(f"invocation {maker.index} ended ({maker.outcome[0]}) and left its claim behind")
            # Bounded: a claim ends by the deadline of the invocation that made it (or the floor), by every clock.
            until = int(item["in_progress_until"]["N"]) / 1000
            landed = maker.claimed_at.get(owner, self.now)
            floor = max(0.0, self.bounds.floor_s - maker.remaining_ms / 1000)
            latest = (maker.deadline + (landed - maker.started_at) + floor + CLAIM_MARGIN_MS / 1000
                      + maker.environment.skew + EPSILON)
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


@contextlib.contextmanager
def _virtual_time(world: World) -> Iterator[None]:
    """The layer's modules that read the monotonic clock read the world's while `world` runs."""
    modules = (_deadline_module, _cycle_module)
    saved = [module.time for module in modules]
    saved_random = _deadline_module.random
    fake = _Time(world)
    for module in modules:
        module.time = fake  # type: ignore[assignment]
    _deadline_module.random = _random.Random(0)  # type: ignore[assignment]  # backoffs (Backoff) jittered alike
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.time = original  # type: ignore[assignment]
        _deadline_module.random = saved_random


def _run(bounds: Bounds, choose: Callable[[int], int]) -> World:
    world = World(bounds, choose)
    try:
        with _virtual_time(world):
            world.history = world.run()
    except Violation as violation:
        raise Violation(f"{violation}\n  history: {' -> '.join(world.choices)}") from None
    return world


def _histories(bounds: Bounds, limit: int | None = None) -> Iterator[History]:
    """Every history within `bounds`, depth first (stateless: each one replayed from the start)."""
    prefix: list[int] = []
    count = 0
    while True:
        chooser = _Chooser(prefix)
        trace = chooser.trace
        history = _run(bounds, chooser.choose).history
        assert history is not None
        yield history
        count += 1
        if limit is not None and count >= limit:
            return
        while trace and trace[-1][0] == trace[-1][1] - 1:
            trace.pop()
        if not trace:
            return
        prefix = [choice for choice, _ in trace[:-1]] + [trace[-1][0] + 1]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    quiet = logging.getLogger("idempotency_layer")
    quiet.addHandler(logging.NullHandler())  # the layer's own warnings, thousands of times, say nothing here
    propagate, quiet.propagate = quiet.propagate, False
    try:
        yield
    finally:
        quiet.propagate = propagate


def explore(bounds: Bounds, sample_every: int = 0, limit: int | None = None) -> tuple[int, list[History]]:
    """Explore every history within `bounds`; raise Violation on the first broken invariant.

    Returns how many histories were explored and every `sample_every`-th one (for replay on DynamoDB)."""
    count = 0
    sample: list[History] = []
    with _quiet():
        for history in _histories(bounds, limit):
            if sample_every and count % sample_every == 0:
                sample.append(history)
            count += 1
    return count, sample


def walk(bounds: Bounds, walks: int, seed: int = 0, sample_every: int = 0) -> tuple[int, list[History]]:
    """`walks` histories within `bounds`, each choice drawn at random (seeded: the same histories every run), for
    bounds too wide to explore in full; raise Violation on the first broken invariant. Returns how many of the
    histories were distinct, and every `sample_every`-th one."""
    rng = _random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    sample: list[History] = []
    with _quiet():
        for n in range(walks):
            history = _run(bounds, rng.randrange).history
            assert history is not None
            seen.add(tuple(history.choices))
            if sample_every and n % sample_every == 0:
                sample.append(history)
    return len(seen), sample


# The searches, each a path the protocol takes: `CI` is the suite's slice (tests/unit/test_protocol_model.py),
# `DEEP` what `python -m tools.model --deep` explores (docs/reliability.md has its figures). A search is
# (bounds, walks): walks=0 explores every history, else that many random walks.
WHOLE = {
    "two copies, a fault, a crash": Bounds(invocations=2, faults=1, crashes=1, advances=2),
    "a clock 0.9 s ahead (inside the margin)": Bounds(invocations=2, faults=1, crashes=1, advances=2,
                                                      skew_s=(0.0, 0.9)),
    "three copies, two environments, local caches": Bounds(invocations=3, faults=0, crashes=1, advances=1,
                                                           environments=2, cache=True),
    "purges across environments' caches": Bounds(invocations=3, faults=0, crashes=0, advances=1, environments=2,
                                                 cache=True, purges=1),
    "cache and TTL expiry, skewed clocks": Bounds(invocations=3, faults=0, crashes=0, advances=2, environments=2,
                                                  cache=True, ttl_s=5, skew_s=(0.0, 0.9)),
    "a late copy after TTL expiry": Bounds(invocations=2, faults=0, crashes=1, advances=2, ttl_s=5,
                                           skew_s=(0.0, 0.9)),
    "a request landing after its caller gave up": Bounds(invocations=2, faults=0, crashes=1, advances=2, late=1),
    "waits and their polls": Bounds(invocations=2, faults=1, crashes=0, advances=2, wait_s=5.0),
    "the in-progress floor": Bounds(invocations=2, faults=0, crashes=1, advances=2, floor_s=30),
    "backoffs near the deadline": Bounds(invocations=2, faults=1, crashes=0, advances=1, slow_s=(0.2, 0.6)),
}
BATCHES = {
    f"{kind} batches": Bounds(invocations=2, faults=1, crashes=1, advances=1, kind=kind, slow_s=(0.2,),
                              precheck=precheck)
    for kind, precheck in (("sqs", "auto"), ("fifo", "auto"), ("dup", "auto"), ("kinesis", "always"),
                           ("kafka", "auto"))
}
# Durable executions (IDEMPOTENCY_DURABLE=execution): an execution's lease held across its invocations (each
# after the one before ended: its wait, a failure, a death), its envelope replayed to a later invocation of it and
# to another execution of the same input, completions and releases that do not land (outages), the execution
# timeout and the lease's end.
DURABLE = {
    "durable: one execution's invocations, a fault, a crash, an outage": Bounds(
        kind="durable", invocations=1, faults=1, crashes=1, advances=2, outages=1),
    "durable: one execution's request landing late, an outage": Bounds(
        kind="durable", invocations=1, faults=1, crashes=0, advances=1, late=1, outages=1),
    "durable: two executions of one input, a crash, a clock jump": Bounds(
        kind="durable", invocations=2, faults=0, crashes=1, advances=1, attempts=2),
    "durable: two executions of one input, a fault, an outage": Bounds(
        kind="durable", invocations=2, faults=1, crashes=0, advances=0, outages=1),
    "durable: two executions, the lease's end, skewed clocks": Bounds(
        kind="durable", invocations=2, faults=0, crashes=0, advances=2, attempts=2, skew_s=(0.0, 0.9)),
}
DURABLE_DEEP = {
    "durable: two executions of one input, a crash": Bounds(
        kind="durable", invocations=2, faults=0, crashes=1, advances=0),
    "durable: two executions, three invocations each, a crash, a clock jump": Bounds(
        kind="durable", invocations=2, faults=0, crashes=1, advances=1),
    "durable: two executions, the lease's end, skewed clocks, three invocations each": Bounds(
        kind="durable", invocations=2, faults=0, crashes=0, advances=2, skew_s=(0.0, 0.9)),
    "durable: two executions, a purge": Bounds(kind="durable", invocations=2, faults=0, crashes=0, advances=1,
                                               purges=1),
    "durable: two executions, a fault, a crash, an outage": Bounds(
        kind="durable", invocations=2, faults=1, crashes=1, advances=0, attempts=2, outages=1),
}
CI: dict[str, tuple[Bounds, int]] = {
    **{name: (bounds, 0) for name, bounds in WHOLE.items()},
    **{f"{kind} batches, one record": (Bounds(invocations=2, faults=1, crashes=1, advances=1, kind=kind, records=1),
                                       0) for kind in ("sqs", "kinesis", "kafka")},
    **{name: (bounds, 1500) for name, bounds in BATCHES.items()},
    **{name: (bounds, 0) for name, bounds in DURABLE.items()},
}
DEEP: dict[str, tuple[Bounds, int]] = {
    **{name: (bounds, 0) for name, bounds in WHOLE.items()},
    "three copies, a crash": (Bounds(invocations=3, faults=0, crashes=1, advances=0), 0),
    "three copies, a fault": (Bounds(invocations=3, faults=1, crashes=0, advances=1), 0),
    "two copies, two faults, two crashes": (Bounds(invocations=2, faults=2, crashes=2, advances=2), 0),
    **{f"{kind} batches, exhaustive": (Bounds(invocations=2, faults=1, crashes=0, advances=0, kind=kind), 0)
       for kind in ("sqs", "fifo", "dup", "kinesis", "kafka")},
    **{name: (bounds, 20000) for name, bounds in BATCHES.items()},
    **{name: (bounds, 0) for name, bounds in {**DURABLE, **DURABLE_DEEP}.items()},
}


def search(bounds: Bounds, walks: int) -> int:
    """One search: every history within `bounds` (walks=0), or that many random walks; how many histories."""
    return (walk(bounds, walks) if walks else explore(bounds))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deep", action="store_true", help="every search of DEEP (about an hour)")
    parser.add_argument("--ci", action="store_true", help="every search of the suite's slice")
    parser.add_argument("--only", default="", help="with --ci or --deep: the searches whose name contains this")
    parser.add_argument("--walks", type=int, default=0, help="random walks instead of the whole search")
    parser.add_argument("--kind", default="whole", choices=("whole", "sqs", "fifo", "dup", "kinesis", "kafka",
                                                                 "durable"))
    parser.add_argument("--invocations", type=int, default=3)
    parser.add_argument("--faults", type=int, default=1)
    parser.add_argument("--crashes", type=int, default=1)
    parser.add_argument("--advances", type=int, default=2)
    parser.add_argument("--skew", type=float, nargs="*", default=[0.0], help="clock offsets in seconds")
    parser.add_argument("--environments", type=int, default=0, help="0: one per invocation")
    parser.add_argument("--cache", action="store_true")
    parser.add_argument("--records", type=int, default=2)
    parser.add_argument("--wait", type=float, default=0.0)
    parser.add_argument("--floor", type=int, default=0)
    parser.add_argument("--ttl", type=int, default=3600)
    parser.add_argument("--purges", type=int, default=0)
    parser.add_argument("--late", type=int, default=0)
    parser.add_argument("--precheck", default="auto", choices=("auto", "always", "never"))
    parser.add_argument("--slow", type=float, nargs="*", default=[], help="seconds before the deadline")
    parser.add_argument("--attempts", type=int, default=3, help="durable: invocations of each execution")
    parser.add_argument("--outages", type=int, default=0, help="completions or releases that do not land")
    options = parser.parse_args()
    if options.deep or options.ci:
        searches = {name: search for name, search in (DEEP if options.deep else CI).items() if options.only in name}
    else:
        searches = {"the given bounds": (Bounds(
            options.invocations, options.faults, options.crashes, options.advances, tuple(options.skew),
            options.environments, options.cache, options.kind, options.records, options.wait, options.floor,
            options.ttl, options.purges, options.late, options.precheck, slow_s=tuple(options.slow),
            attempts=options.attempts, outages=options.outages), options.walks)}
    total, began = 0, _real_time.monotonic()
    for name, (bounds, walks) in searches.items():
        started = _real_time.monotonic()
        count = search(bounds, walks)
        total += count
        how = f"{count} distinct histories of {walks} random walks" if walks else f"{count} histories (all)"
        print(f"{name}: {how}, no invariant broken ({_real_time.monotonic() - started:.1f} s)", flush=True)
    print(f"{len(searches)} searches, {total} histories, no invariant broken "
          f"({_real_time.monotonic() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
