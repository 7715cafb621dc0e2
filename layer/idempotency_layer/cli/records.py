"""`show` and `purge`: a record as an operator reads it, and its deletion, conditioned on what was read."""

from __future__ import annotations

import sys
import time

from .. import codec
from ..errors import IdempotencyPersistenceLayerError
from ..stores import readable
from ..stores.protocol import COMPLETED
from .output import clean, said, when

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..record_mac import RecordMac
    from ..stores.protocol import Record, Store


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


def facts(record: Record, now: float, with_result: bool, bucket: Any = None,
          mac: RecordMac | str | None = None) -> dict[str, Any]:
    """What `show` says of `record`; with `with_result`, its result decoded, read (a result in the large-results
    bucket) through `bucket`, the setting's bucket or None, as a replay reads it. `mac`: under
    IDEMPOTENCY_RECORD_MAC_KEY its keys (`record_mac.keyed`), or why they could not be read; None without it. A
    completed record is then authenticated as a copy authenticates it, and the result of one that is not authentic,
    or was not checked, is never decoded."""
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
    withheld = None if mac is None else _authenticated(shown, record, mac)
    if result is not None and result.format.startswith(codec.STORED):
        shown["result_object"] = _stored_at(result, bucket)
    if with_result:
        shown["result"] = {"none": withheld} if withheld else _decoded(record.key, result, bucket)
    return shown


def _authenticated(shown: dict[str, Any], record: Record, mac: RecordMac | str) -> str | None:
    """Add to `shown` whether `record` is authentic (`authentic`: True, False, or None when not checked), and, for
    a live completed record that is not known to be, what copies do with it; why its result is withheld, or None."""
    fault, unchecked = None, None
    if record.status != COMPLETED:
        unchecked = "an in-progress claim is not sealed (it carries no result)"
    elif isinstance(mac, str):
        unchecked = mac
    else:
        fault = mac.fault(record)
    authentic = None if unchecked else fault is None
    shown.update(authentic=authentic, integrity_fault=fault, authentication_not_checked=unchecked)
    live = shown["state"] == "completed"
    if fault is not None:
        if live:
            shown["meaning"] = (f"fails its authentication: {fault}; copies refuse it: HTTP 503, a batch record "
                                "reported failed")
        return f"withheld: the record is not authentic ({fault})"
    if unchecked is not None and record.status == COMPLETED:
        if live:
            shown["meaning"] = ("its authentication was not checked here, so whether copies use it or refuse it "
                                "(HTTP 503, a batch record reported failed) is not known")
        return "withheld: the record's authentication was not checked"
    if record.status != COMPLETED and record.result is not None:  # no claim of the layer's carries one
        return "withheld: an in-progress claim carries no result of the layer's, and it is not sealed"
    return None


def _stored_at(result: codec.Encoded, bucket: Any) -> dict[str, Any] | None:
    """Where a result in the large-results bucket is, as its pointer says (None: a pointer the layer cannot read)."""
    found: Any = readable(bucket).located(result)
    if found is None:
        return None
    return {"bucket": found.bucket, "key": found.object_key, "size": found.size, "sha256": found.sha256}


def _fetched(key: str, result: codec.Encoded, bucket: Any) -> codec.Encoded | dict[str, Any]:
    """The result the pointer of the record of `key` stands for, read and checked as a replay reads it (the
    bucket's `look`: a pointer outside the layer's bucket, prefix or size is not followed), or why it cannot be."""
    fetched = readable(bucket).look(key, result)
    if isinstance(fetched, codec.Encoded):
        return fetched
    problem, code = fetched
    return {"none": f"not shown: {clean(problem)}", "error": code}


def _decoded(key: str, result: codec.Encoded | None, bucket: Any = None) -> Any:
    if result is not None and result.format.startswith(codec.STORED):
        fetched = _fetched(key, result, bucket)
        if isinstance(fetched, dict):
            return fetched
        result = fetched
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
    if "authentic" in shown:  # IDEMPOTENCY_RECORD_MAC_KEY is set
        authentic = shown["authentic"]
        lines.append("authentic:         " + ("yes" if authentic else f"NO: {clean(shown['integrity_fault'])}"
                                              if authentic is False else
                                              f"not checked: {clean(shown['authentication_not_checked'])}"))
    if "result_object" in shown:
        found = shown["result_object"]
        lines.append("result object:     " + ("a pointer this layer cannot read" if found is None else
                                              f"{clean(_url(found['bucket'], found['key']))} "
                                              f"({found['size']} bytes, sha256 {found['sha256']})"))
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


def get(store: Store, key: str) -> Record | None:
    """The record of `key`, or None; an item that is not a layer record is refused in the CLI's words."""
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


def read(store: Store, key: str) -> Record:
    record = get(store, key)
    if record is None:
        raise Missing(f"no record for key {key!r} in {store.where}")
    return record


