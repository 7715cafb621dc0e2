"""One path for every plan: carries out what `sources.plan` decided, against the cycle.

    run(plan, event, context, inv)
      notes said; the plan's refusal raised (an HTTP request's answered 400)
      DURABLE  the handler, unclaimed
      EXECUTION  cycle.take as the execution (its ARN the owner) -> the handler, its answer settling the claim
                 (SUCCEEDED completes, FAILED releases, PENDING or a raise keeps it) | another execution's copy:
                 the stored result answered SUCCEEDED, the layer's refusal answered FAILED
      EVENT    no key: the handler, unguarded | cycle.run: claim, handler, complete or release; or replay
      HTTP     the same, with the request's results and keep rule; the layer's errors answered as problems
      BATCH    look up / pre-check -> claims (concurrent, the first store failure stops the rest)
               -> the ordering walk -> one handler call -> settle each record (sources.batch.settle)
               -> complete or release each -> the source's answer (sources.batch.respond)

Nothing here belongs to one invocation: what one needs arrives in `inv` (its time, its counts). What the executor
keeps for the environment's life is only what it has said once (`said`).
"""

from __future__ import annotations

import logging
from functools import partial

from . import codec
from .cycle import Claimed, Found
from .errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyError,
    IdempotencyKeyError,
    IdempotencyPayloadMismatchError,
    IdempotencyPersistenceLayerError,
)
from .log import fields
from .plan import BATCH, DURABLE, EXECUTION, HTTP, MISMATCH, REQUIRED
from .results import ExecutionResults
from .stores.protocol import Record

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .cycle import Cycle
    from .invocation import Invocation
    from .plan import Plan

logger = logging.getLogger("idempotency_layer")

EXECUTION_RESULTS = ExecutionResults()  # a durable execution's Result (stateless: one for every invocation)

# At most this many requests in flight for one batch: the transport's pool keeps this many connections.
MAX_IN_FLIGHT = 10
SKIPPED = object()  # Pool.map's result for an item it never started, after a result that stops the rest


class Pool:
    """Runs calls concurrently on a few threads kept for the life of the environment, created on first use."""

    def __init__(self) -> None:
        self._threads: Any = None

    def map(self, fn: Callable[[Any], Any], items: list[Any], stop: Callable[[Any], bool] | None = None) -> list[Any]:
        """`fn` of each item, in order; an exception is returned in its item's place, never raised. Once a result
        satisfies `stop`, items not yet started are not: `SKIPPED` is in their place."""
        stopped = False

        def call(item: Any) -> Any:
            nonlocal stopped
            if stopped:
                return SKIPPED
            try:
                result = fn(item)
            except Exception as error:
                result = error
            if stop is not None and stop(result):
                stopped = True
            return result

        if len(items) <= 1:
            return [call(item) for item in items]
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor  # only functions fed batches pay for it

            self._threads = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="idempotency")
        return list(self._threads.map(call, items))


def _result_text(key: str, value: Any) -> str:
    """A stored result as a durable execution's `Result`: the JSON text an execution ended with (or the text the
    runtime sent for a whole event's run of the same key), or a value such a run stored, as JSON."""
    if isinstance(value, str):
        return value
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        raise IdempotencyKeyError(f"key {key!r} holds a result stored by a run that was not a durable execution's, "
                                  "which cannot be an execution's result") from None


def _fails_the_batch(claimed: Any) -> bool:
    """A claim's failure that fails the whole batch (the store's, the settings'), not only its record's."""
    return isinstance(claimed, Exception) and not isinstance(
        claimed, (IdempotencyAlreadyInProgressError, IdempotencyPayloadMismatchError)) and not _refused(claimed)


def _refused(claimed: Any) -> bool:
    """A completed record that failed its authentication (IDEMPOTENCY_RECORD_MAC_KEY): its batch record is
    reported failed, never taken as done, and the rest of the batch goes on."""
    return isinstance(claimed, IdempotencyPersistenceLayerError) and claimed.integrity


