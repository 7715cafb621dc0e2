"""The state machine: claim -> invoke -> complete or release, and replay.

It knows nothing of Lambda or of any store's backend: it is given a key, a way to invoke the handler, a `Store`
and the running `Invocation` (its time and its counts). `run` serves a whole event or a request; its steps
(`claim`, `complete`, `release`) serve batch records, whose one handler call covers many keys. `claim` answers one
type per outcome (`Claimed`, `Found`) or raises why it cannot (in progress, another payload, the store's failure).
Errors it raises carry the key, so a caller can map them to responses.

How a result is kept in its record and handed back is the `keeping.Keeper`'s; a batch's pre-check is
`precheck.Precheck`'s. What this environment learns once and keeps (`Environment`) is the only state that outlives
an invocation: a refusal to run any handler after a completion failed for good, and that the store refuses the
pre-check's read.
"""

from __future__ import annotations

import logging
import os
import time
from collections import namedtuple
from collections.abc import Callable

from . import codec
from .deadline import LAST_CHANCE_S, Backoff, Deadline
from .errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyClaimConflictError,
    IdempotencyPayloadMismatchError,
    IdempotencyPersistenceLayerError,
)
from .keeping import Keeper
from .keys import check_fingerprint
from .log import fields
from .results import Results, ValueResults
from .stores.protocol import COMPLETED, Record, Store

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

    from .invocation import Invocation
    from .record_mac import RecordMac

MAX_CLAIM_ATTEMPTS = 3
# A claim outlasts its invocation's deadline by this much. Whether a claim has expired is judged by the clock of
# the environment that wants to take it over; one whose clock runs ahead by up to this much still sees the
# claim live until the invocation that holds it has been stopped (tools/model.py finds a double run
# without it at 0.5 s of skew).
CLAIM_MARGIN_MS = 1000
# Waiting for another invocation's outcome: polls from 50 ms, doubling to 1 s, with jitter; and stop waiting
# while this much of the invocation is left, to claim, run or answer in.
POLLS, WAIT_MARGIN_MS = Backoff(0.05, 1.0), 1000
# Every request after the handler ran (its timeouts and retries included) ends this long before the
# invocation's deadline: an invocation timed out while completing is retried by its caller, and that copy
# runs the handler again if the write had not landed. Returning the result takes the runtime milliseconds.
RETURN_MARGIN_MS = 300
# A completion the table refused for a passing reason is retried from 100 ms, doubling to 2 s, with jitter,
# while a retry would start this long before the deadline (its attempt is cut at RETURN_MARGIN_MS): every
# completion that lands is a handler that no later copy runs again.
COMPLETE_RETRIES, COMPLETE_MARGIN_MS = Backoff(0.1, 2.0), RETURN_MARGIN_MS + 50
# Every claim (its retries and timeouts included, a batch's queued claims too) ends this long before the
# invocation's deadline: a table that does not answer fails the invocation closed with the store's error, which its
# caller sees and retries, instead of a timeout; and the withdraw or the batch's releases after it, which end by
# RETURN_MARGIN_MS, still have their time.
CLAIM_DEADLINE_MARGIN_MS = RETURN_MARGIN_MS + 200
# A handler that returns too late for any attempt by RETURN_MARGIN_MS still gets one completion attempt, ending
# this long before the deadline: a completion not made lets the next copy run the handler again, and one that
# makes the function time out is no worse (the write usually takes milliseconds, and may still land).
LATE_COMPLETE_MARGIN_MS = 50

logger = logging.getLogger("idempotency_layer")


def _requests_by(deadline: Deadline | None) -> Deadline | None:
    """When the requests of an invocation that ends at `deadline` must be done."""
    return None if deadline is None else deadline.earlier(RETURN_MARGIN_MS / 1000)


def _claim_by(deadline: Deadline) -> Deadline:
    """When the claim (or the read before it) of an invocation that ends at `deadline` must be done: never before
    now, so with less than the margin left it still gets one short attempt (LAST_CHANCE_S)."""
    return Deadline(max(deadline.at - CLAIM_DEADLINE_MARGIN_MS / 1000, time.monotonic()))


if TYPE_CHECKING:
    class _OutcomeFields(NamedTuple):
        value: Any
        replayed: bool
