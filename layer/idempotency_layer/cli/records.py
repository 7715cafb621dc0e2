"""`show` and `purge`: a record as an operator reads it, and its deletion, conditioned on what was read."""

from __future__ import annotations

import sys
import time

from .. import codec
from ..store import COMPLETED
from .output import clean, said, when

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..store import DynamoDBStore, Record


class Refused(Exception):
    """The command did not do what was asked, for a reason it states (exit status 1)."""


class Missing(Refused):
    """No record for the key."""


def state(record: Record, now: float) -> str:
    """The record as the layer's next copy of the key would judge it."""
    if record.is_expired(now):
        return "expired"  # the layer treats it as absent; TTL deletes it in time
    if record.status == COMPLETED:
        return "completed"
    return "in progress (claim expired)" if record.is_claim_expired(now) else "in progress"


_MEANING = {
    "expired": "the next copy runs the handler again (the store deletes the record in time: DynamoDB's TTL, the "
               "Valkey server's expiry)",
    "completed": "copies replay the stored result",
    "completed (too large)": "the result was too large to store: copies raise IdempotencyResultTooLargeError "
                             "and the handler does not run",
    "completed (undeliverable)": "the runtime could not send the handler's result: copies raise "
                                 "IdempotencyResultUndeliverableError and the handler does not run (purge to run "
                                 "it again)",
    "completed (batch record)": "a batch record keeps no result: copies of the record are skipped (reported done, "
                                "the handler does not see them)",
    "in progress": "a live claim: copies get IdempotencyAlreadyInProgressError (or wait) until it ends",
    "in progress (claim expired)": "the claim's invocation is over: the next copy takes it over and runs",
}


def _meaning(found: str, result: codec.Encoded | None) -> str:
    if found == "completed" and result is not None and result.format == codec.TOO_LARGE:
        return "completed (too large)"
    if found == "completed" and result is not None and result.format == codec.UNDELIVERABLE:
        return "completed (undeliverable)"
    if found == "completed" and result is not None and result.format == codec.DONE:
        return "completed (batch record)"
    return found


