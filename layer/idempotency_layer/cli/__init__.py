"""The operator CLI: `python -m idempotency_layer` or `idempotency-layer`.

    key --event FILE|-            the stored key(s) the layer derives for an event, or why there is none
    show KEY | --event FILE       a record: status, expiry, claim deadline, owner, result format and size
    purge KEY | --event FILE      delete a record so the next copy runs again
    doctor [--function NAME]      check settings, table, TTL, permissions (and a deployed function)

It reads the layer's own environment variables, validated as at init; options override them. Exit status:
0 done, 1 a negative answer (no key, no record, a record that fails its authentication or whose authentication
could not be checked, a refusal, a failed check, a DynamoDB error, an unexpected error said in one line;
IDEMPOTENCY_CLI_TRACEBACK=1 shows its traceback), 2 a bad setting, option or event file.
The layer never imports this package, and it never imports the interceptor.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "idempotency-layer"


def _parser() -> argparse.ArgumentParser:
    from . import settings

    parser = argparse.ArgumentParser(prog=PROG, description="Operate the idempotency layer: derive keys, show and "
                                     "purge records, check a deployment. Settings come from the layer's "
                                     "environment variables; options override them.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    key = commands.add_parser("key", help="print the stored key(s) the layer derives for an event")
    key.add_argument("--event", required=True, metavar="FILE", help="the event as JSON ('-': standard input)")

    show = commands.add_parser("show", help="print a record")
    purge = commands.add_parser("purge", help="delete a record so the next copy of its event runs again")
    for sub in (show, purge):
        sub.add_argument("key", nargs="?", metavar="KEY", help="a stored key, as `key` prints it")
        sub.add_argument("--event", metavar="FILE", help="the record(s) of this event's key(s) instead")
    show.add_argument("--result", action="store_true",
                      help="also print the stored result, decoded: it may hold sensitive data")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purge.add_argument("--force", action="store_true", help="delete a live in-progress claim too, and a record "
                       "whose result pointer (S3) purge will not follow, leaving the object")

    doctor = commands.add_parser("doctor", help="check the settings, table, TTL and permissions")
    doctor.add_argument("--function", metavar="NAME", help="check this deployed function (its configuration and "
                        "event source mappings, with the Lambda API) and use its settings")
    doctor.add_argument("--layer-name", default="idempotency", metavar="TEXT",
                        help="text the layer's name contains (default: idempotency)")
    doctor.add_argument("--strict", action="store_true", help="a warning fails too")
    for sub in (key, show, purge, doctor):
        settings.add_options(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status. Expected failures print one line on stderr, no traceback."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # argparse's own usage errors (2) and --help (0)
        return stop.code if isinstance(stop.code, int) else 2
    saved = dict(os.environ)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as error:  # a CLI run where the layer's dependencies are not importable
        from .settings import missing_module

        return _fail(missing_module(error), 2)
    except BrokenPipeError:  # `... | head`: the reader has gone; stop quietly, as other tools do
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the signal
    except Exception as error:  # a bug or an answer nothing foresaw: one line, unless asked for the traceback
        if os.environ.get("IDEMPOTENCY_CLI_TRACEBACK") == "1":
            raise
        message = " ".join(str(error).split())[:300]
        return _fail(f"unexpected error: {type(error).__name__}: {message} (IDEMPOTENCY_CLI_TRACEBACK=1 prints "
                     "the traceback)", 1)
    finally:  # the DynamoDB client reads its target from os.environ, where the options were put
        if os.environ != saved:
            os.environ.clear()
            os.environ.update(saved)


def _fail(message: str, status: int) -> int:
    sys.stderr.write(f"{PROG}: {message}\n")
    return status


def _run(args: Any) -> int:
    from ..errors import IdempotencyConfigurationError, IdempotencyError
    from . import settings
    from .derive import EventFileError
    from .records import Refused

    try:
        env = settings.environment(args)
        if args.command == "doctor":
            if args.function is not None and not args.function.strip():
                return _fail("doctor --function: the function name is empty", 2)
            return _doctor(args, env)
        config = settings.load(env, need_table=args.command != "key",
                               need_prefix=args.command == "key" or getattr(args, "key", None) is None)
        if args.command == "key":
            return _key(args, config)
        if (args.key is None) == (args.event is None):
            return _fail(f"{args.command}: give either KEY or --event FILE", 2)
        keys, execution = ([args.key], None) if args.key is not None else _event_keys(args, config)
        try:
            store = settings.store(config, env)
        except Exception as error:
            problem = settings.client_problem(error, env)
            if problem is not None:
                return _fail(problem, 2)
            client = "the Valkey client" if config.store == "valkey" else "the DynamoDB client"
            return _fail(f"{client} could not be set up: {type(error).__name__}: {error}", 1)
        # The large-results bucket (IDEMPOTENCY_LARGE_RESULTS_BUCKET), for the results kept there, or None.
        bucket = settings.bucket(config) if args.command == "purge" or args.result else None
        if args.command == "show":
            return _show(args, store, keys, execution, bucket, _keys(config, env, store))
        return _purge(args, store, keys, bucket)
    except IdempotencyConfigurationError as error:
        return _fail(str(error), 2)
    except EventFileError as error:
        return _fail(str(error), 2)
    except Refused as error:
        return _fail(str(error), 1)
    except IdempotencyError as error:  # the store, the role, the network: the protocol's errors
        return _fail(str(error), 1)


def _event_keys(args: Any, config: Any) -> tuple[list[str], str | None]:
    """The event's keys, and the durable execution it is the envelope of (IDEMPOTENCY_DURABLE=execution)."""
    from .derive import derive, keys_of, read_event
    from .records import Refused

    facts = derive(config, read_event(args.event))
    found = keys_of(facts)
    if not found:
        reasons = [facts["error"]] if facts.get("error") else [entry["reason"] for entry in facts["entries"]]
        raise Refused(f"the event has no key: {reasons[0] if reasons else 'an empty batch'}")
    return found, facts.get("execution")