else:
    _OutcomeFields = namedtuple("Outcome", ("value", "replayed"))


class Outcome(_OutcomeFields):
    __slots__ = ()


if TYPE_CHECKING:
    class _ClaimedFields(NamedTuple):
        owner: str
        held: bool = False
else:
    _ClaimedFields = namedtuple("Claimed", ("owner", "held"), defaults=(False,))


class Claimed(_ClaimedFields):
    """`claim`'s answer when we hold the claim: our owner token, for the completion or the release; `held`: the
    live claim there was already this owner's (a durable execution invoked again, or our own write retried)."""
    __slots__ = ()


if TYPE_CHECKING:
    class _FoundFields(NamedTuple):
        record: Record
else:
    _FoundFields = namedtuple("Found", ("record",))


class Found(_FoundFields):
    """`claim`'s answer when the key is done: the live completed record (to replay, or a batch record's "done")."""
    __slots__ = ()


if TYPE_CHECKING:
    class _EarlierFields(NamedTuple):
        said: str
        completed: bool
        value: Any = None
        mismatch: bool = False
        ours: bool = False
else:
    _EarlierFields = namedtuple("Earlier", ("said", "completed", "value", "mismatch", "ours"),
                                defaults=(None, False, False))


class Earlier(_EarlierFields):
    """What a record another tool wrote says of a key this layer has just claimed (a migration): its result
    (`completed`), a live claim of its own, or a payload that differs (`mismatch`); `said` names that record.
    `ours`: the record is this layer's own, under the key the event had before an upgrade (`previous`): its
    result is kept as a handler's is (one too large for a record goes to the large-results bucket)."""
    __slots__ = ()


class Environment:
    """What this execution environment learned and keeps for its life, the cycle's only lasting state: `refusal`,
    set when a completion failed for a reason no retry can change (from then on no handler runs here, since no run
    could be recorded and every duplicate would run again); `precheck_denied`, set when the store refuses the
    pre-check's read, for want of a grant (batches are then claimed without it, as IDEMPOTENCY_BATCH_PRECHECK=never)."""

    __slots__ = ("precheck_denied", "refusal")

    def __init__(self) -> None:
        self.refusal: str | None = None
        self.precheck_denied = False


def _when(epoch_ms: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_ms / 1000))


def _still_running(inv: Invocation, key: str, started: float) -> IdempotencyAlreadyInProgressError:
    inv.count("WaitsTimedOut")
    return IdempotencyAlreadyInProgressError(
        f"another invocation is still running key {key!r} after waiting {time.monotonic() - started:.1f} s "
        "for it (IDEMPOTENCY_WAIT_SECONDS)"
    )


def _completion_failed(environment: Environment, inv: Invocation, key: str, error: IdempotencyPersistenceLayerError,
                       attempts: int) -> None:
    logger.error("completing key %r failed after %d attempt(s)%s; returning the result anyway: %s", key,
                 attempts, " (the request may have landed)" if error.uncertain else "", error, extra=fields(key))
    inv.count("CompletionFailures")
    if error.permanent:
        environment.refusal = (
            f"this execution environment runs no more handlers: completing key {key!r} failed for a reason "
            f"no retry can change ({error}); fix the table or the function's role, then redeploy"
        )
        logger.error("%s", environment.refusal, extra=fields(key))


_UNSEALED: dict[str, Any] = {}  # what `store.complete` is given beyond its arguments without a record MAC


def _sealing(mac: RecordMac, key: str, expires_at: int, owner: str, fingerprint: str | None) -> dict[str, Any]:
    """What `store.complete` is given beyond its arguments with a record MAC: the seal of the record it writes."""
    return {"seal": lambda stored: mac.seal(key, expires_at, owner, stored, fingerprint)}


def _authenticate(mac: RecordMac, inv: Invocation, record: Record) -> None:
    """Raise unless the completed `record` passes its MAC: never decoded, replayed or taken as done."""
    try:
        mac.check(record)
    except IdempotencyPersistenceLayerError as error:
        inv.count("RecordIntegrityFailures")
        logger.error("%s", error, extra=fields(record.key, "record_refused"))
        raise