class Executor:
    """Carries out plans for one handler: `cycle` (the protocol), `handler` (the user's), `settings` (the
    configuration: key_jmespath, payload_jmespath, stream_checkpoint, fail_whole_batch), `value_results` (how
    HTTP responses are stored: as values, checked by the runtime's marshaller when there is one), `earlier` (for a
    whole event, the read of another tool's record of it, or None: a migration, `powertools.Reader`)."""

    def __init__(self, cycle: Cycle, handler: Callable[[Any, Any], Any], settings: Any,
                 value_results: Callable[[], Any] | None = None, pool: Pool | None = None,
                 earlier: Callable[[Any], Any] | None = None) -> None:
        self.cycle = cycle
        self.earlier = earlier
        self.handler = handler
        self.settings = settings
        self._value_results = value_results
        self._http_results: Any = None  # built for the first request that runs through the cycle
        self.pool = pool or Pool()
        self.said: set[str] = set()  # notes said once per environment

    def run(self, plan: Plan, event: Any, context: Any, inv: Invocation) -> Any:
        """What the invocation answers: the handler's value, a replay, or the layer's error (raised; an HTTP
        request's answered as a problem response)."""
        if plan.kind == DURABLE:
            return self._durable(event, context, inv)
        if plan.kind == EXECUTION:
            return self._execution(plan, event, context, inv)
        if plan.kind == HTTP:
            return self._request(plan, event, context, inv)
        if plan.kind == BATCH:
            return self._batch(plan, event, context, inv)
        return self._whole(plan, event, context, inv)

    def _say(self, plan: Plan, inv: Invocation) -> None:
        for note in plan.notes:
            if note.metric is not None:
                inv.count(note.metric)
            if note.once is not None:
                if note.once in self.said:
                    continue
                self.said.add(note.once)
            logger.log(note.level, "%s", note.message, extra=fields(note.key, note.outcome))

    def _durable(self, event: Any, context: Any, inv: Invocation) -> Any:
        # A durable execution re-invokes its function many times by design (each replay with a new checkpoint
        # token): claiming those invocations would break it. Passed through, whatever the key settings.
        if "durable" not in self.said:
            self.said.add("durable")
            logger.info("a Lambda durable execution's invocation: passed through untouched (the layer never "
                        "claims durable executions; see the README's Durable functions)")
        inv.describe(DURABLE)
        inv.count("PassThroughs")
        return self.handler(event, context)

    def _execution(self, plan: Plan, event: Any, context: Any, inv: Invocation) -> Any:
        from .sources import durable

        results = EXECUTION_RESULTS
        unit = plan.units[0]
        inv.describe(EXECUTION, unit.key)
        if plan.refusal is not None:  # answered, not raised: a raise would have the service invoke it again
            logger.warning("%s", plan.refusal, extra=fields(None, "not_claimed"))
            return durable.failed(plan.refusal)
        self._say(plan, inv)
        key = unit.key
        if key is None:
            inv.count("PassThroughs")
            return self.handler(event, context)
        try:
            taken = self.cycle.take(inv, key, unit.fingerprint, owner=plan.execution)
            if isinstance(taken, codec.Encoded):
                return durable.succeeded(_result_text(key, self.cycle.keeper.decode(key, taken, results)))
            if isinstance(taken, Found):
                return durable.succeeded(_result_text(key, self.cycle.keeper.replay(taken.record, results)))
        except IdempotencyPersistenceLayerError:
            raise  # the store could not be used: the service invokes the execution again, nothing ran
        except IdempotencyError as error:
            # Another execution with this key, or a result that cannot be handed back: this execution fails, and
            # its delivery is retried or dead-lettered by its source; nothing of the workflow runs.
            return durable.failed(error)
        inv.count("OwnerInvocations" if taken.held else "FirstExecutions")
        answer = self.handler(event, context)  # a raise keeps the claim: the service invokes the execution again
        self._settle(inv, key, taken.owner, answer, results, unit.fingerprint)
        return answer

    def _settle(self, inv: Invocation, key: str, owner: str, answer: Any, results: Any,
                fingerprint: str | None = None) -> None:
        """The execution's claim follows its answer: SUCCEEDED completes it with the result text, FAILED releases
        it, PENDING keeps it for the execution's next invocation. A completion or a release that did not land
        fails the invocation instead of answering: the service invokes the execution again, its steps replay
        from their checkpoints, and the write is made then (an answer would end the execution, its key claimed
        until the lease ends)."""
        from .sources import durable

        state = durable.status(answer)
        text = answer.get("Result") if state == durable.SUCCEEDED else None
        if state == durable.FAILED:
            if not self.cycle.release(inv, key, owner):
                raise IdempotencyPersistenceLayerError(
                    f"releasing key {key!r} after its durable execution failed did not succeed; this invocation "
                    "fails so that the service invokes the execution again and the release is made then")
        elif state == durable.SUCCEEDED and (text is None or isinstance(text, str)):
            result = self.cycle.keeper.encode(inv, key, text, results)[1]
            inv.count("ExecutionsCompleted")
            if not self.cycle.complete(inv, key, owner, result, fingerprint):
                raise IdempotencyPersistenceLayerError(
                    f"completing key {key!r} after its durable execution succeeded did not succeed; this invocation "
                    "fails so that the service invokes the execution again, which replays its steps from their "
                    "checkpoints, and the completion is made then")
        elif state != durable.PENDING:
            logger.warning("the handler answered a durable execution's invocation with no Status SUCCEEDED, FAILED "
                           "or PENDING, or a Result that is not text; key %r stays claimed for the execution", key,
                           extra=fields(key))

    def _whole(self, plan: Plan, event: Any, context: Any, inv: Invocation) -> Any:
        if plan.refusal is not None:
            raise plan.refusal
        self._say(plan, inv)
        unit = plan.units[0]
        if unit.key is None:
            inv.count("PassThroughs")
            return self.handler(event, context)
        inv.describe("event", unit.key)
        earlier = None if self.earlier is None else self.earlier(event)
        return self.cycle.run(inv, unit.key, partial(self.handler, event, context), unit.fingerprint,
                              earlier=earlier).value

    def _request(self, plan: Plan, event: Any, context: Any, inv: Invocation) -> Any:
        from .sources import http

        inv.describe(HTTP)
        request = plan.request
        request_id = getattr(context, "aws_request_id", None)
        if plan.refusal is not None:
            required = plan.units[0].refused == REQUIRED
            return http.refuse(request, plan.refusal, required, self.settings.key_header, request_id)
        self._say(plan, inv)
        unit = plan.units[0]
        key = unit.key
        if key is None:
            inv.count("PassThroughs")
            return self.handler(event, context)
        if self._http_results is None:
            from .results import value_results

            self._http_results = (self._value_results or value_results)()
        values = self._http_results
        # A payload 2.0 value without a statusCode is stored in the explicit form API Gateway made of it: its body
        # is the text the runtime sent the first time, whatever a later runtime's marshaller would write.
        results = values.shaped(lambda value, text: http.explicit(request, value, lambda _: text))
        inv.describe(HTTP, key)
        earlier = None if unit.previous is None else self._previous(inv, request, unit, results)
        try:
            outcome = self.cycle.run(inv, key, partial(self.handler, event, context), unit.fingerprint,
                                     results=results, keep=partial(self._keeps, request, key), earlier=earlier)
        except IdempotencyError as error:
            return http.answer(request, error, key, self.settings.payload_jmespath, request_id)
        if not outcome.replayed:
            return outcome.value
        return http.mark_replayed(request, outcome.value, values.text)  # text: for an earlier version's record

    def _previous(self, inv: Any, request: Any, unit: Any, results: Any) -> Callable[[Any], Any]:
        """The read of the record under the request's previous key (`previous.reader`): a stored response that
        sets a cookie for an anonymous caller is as none, since this version would not have stored it; with
        IDEMPOTENCY_RECORD_MAC_KEY, a completed one is authenticated before it is decoded, as every record is."""
        from .previous import reader
        from .sources import http

        def withheld(response: Any) -> bool:
            return (not self.settings.http_anonymous_shared and http.sets_cookie(request, response)
                    and http.anonymous(request, self.settings.caller_headers))

        cycle = self.cycle
        return reader(cycle.store, cycle.keeper, unit.previous, unit.fingerprint, results, cycle.clock, withheld,
                      partial(cycle.authenticate, inv))

    def _keeps(self, request: Any, key: str, response: Any) -> bool:
        """Whether the handler's `response` to `request` is stored: not a server error (`http.storable`), and no
        cookie set for an anonymous caller (under IDEMPOTENCY_HTTP_ANONYMOUS=separate): every caller the request
        does not tell apart shares the key's scope, so a stored cookie would be replayed to another one."""
        from .sources import http

        if not http.storable(request, response, key):
            return False
        if (self.settings.http_anonymous_shared or not http.sets_cookie(request, response)
                or not http.anonymous(request, self.settings.caller_headers)):
            return True
        if "anonymous cookie" not in self.said:
            self.said.add("anonymous cookie")
            logger.warning("a response that sets a cookie (Set-Cookie, or payload 2.0's cookies) to a caller the "
                           "request does not name (no authorizer, none of IDEMPOTENCY_CALLER_HEADERS) is not "
                           "stored: it would be replayed to anyone sending the same key, so a retry runs again; name "
                           "the caller (an authorizer, or IDEMPOTENCY_CALLER_HEADERS), or set "
                           "IDEMPOTENCY_HTTP_ANONYMOUS=shared (said once per environment)",
                           extra=fields(key, "released"))
        return False

    # -- batches ------------------------------------------------------------------------------------------------

    def _batch(self, plan: Plan, event: Any, context: Any, inv: Invocation) -> Any:
        from .sources import batch as rules

        batch = plan.batch
        inv.describe(BATCH, records=len(batch.records))
        self.cycle.check()
        self._say(plan, inv)
        if self.earlier is not None and "powertools batch" not in self.said:
            self.said.add("powertools batch")
            logger.warning("IDEMPOTENCY_POWERTOOLS_HANDLER reads Powertools' records of whole events only: this "
                           "batch's records are claimed one by one and Powertools' record of the batch is not read "
                           "(to keep it, set IDEMPOTENCY_SCOPE=event while Powertools' records live; see "
                           "docs/powertools.md)")
        if plan.refusal is not None:
            raise plan.refusal
        owners, done, busy = self._claims(plan, inv)
        passed, stopped, copies = self._walk(plan, done, busy)
        passed_keys = {plan.units[index].key for index in passed} - {None}
        self._release(inv, [(key, owner) for key, owner in owners.items() if key not in passed_keys])  # FIFO's
        owned = [(key, owners[key]) for key in owners if key in passed_keys]
        inv.counts(FirstExecutions=len(owned), PassThroughs=sum(plan.units[i].key is None for i in passed))
        value: Any = None
        failed = stopped
        if passed:
            try:
                value = self.handler(batch.narrowed(event, passed), context)
            except BaseException:
                self._release(inv, owned)
                raise
            reported = rules.handler_failures(value, batch.identifiers, batch.source.response)
            if reported is None:
                logger.error("%s", rules.invalid_answer(batch), extra=fields(None, "released"))
                self._release(inv, owned)
                if self.settings.fail_whole_batch:  # a mapping that ignores the answer would count it as done
                    raise rules.incomplete(batch)
                return value
            failed_keys, failed, note = rules.settle(plan, passed, copies, stopped, reported,
                                                     self.settings.stream_checkpoint)
            if note is not None:
                logger.info("%s", note, extra=fields(None, "released"))
            prints = ({} if self.cycle.mac is None else  # what a record's MAC covers: each key's claim fingerprint
                      {unit.key: unit.fingerprint for unit in plan.units if unit.first is None})
            self._complete(inv, [(key, owner) for key, owner in owned if key not in failed_keys], prints)
            self._release(inv, [(key, owner) for key, owner in owned if key in failed_keys])
        return rules.respond(plan, value, bool(passed), failed, self.settings.fail_whole_batch)

    def _claims(self, plan: Plan, inv: Invocation) -> tuple[dict[str, str], set[str], set[str]]:
        """Each distinct key of the batch, looked up (one read for a redelivered batch) and claimed: (our owner
        token by key, the keys done, the keys busy: in progress elsewhere or used with another payload). A claim
        the store failed fails the batch: the claims not started yet are not sent (each carries the invocation's
        deadline, and 10 at a time the rest would hold the batch past it), and ours are released."""
        from .sources.redelivery import shows_redelivery

        first = {unit.key: unit for unit in plan.units
                 if unit.key is not None and not unit.refused and unit.first is None}
        mismatches = sum(unit.refused == MISMATCH for unit in plan.units)
        to_claim = list(first)
        # A redelivered batch's done records, read in one request: only the rest is claimed. A key this environment
        # completed (its local cache) is a sign of redelivery too; it is read like the others, so a purged record
        # runs again.
        redelivered = shows_redelivery(plan.batch.records) or self.cycle.keeper.holds_any(to_claim)
        found = self.cycle.precheck(inv, {key: first[key].fingerprint for key in to_claim}, redelivered)
        to_claim = [key for key in to_claim if key not in found]
        claims = self.pool.map(lambda key: self.cycle.claim(inv, key, first[key].fingerprint), to_claim,
                               stop=_fails_the_batch)
        owners: dict[str, str] = {}
        done: set[str] = set()
        busy: set[str] = set()
        replays = in_progress = 0
        failure: Exception | None = None
        for key, claimed in [*found.items(), *zip(to_claim, claims, strict=True)]:
            if isinstance(claimed, Claimed):
                owners[key] = claimed.owner
            elif isinstance(claimed, (Found, Record)):
                done.add(key)  # a completed record (the claim's, or the pre-check's)
                replays += 1
            elif isinstance(claimed, IdempotencyAlreadyInProgressError):
                logger.info("%s; its record is reported as failed", claimed, extra=fields(key, "in_progress"))
                busy.add(key)
                in_progress += 1
            elif isinstance(claimed, IdempotencyPayloadMismatchError):
                logger.warning("%s; its record is reported as failed", claimed, extra=fields(key, "mismatch"))
                busy.add(key)
                mismatches += 1
            elif _refused(claimed):
                busy.add(key)  # said and counted by the cycle
            elif claimed is not SKIPPED:
                failure = failure or claimed
        if failure is not None:
            # The table failed us (or the settings did) before any record ran: the whole batch comes back.
            self._release(inv, list(owners.items()))
            raise failure
        # Per distinct key; a key's later records in the batch share its first's outcome.
        inv.counts(Replays=replays, InProgressConflicts=in_progress, PayloadMismatches=mismatches)
        return owners, done, busy

    def _walk(self, plan: Plan, done: set[str], busy: set[str]) -> tuple[list[int], list[int], list[int]]:
        """The records in order: each passed to the handler, dropped as done, or reported as failed (it cannot run
        now, or an earlier record of its ordering group could not). (passed, failed, copies: later records of a
        passed key, which share its outcome)."""
        passed: list[int] = []
        failed: list[int] = []
        copies: list[int] = []
        stopped: set[Any] = set()  # ordering groups stopped at a record that cannot run now
        for unit in plan.units:
            index, key, group = unit.position, unit.key, unit.group
            if group in stopped or unit.refused or key in busy:
                failed.append(index)
                if group is not None:  # nothing after a record that cannot run now may run in its group
                    stopped.add(group)
            elif key is None:
                passed.append(index)
            elif key in done:
                continue
            elif unit.first is None:
                passed.append(index)
            else:
                copies.append(index)
        return passed, failed, copies

    def _complete(self, inv: Invocation, claims: list[tuple[str, str]], prints: dict[Any, str | None]) -> None:
        """Complete each claim as done; `prints`: the fingerprint each key was claimed with."""
        done = codec.Encoded(codec.DONE, None)
        self.pool.map(lambda claim: self.cycle.complete(inv, claim[0], claim[1], done, prints.get(claim[0])), claims)

    def _release(self, inv: Invocation, claims: list[tuple[str, str]]) -> None:
        self.pool.map(lambda claim: self.cycle.release(inv, *claim), claims)