def _key(args: Any, config: Any) -> int:
    from .derive import derive, keys_of, read_event, text
    from .output import emit

    facts = derive(config, read_event(args.event))
    facts["keys"] = keys_of(facts)
    emit(facts, args.json, text)
    return 0 if facts["keys"] else 1


def _keys(config: Any, env: dict[str, str], store: Any) -> Any:
    """IDEMPOTENCY_RECORD_MAC_KEY's record MAC for `store`, its keys read as init reads them (`record_mac.keyed`),
    or the reader's error (which never holds a key); None without the setting."""
    from ..errors import IdempotencyConfigurationError

    if not config.record_mac_sources:
        return None
    from ..record_mac import keyed

    try:
        return keyed(config, env, store.identity)
    except IdempotencyConfigurationError as error:
        return str(error)


def _show(args: Any, store: Any, keys: list[str], execution: str | None = None, bucket: Any = None,
          mac: Any = None) -> int:
    """Each record of `keys`; exit 1 when one is missing, fails its authentication or could not be checked
    (`mac`: the record MAC, why its keys could not be read, or None without IDEMPOTENCY_RECORD_MAC_KEY)."""
    import time

    from .output import emit
    from .records import facts, get, show_text

    shown, missing = [], []
    for key in keys:
        record = get(store, key)
        if record is None:
            missing.append(key)
        else:
            shown.append(facts(record, time.time(), args.result, bucket, mac))
            if execution is not None:  # the envelope of a durable execution: does that execution hold the key?
                shown[-1]["this_execution_owns_it"] = record.owner == execution

    def text(found: dict[str, Any]) -> list[str]:
        lines: list[str] = []
        for record in found["records"]:
            lines += ([""] if lines else []) + show_text(record)
        return lines

    emit({"table": store.name, "records": shown, "missing": missing}, args.json, text)
    for key in missing:
        _fail(f"no record for key {key!r} in {store.where}", 1)
    forged = [said for said in shown if said.get("authentic") is False]
    for said in forged:
        _fail(f"key {said['key']!r}: the completed record fails its authentication ({said['integrity_fault']}; "
              "IDEMPOTENCY_RECORD_MAC_KEY): copies refuse it, and its result is not shown", 1)
    unchecked = isinstance(mac, str) and any(said["status"] == "COMPLETED" for said in shown)
    if unchecked:
        _fail(f"{mac}; so the records' authentication was not checked", 1)
    return 1 if missing or forged or unchecked else 0


def _purge(args: Any, store: Any, keys: list[str], bucket: Any = None) -> int:
    """Every key is tried, whatever became of the ones before it (an event's records: one may have none, one be
    live): each deleted one is said on stdout, each other on stderr; exit 1 unless every one was deleted."""
    from ..errors import IdempotencyError
    from .output import emit
    from .records import Missing, Refused, object_said, purge

    deleted: list[dict[str, Any]] = []
    missing: list[str] = []
    refused: list[dict[str, str]] = []
    for key in keys:
        try:
            deleted.append(purge(store, key, yes=args.yes, force=args.force, bucket=bucket))
        except Missing:
            missing.append(key)
        except (Refused, IdempotencyError) as error:
            refused.append({"key": key, "reason": str(error)})
    emit({"table": store.name, "deleted": deleted, "missing": missing, "refused": refused}, args.json,
         lambda found: [f"deleted the record of key {d['key']} (it was {d['was']})"
                        + (f"; its result: {object_said(d['object'])}" if d.get("object") else "")
                        for d in found["deleted"]])
    for key in missing:
        _fail(f"no record for key {key!r} in {store.where}: nothing to delete", 1)
    for entry in refused:
        _fail(entry["reason"], 1)
    # A record deleted whose object S3 did not delete: said, and not a success (nothing else will name the object).
    left = [d for d in deleted if d.get("object") and not d["object"]["deleted"] and not d["object"].get("forced")]
    for done in left:
        _fail(f"key {done['key']!r}: the record was deleted, but its result was {object_said(done['object'])}; "
              "delete that object yourself, or leave it to its bucket's lifecycle rule", 1)
    return 1 if missing or refused or left else 0


def _doctor(args: Any, env: dict[str, str]) -> int:
    from . import doctor
    from .output import emit

    checks = doctor.run(args, env)
    failed = sum(check.status == doctor.FAIL or (args.strict and check.status == doctor.WARN) for check in checks)
    # Under --strict a warning is counted once, as failed.
    facts = {"checks": [check._asdict() for check in checks], "failed": failed,
             "warned": 0 if args.strict else sum(check.status == doctor.WARN for check in checks),
             "passed": sum(check.status == doctor.PASS for check in checks)}
    emit(facts, args.json, doctor.text)
    return 1 if failed else 0