class Cycle:
    """The protocol for one environment's handler: its store, its `keeper` (how results are kept, its local cache),
    its time settings and its `Environment`. Every method that serves an invocation is given it (`inv`)."""

    def __init__(self, store: Store, ttl_seconds: int, cache_size: int = 0, clock: Callable[[], float] = time.time,
                 results: Results | None = None, min_claim_ms: int = 0, wait_seconds: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep, precheck: str = "auto", bucket: Any = None,
                 mac: RecordMac | None = None) -> None:
        """`results`, `cache_size` and `bucket` (IDEMPOTENCY_LARGE_RESULTS_BUCKET, or None) are the `keeper`'s;
        `mac` (IDEMPOTENCY_RECORD_MAC_KEY, or None) seals completions, and every completed record must pass it."""
        self.store = store
        self.mac = mac
        self.keeper = Keeper(results or ValueResults(), bucket, cache_size, clock)
        self.precheck_mode = precheck  # IDEMPOTENCY_BATCH_PRECHECK: auto, always or never (config decided it)
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.min_claim_ms = min_claim_ms  # IDEMPOTENCY_IN_PROGRESS_SECONDS: a claim lasts at least this long
        self.wait_seconds = wait_seconds
        self.sleep = sleep
        self.environment = Environment()

    def run(self, inv: Invocation, key: str, invoke: Callable[[], Any], fingerprint: str | None = None,
            results: Results | None = None, keep: Callable[[Any], bool] | None = None,
            earlier: Callable[[Deadline], Earlier | None] | None = None) -> Outcome:
        """Run `invoke` once for `key`, or replay the result of the run that did.

        The claim lasts what `inv` had left when it started. A result that `results.encode` finds undeliverable is
        not stored, and the claim is released. `fingerprint`, when given, must match the one the key's record was
        claimed with. `results` overrides how this key's result is stored and handed back; a result `keep` refuses
        is handed back but not stored (the claim is released, so a retry runs again). `earlier`, once the claim is
        ours, reads what another tool's record says of the event (a migration): its result is replayed and kept as
        ours, its live claim or another payload refused, and the handler runs only when it says nothing.
        """
        results = results or self.keeper.results
        taken = self.take(inv, key, fingerprint)
        if isinstance(taken, codec.Encoded):
            return Outcome(self.keeper.decode(key, taken, results, _requests_by(inv.deadline)), True)
        if isinstance(taken, Found):
            return Outcome(self.keeper.replay(taken.record, results, _requests_by(inv.deadline)), True)
        claimed = taken
        if earlier is not None:
            replayed = self._earlier(inv, key, claimed.owner, earlier, results, fingerprint)
            if replayed is not None:
                return replayed
        inv.count("FirstExecutions")
        return Outcome(self._invoke(inv, key, claimed.owner, invoke, results, keep, fingerprint), False)

    def take(self, inv: Invocation, key: str, fingerprint: str | None = None,
             owner: str | None = None) -> Claimed | Found | codec.Encoded:
        """What serving `key` starts with: its result from the local cache (`codec.Encoded`), else the claim
        (`Claimed`, or `Found` with the completed record), waiting IDEMPOTENCY_WAIT_SECONDS on a live claim; every
        outcome counted. `owner`: the claim's owner token when the caller has one (a durable execution's ARN),
        else a random one; a record that owner completed is `Claimed` (`held`): the owner runs again, whatever
        its record holds. Raises what `claim` raises, the in-progress error once the wait is spent."""
        self.check()
        try:
            cached = self.cached(inv, key, fingerprint, owner)
            if cached is not None:
                inv.count("LocalCacheReplays")
                return cached
            try:
                claimed = self.claim(inv, key, fingerprint, owner=owner)
            except IdempotencyAlreadyInProgressError:
                if self.wait_seconds <= 0:
                    raise
                claimed = self._wait(inv, key, fingerprint, owner)
        except (IdempotencyAlreadyInProgressError, IdempotencyPayloadMismatchError) as error:
            in_progress = isinstance(error, IdempotencyAlreadyInProgressError)
            inv.count("InProgressConflicts" if in_progress else "PayloadMismatches")
            raise
        if isinstance(claimed, Found):
            if owner is not None and claimed.record.owner == owner:
                return Claimed(owner, True)
            inv.count("Replays")
        return claimed

    # -- the steps, for callers that run many keys around one handler call (batch records) ----------------

    def check(self) -> None:
        """Raise if this environment must run no handler at all."""
        if self.environment.refusal is not None:
            raise IdempotencyPersistenceLayerError(self.environment.refusal)

    def cached(self, inv: Invocation, key: str, fingerprint: str | None = None,
               owner: str | None = None) -> codec.Encoded | None:
        """The result of `key` from this environment's memory, once one consistent read without the result says
        its record is still the one completed with it (live, completed, the same owner: not purged, not run again
        elsewhere); else None, and the entry is dropped. A read that fails is None too: the claim decides, and so
        it does for a record `owner` completed (a durable execution invoked again runs).

        Raises `IdempotencyPayloadMismatchError` when the record was claimed with another fingerprint."""
        cache = self.keeper.cache
        entry = None if cache is None else cache.get(key, self.clock())
        if entry is None:
            return None
        result, completed_by = entry
        if owner is not None and completed_by == owner:
            return None  # (a read would not change that: the claim reads the record)
        try:
            with inv.timed:
                record = self.store.peek(key, _claim_by(inv.deadline))
        except IdempotencyPersistenceLayerError as error:
            logger.info("checking the cached record of key %r failed; claiming it instead: %s", key, error,
                        extra=fields(key))
            return None
        if (record is None or record.status != COMPLETED or record.owner != completed_by
                or record.is_expired(self.clock())):
            cache.drop(key)  # type: ignore[union-attr]
            return None
        check_fingerprint(key, record.fingerprint, fingerprint)
        return result

    def precheck(self, inv: Invocation, wanted: dict[str, str | None], redelivered: bool
                 ) -> dict[str, Record | IdempotencyPayloadMismatchError]:
        """The completed records among `wanted` (key -> the fingerprint its copy carries), read in one request per
        `READ_KEYS` keys (`precheck.Precheck.found`, which never raises), so a redelivered batch's done records cost
        no claim. Read when IDEMPOTENCY_BATCH_PRECHECK is `always`, or `auto` and the batch shows `redelivered`."""
        mode = "never" if self.environment.precheck_denied else self.precheck_mode
        if mode == "never" or (mode == "auto" and not redelivered) or len(wanted) < 2:
            return {}  # (one key: its claim answers a done record in one request too)
        from .precheck import Precheck

        return Precheck(self.store, self.environment, self.clock, self.sleep, self.mac).found(inv, wanted)

    def authenticate(self, inv: Invocation, record: Record) -> None:
        """Raise unless completed `record` passes the record MAC (IDEMPOTENCY_RECORD_MAC_KEY); nothing when unset."""
        if self.mac is not None:
            _authenticate(self.mac, inv, record)

    def claim(self, inv: Invocation, key: str, fingerprint: str | None = None,
              remaining_ms: int | None = None, owner: str | None = None) -> Claimed | Found:
        """Claim `key` for `inv`: `Claimed` with our owner token, or `Found` with the completed record there.

        The claim lasts `remaining_ms` (by default what `inv` had left when it started), and at least
        IDEMPOTENCY_IN_PROGRESS_SECONDS. `owner`: the owner token to claim as (default: a new random one); a live
        claim already this owner's is ours (`held`), never refused. Raises
        `IdempotencyPayloadMismatchError` when the live record there was claimed with another fingerprint, else
        `IdempotencyAlreadyInProgressError` when another invocation holds a live claim, else the store's error
        (a claim that may have landed is withdrawn first). Safe to call from several threads at once.
        """
        given = owner is not None
        owner = owner or os.urandom(16).hex()
        remaining = inv.remaining_ms if remaining_ms is None else remaining_ms
        try:
            record = self._claim(inv, key, owner, remaining, fingerprint)
        except IdempotencyPersistenceLayerError as error:
            if error.uncertain and not given:  # a given owner's live claim may be one an earlier invocation made
                self._withdraw(inv, key, owner)
            raise
        if isinstance(record, Record):
            return Found(record)
        return Claimed(owner, record)

    def _withdraw(self, inv: Invocation, key: str, owner: str) -> None:
        # The claim may have landed though it failed (its answer lost, a 5xx), and would block the key until the
        # deadline though the handler never ran. Deleting it under our own owner token is safe either way: it
        # deletes nothing of anyone else's. A claim still in flight may land after this, and then blocks.
        try:
            with inv.timed:
                withdrew = self.store.release(key, owner, _requests_by(inv.deadline))
            if withdrew:
                logger.warning("claiming key %r failed with an answer that leaves open whether it landed; withdrew "
                               "any claim of ours there", key, extra=fields(key, "store_error"))
        except Exception:
            logger.debug("withdrawing a claim on key %r that may have landed failed too", key,
                         extra=fields(key, "store_error"))

    def complete(self, inv: Invocation, key: str, owner: str, result: codec.Encoded,
                 fingerprint: str | None = None) -> bool:
        """Mark our claim on `key` completed with `result`: whether it landed (with the result, or without it when
        only that fits; `fingerprint`: the claim's, which the record's MAC covers). Never raises: the handler has
        run, and failing now would make the caller retry into a second run.

        Every attempt, the transport's own retries and timeouts included, ends `RETURN_MARGIN_MS` before the
        invocation's deadline. A failure a retry may cure (throttling, a 5xx, a lost connection) is retried with
        backoff while more than `COMPLETE_MARGIN_MS` would be left: an uncompleted claim lets the next copy after
        the invocation's deadline run the handler again. Retrying is safe: the write is conditioned on our owner
        token, so a retry of a write that landed lands again."""
        if isinstance(result, codec.Oversized):  # what it carried is not kept (nor held in the local cache)
            result = codec.Encoded(codec.TOO_LARGE, None)
        expires_at = int(self.clock()) + self.ttl_seconds
        deadline = inv.deadline
        last = _requests_by(deadline)
        assert last is not None
        if last.passed():
            # Under the usual bound an attempt starting now would get less than LAST_CHANCE_S, down to nothing
            # (a handler returning 201 ms before the deadline got 1 ms): it gets up to LAST_CHANCE_S instead,
            # ending LATE_COMPLETE_MARGIN_MS before the deadline at the latest (the transport gives an attempt
            # until `last + LAST_CHANCE_S`), so the time a completion gets never shrinks as the handler ends later.
            last = deadline.earlier(LATE_COMPLETE_MARGIN_MS / 1000 + LAST_CHANCE_S)
        retry_by = deadline.earlier(COMPLETE_MARGIN_MS / 1000)
        sealed = _UNSEALED if self.mac is None else _sealing(self.mac, key, expires_at, owner, fingerprint)
        attempt = 1
        while True:
            try:
                with inv.timed:
                    completed = self.store.complete(key, owner, result, expires_at, last, **sealed)
                break
            except IdempotencyPersistenceLayerError as error:
                pause = COMPLETE_RETRIES.delay(attempt)
                if error.permanent or not retry_by.allows(pause):
                    _completion_failed(self.environment, inv, key, error, attempt)
                    return False
                logger.warning("completing key %r failed (attempt %d), retrying in %.2f s: %s", key, attempt, pause,
                               error, extra=fields(key))
                inv.count("CompletionRetries")
                self.sleep(pause)
                attempt += 1
            except BaseException as error:  # not the store's word (a bug, MemoryError): complete without the result
                logger.error("completing key %r failed (%s); completing it without its result", key,
                             type(error).__name__, extra=fields(key))
                bare = result if result.data is None else codec.Encoded(codec.TOO_LARGE, None)
                try:
                    with inv.timed:
                        return bool(self.store.complete(key, owner, bare, expires_at, last, **sealed))
                except BaseException:
                    logger.error("completing key %r without its result failed too; it stays claimed until its "
                                 "deadline", key, extra=fields(key))
                    inv.count("CompletionFailures")
                return False
        if not completed:
            logger.error("claim on key %r was no longer ours at completion (it expired and was taken over, or the "
                         "record was deleted); returning our result", key, extra=fields(key))
            inv.count("CompletionFailures")
        elif self.keeper.cache is not None:
            self.keeper.cache.put(key, expires_at, result, owner)
        return bool(completed)

    def release(self, inv: Invocation, key: str, owner: str) -> bool:
        """Delete our claim on `key`, so a retry runs the handler again: False when the release failed (the claim
        may stay until it expires), True when no claim of ours is left. Never raises. Its requests end
        `RETURN_MARGIN_MS` before the invocation's deadline, so the handler's own error reaches the caller first."""
        released = "Releases"  # what the tally counts: a claim that stays is not a release
        try:
            with inv.timed:
                released_it = self.store.release(key, owner, _requests_by(inv.deadline))
            if not released_it:
                logger.warning("claim on key %r was taken over before release; left it alone", key,
                               extra=fields(key, "released"))
        except IdempotencyPersistenceLayerError as error:
            released = "ReleaseFailures"
            # The store's word names the request and the failure: no traceback to format, which costs milliseconds
            # a key when all of a batch's releases run out of time together, just before the deadline.
            logger.error("releasing key %r failed; %s: %s", key,
                         "the request may have landed, else it stays claimed until its deadline" if error.uncertain
                         else "it stays claimed until its deadline", error, extra=fields(key, "release_failed"))
        except Exception:
            released = "ReleaseFailures"
            logger.error("releasing key %r failed; it stays claimed until its deadline", key, exc_info=True,
                         extra=fields(key, "release_failed"))
        inv.count(released)
        return released == "Releases"

    # -- internals ----------------------------------------------------------------------------------------

    def _claim(self, inv: Invocation, key: str, owner: str, remaining_ms: int,
               fingerprint: str | None) -> Record | bool:
        """The completed record there, or whether the live claim was already `owner`'s (False: ours now)."""
        claim_by = _claim_by(inv.deadline)
        for _ in range(MAX_CLAIM_ATTEMPTS):
            now = self.clock()
            in_progress_until = int(now * 1000) + max(0, remaining_ms, self.min_claim_ms) + CLAIM_MARGIN_MS
            # A claim must not expire (and be taken) while its invocation may still be running.
            expires_at = max(int(now) + self.ttl_seconds, -(-in_progress_until // 1000))
            with inv.timed:
                record = self.store.claim(key, owner, now, in_progress_until, expires_at, fingerprint, claim_by)
            if record is None:
                return False
            if record.owner == owner and record.status != COMPLETED:
                # ours: the transport retried our own write, or the owner (a durable execution) is invoked again
                return True
            now = self.clock()
            if not record.is_expired(now):
                if self.mac is not None and record.status == COMPLETED:
                    _authenticate(self.mac, inv, record)  # before its fingerprint, which it covers, or any use
                if record.status == COMPLETED or not record.is_claim_expired(now):
                    check_fingerprint(key, record.fingerprint, fingerprint)  # before any replay or wait
                if record.status == COMPLETED:
                    return record
                if not record.is_claim_expired(now):
                    until = record.in_progress_until or record.expires_at * 1000
                    raise IdempotencyAlreadyInProgressError(
                        f"another invocation is running key {key!r}; its claim expires at {_when(until)}"
                    )
            # The table saw a live record that this clock sees as expired: claim again.
        raise IdempotencyClaimConflictError(
            f"claiming key {key!r} failed {MAX_CLAIM_ATTEMPTS} times on a record this clock sees as expired; "
            "the client clock and the table disagree"
        )

    def _wait(self, inv: Invocation, key: str, fingerprint: str | None, owner: str | None = None
              ) -> Claimed | Found:
        """Wait for the live claim on `key` to end: the completed record to replay, or our own claim once it was
        released or expired. Raises the in-progress error when the wait or the invocation runs out first."""
        started = time.monotonic()
        inv.count("Waits")
        # The wait ends when it is spent or WAIT_MARGIN_MS before the invocation's deadline, whichever is first;
        # every poll carries that point as its deadline, and none starts that it seems it could not finish by
        # then (judged by how long the last one took), so a slow table answers in-progress, not a timeout.
        wait_end = Deadline(started + min(self.wait_seconds, (inv.remaining_ms - WAIT_MARGIN_MS) / 1000))
        poll_s = 0.0  # how long the last poll took
        poll = 0
        while True:
            poll += 1
            left = wait_end.left() - poll_s
            if left <= 0:
                raise _still_running(inv, key, started)
            self.sleep(min(POLLS.delay(poll), left))  # the last poll ends as the wait ends
            polled = time.monotonic()
            try:
                with inv.timed:
                    record = self.store.get(key, wait_end)  # a consistent read
            except IdempotencyPersistenceLayerError:
                if wait_end.passed():  # cut by the wait's end: the claim was live when last seen
                    raise _still_running(inv, key, started) from None
                raise
            poll_s = time.monotonic() - polled
            now = self.clock()
            if record is not None and not record.is_expired(now):
                if self.mac is not None and record.status == COMPLETED:
                    _authenticate(self.mac, inv, record)
                check_fingerprint(key, record.fingerprint, fingerprint)
                if record.status == COMPLETED:
                    inv.count("WaitsReplayed")
                    return Found(record)
                if not record.is_claim_expired(now):
                    continue
            # Released or expired: claim it ourselves, for the time this invocation has left.
            left_ms = inv.remaining_ms - int((time.monotonic() - started) * 1000)
            try:
                claimed = self.claim(inv, key, fingerprint, left_ms, owner)
            except IdempotencyAlreadyInProgressError:
                continue  # another copy claimed it first: wait for that one
            inv.count("WaitsReplayed" if isinstance(claimed, Found) else "WaitsClaimed")
            return claimed

    def _earlier(self, inv: Invocation, key: str, owner: str, earlier: Callable[[Deadline], Earlier | None],
                 results: Results, fingerprint: str | None = None) -> Outcome | None:
        """What another tool's record says of the key we hold: None (run the handler), or its result, replayed
        and kept as ours. Anything else releases our claim: its live claim, another payload, a failed read."""
        try:
            with inv.timed:
                found = earlier(_claim_by(inv.deadline))
            if found is not None and not found.completed and not found.mismatch and self.wait_seconds > 0:
                found = self._wait_earlier(inv, earlier, found)
        except BaseException:
            self.release(inv, key, owner)  # it could not be read: whether it ran is unknown, so nothing runs
            raise
        if found is None:
            return None
        if not found.completed or found.mismatch:
            self.release(inv, key, owner)
            if found.mismatch:
                inv.count("PayloadMismatches")
                raise IdempotencyPayloadMismatchError(f"key {key!r}: {found.said} was written for another payload")
            inv.count("InProgressConflicts")
            raise IdempotencyAlreadyInProgressError(f"key {key!r}: {found.said} is in progress")
        if found.ours:
            delivered, result = self.keeper.encode(inv, key, found.value, results, owner, _requests_by(inv.deadline))
        else:
            delivered, result = self.keeper.adopt(found.value, results)
        self.complete(inv, key, owner, result, fingerprint)
        inv.count("Replays")
        logger.info("key %r: replayed %s, now kept as this layer's record", key, found.said,
                    extra=fields(key, "replay"))
        return Outcome(delivered, True)

    def _wait_earlier(self, inv: Invocation, earlier: Callable[[Deadline], Earlier | None],
                      found: Earlier) -> Earlier | None:
        """IDEMPOTENCY_WAIT_SECONDS for another tool's live claim, holding ours: its outcome once it has one, else
        the live claim as last read."""
        inv.count("Waits")
        wait_end = Deadline(time.monotonic() + min(self.wait_seconds, (inv.remaining_ms - WAIT_MARGIN_MS) / 1000))
        poll = 0
        while wait_end.left() > 0:
            poll += 1
            self.sleep(min(POLLS.delay(poll), wait_end.left()))
            with inv.timed:
                now: Earlier | None = earlier(wait_end)
            if now is None or now.completed or now.mismatch:
                inv.count("WaitsReplayed" if now is not None and now.completed else "WaitsClaimed")
                return now
        inv.count("WaitsTimedOut")
        return found

    def _invoke(self, inv: Invocation, key: str, owner: str, invoke: Callable[[], Any], results: Results,
                keep: Callable[[Any], bool] | None = None, fingerprint: str | None = None) -> Any:
        try:
            value = invoke()
        except BaseException:
            self.release(inv, key, owner)
            raise
        if keep is not None and not keep(value):
            self.release(inv, key, owner)  # e.g. an HTTP 5xx: the work did not complete, so a retry must run again
            return value
        # From here on the handler has run: every failure of ours ends in a completion, never a bare claim.
        delivered, result = self.keeper.encode(inv, key, value, results, owner, _requests_by(inv.deadline))
        self.complete(inv, key, owner, result, fingerprint)
        return delivered