def purge(store: Store, key: str, *, yes: bool, force: bool, ask: Any = None,
          bucket: Any = None) -> dict[str, Any]:
    """Delete the record of `key`, unless it is a live claim (without `force`), the operator says no, or it
    changed since it was read: the delete is conditioned on the owner and status that were read. A result in the
    large-results bucket is deleted after the record, where its pointer says (`bucket`: the setting's, or None);
    a pointer to anything but this record's own object refuses the purge, unless `force` (the record alone)."""
    now = time.time()
    record = read(store, key)
    found = state(record, now)
    if found == "in progress" and not force:
        until = (when(record.in_progress_until, now, 1000) if record.in_progress_until is not None
                 else when(record.expires_at, now))
        raise Refused(f"key {key!r} is claimed by a live invocation until {said(until)}; its handler may be "
                      "running: wait for it, or pass --force to delete the claim anyway")
    target, left = _result_object(record, key, bucket, force)
    if not yes:
        also = "" if target is None else f" and its result {clean(_url(target.bucket, target.object_key))}"
        _confirm(f"delete the record of key {key!r} ({found}){also}? [y/N] ", key, ask)
    if not store.purge(key, record.status, record.owner):
        raise Refused(f"key {key!r} changed since it was read (another invocation claimed or completed it); "
                      "nothing was deleted: run purge again to see it")
    done = {"key": key, "deleted": True, "was": found, "status": record.status, "owner": record.owner}
    if target is not None:
        done["object"] = _delete(bucket, target)
    elif left is not None:
        done["object"] = left
    return done


def _confirm(prompt: str, key: str, ask: Any) -> None:
    if ask is None and not sys.stdin.isatty():
        raise Refused("not on a terminal, so purge cannot ask: pass --yes to delete without asking")
    try:
        answer = (ask or input)(prompt)
    except EOFError:  # Ctrl-D: no answer is a no
        answer = ""
        sys.stdout.write("\n")  # end the prompt's line
    if answer.strip().lower() not in ("y", "yes"):
        raise Refused(f"not deleted: key {key!r}")


def _url(bucket: str | None, object_key: str) -> str:
    """An object as `s3://bucket/key`, for the operator (a pointer that names no bucket: the setting's)."""
    return f"s3://{bucket or '(IDEMPOTENCY_LARGE_RESULTS_BUCKET)'}/{object_key}"


def _result_object(record: Record, key: str, bucket: Any, force: bool) -> tuple[Any, dict[str, Any] | None]:
    """The pointer of the object to delete with the record (None: none), or, under `force`, what is left and why.
    Only the object the layer writes for this record is deleted: in the setting's bucket or one on the read
    allow-list, `<prefix><key>/<32 hex>` (or its legacy form) of the record's owner (the bucket's `confinement` and
    `owns`); a malformed pointer, or one naming anything else, refuses the purge before anything is deleted."""
    result = record.result
    if result is None or not result.format.startswith(codec.STORED):
        return None, None
    found: Any = readable(bucket).located(result)
    if found is None:
        return _left(key, force, None, "its result's pointer is not one this layer writes")
    where = clean(_url(found.bucket, found.object_key))
    if bucket is None:
        return _left(key, force, found, f"its result is in {where}, and IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set "
                                        "here, so purge cannot delete it")
    # Only the layer's own form, as a replay follows it (the bucket, `<prefix><key>/<32 hex>`, the size), and
    # that run's: the record's owner.
    problem = bucket.confinement(found, key)
    if problem is None and not bucket.owns(found, key, record.owner):
        problem = "its object is not the one the record's own run wrote"
    if problem is not None:
        return _left(key, force, found, f"pointer outside the layer's prefix: {where}: {problem}; purge deletes "
                                        "no other object")
    return found, None


def _left(key: str, force: bool, found: Any, problem: str) -> tuple[None, dict[str, Any]]:
    """A record whose object purge will not delete: refused, or under `force` the record alone, saying why."""
    if not force:
        raise Refused(f"key {key!r}: {problem}; nothing was deleted (pass --force to delete the record alone and "
                      "leave the object)")
    return None, {"bucket": None if found is None else found.bucket, "key": None if found is None else
                  found.object_key, "deleted": False, "forced": True, "reason": problem}


def _delete(bucket: Any, found: Any) -> dict[str, Any]:
    """Delete the object `found` names, in the bucket it names; what was deleted, or why it was not."""
    done = {"bucket": bucket.where(found).name, "key": found.object_key}
    try:
        bucket.discard(found)
    except IdempotencyPersistenceLayerError as error:
        maybe = " (it may have been deleted: the answer was lost)" if error.uncertain else ""
        return {**done, "deleted": False, "reason": f"{error}{maybe}"}
    return {**done, "deleted": True}


def object_said(found: dict[str, Any]) -> str:
    """What became of a purged record's object, for the text output."""
    if found["deleted"]:
        return f"deleted {clean(_url(found['bucket'], found['key']))}"
    if found.get("forced"):
        return f"left in place ({found['reason']})"
    return f"NOT deleted ({clean(found['reason'])})"  # S3's failure, which names the object