def facts(record: Record, now: float, with_result: bool) -> dict[str, Any]:
    result = record.result
    data = None if result is None else result.data
    size = None if data is None else len(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    found = state(record, now)
    shown: dict[str, Any] = {
        "key": record.key,
        "status": record.status,
        "state": found,
        "meaning": _MEANING[_meaning(found, result)],
        "expires_at": when(record.expires_at, now),
        # A completed record keeps its claim's deadline, which no longer means anything.
        "in_progress_until": None if record.in_progress_until is None or record.status == COMPLETED
        else when(record.in_progress_until, now, 1000),
        "owner": record.owner,
        "result_format": None if result is None else result.format,
        "result_bytes": size,
        "fingerprint": record.fingerprint,
    }
    if with_result:
        shown["result"] = _decoded(result)
    return shown


def _decoded(result: codec.Encoded | None) -> Any:
    if result is None:
        return {"none": "no result: the record is in progress"}
    if result.format == codec.DONE:
        return {"none": "no result: a batch record keeps none"}
    if result.format == codec.TOO_LARGE:
        return {"none": "no result: it was too large to store"}
    if result.format == codec.UNDELIVERABLE:
        return {"none": f"no result: the runtime could not send the handler's value (of type {clean(result.data)})"}
    from ..results import Values
    from .output import finite

    try:
        value = Values().decode(result)
    except Exception as error:
        return {"none": f"the stored result cannot be decoded ({type(error).__name__})"}
    try:
        return {"value": finite(value) if codec.has_non_finite(value) else value}
    except Exception as error:
        return {"none": f"the stored result cannot be decoded ({type(error).__name__})"}


def show_text(shown: dict[str, Any]) -> list[str]:
    lines = [
        f"key:               {clean(shown['key'])}",
        f"status:            {clean(shown['status'])} ({shown['state']}: {shown['meaning']})",
        f"expires:           {said(shown['expires_at'])}",
        f"in progress until: {said(shown['in_progress_until'])}",
        f"owner:             {clean(shown['owner'] or '-')}",
        "result:            " + ("-" if shown["result_format"] is None
                                  else f"{clean(shown['result_format'])}, {shown['result_bytes'] or 0} bytes stored"),
        f"fingerprint:       {clean(shown['fingerprint'] or '-')}",
    ]
    if "this_execution_owns_it" in shown:
        lines.append("this execution:    " + ("owns the key" if shown["this_execution_owns_it"]
                                              else "does not own the key (another run's record)"))
    if "result" in shown:
        decoded = shown["result"]
        if "value" in decoded:
            import json

            from .output import jsonable

            lines.append("result value:      " + json.dumps(decoded["value"], default=jsonable, ensure_ascii=False))
        else:
            lines.append(f"result value:      {decoded['none']}")
    return lines


def get(store: DynamoDBStore, key: str) -> Record | None:
    """The record of `key`, or None; an item that is not a layer record is refused in the CLI's words."""
    from ..errors import IdempotencyPersistenceLayerError

    try:
        return store.get(key)
    except IdempotencyPersistenceLayerError as error:
        if error.__cause__ is not None:  # DynamoDB's own failure: said as the store says it
            raise
        said_by_store = str(error)
        for tail in ("; the handler did not run", ", the handler did not run"):
            said_by_store = said_by_store.removesuffix(tail)
        raise Refused(f"{said_by_store}: it is not a record of this layer, so show and purge leave it alone"
                      ) from None


def read(store: DynamoDBStore, key: str) -> Record:
    record = get(store, key)
    if record is None:
        raise Missing(f"no record for key {key!r} in {store.where}")
    return record


def purge(store: DynamoDBStore, key: str, *, yes: bool, force: bool, ask: Any = None,
          bucket: Any = None) -> dict[str, Any]:
    """Delete the record of `key`, unless it is a live claim (without `force`), the operator says no, or it
    changed since it was read: the delete is conditioned on the owner and status that were read."""
    now = time.time()
    record = read(store, key)
    found = state(record, now)
    if found == "in progress" and not force:
        until = (when(record.in_progress_until, now, 1000) if record.in_progress_until is not None
                 else when(record.expires_at, now))
        raise Refused(f"key {key!r} is claimed by a live invocation until {said(until)}; its handler may be "
                      "running: wait for it, or pass --force to delete the claim anyway")
    if not yes:
        if ask is None and not sys.stdin.isatty():
            raise Refused("not on a terminal, so purge cannot ask: pass --yes to delete without asking")
        try:
            answer = (ask or input)(f"delete the record of key {key!r} ({found})? [y/N] ")
        except EOFError:  # Ctrl-D: no answer is a no
            answer = ""
            sys.stdout.write("\n")  # end the prompt's line
        if answer.strip().lower() not in ("y", "yes"):
            raise Refused(f"not deleted: key {key!r}")
    if not store.purge(key, record.status, record.owner):
        raise Refused(f"key {key!r} changed since it was read (another invocation claimed or completed it); "
                      "nothing was deleted: run purge again to see it")
    done = {"key": key, "deleted": True, "was": found, "status": record.status, "owner": record.owner}
    result = record.result
    if result is not None and result.format.startswith(codec.STORED):  # its result in the large-results bucket
        import json

        object_key = str(json.loads(result.data or "{}").get("key"))
        if bucket is None:
            done["object"] = (f"left in place: {object_key} (IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set here; the "
                              "bucket's lifecycle rule removes it)")
        else:
            from ..s3 import S3Error

            try:
                bucket.delete(object_key)
                done["object"] = f"deleted s3://{bucket.name}/{object_key}"
            except S3Error as error:  # the record is gone all the same: say which object stays
                done["object"] = (f"left in place: s3://{bucket.name}/{object_key} ({error}); the bucket's "
                                  "lifecycle rule removes it")
    return done
