"""`key`: the stored key(s) the layer derives for an event, read from the layer's own plan of it (`sources.plan`), so
the answer cannot drift from the runtime's. Facts only: no event content is ever part of them."""

from __future__ import annotations

import json

from ..errors import IdempotencyKeyError
from ..keys import KeyDeriver
from ..plan import BATCH, DURABLE, EXECUTION, HTTP, MISMATCH, NO_FINGERPRINT, NO_KEY, REQUIRED, Plan, Unit
from ..sources import plan
from ..sources.durable import durable_target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..config import Config


class EventFileError(Exception):
    """The event file cannot be read or is not JSON."""


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)  # NaN, Infinity, -Infinity: Python's json reads them, the runtime does not


def read_event(path: str, stdin: Any = None) -> Any:
    """The event in `path` ('-': standard input), parsed as the runtime parses it (JSON)."""
    import sys

    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as file:
                text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else f"not UTF-8 text (at byte {error.start})"
        raise EventFileError(f"cannot read the event file {path!r}: {reason}") from None
    if text.startswith("\ufeff"):  # a byte order mark, which the runtime accepts
        text = text[1:]
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _NonFinite as error:
        raise EventFileError(f"the event file {path!r} holds {error} (not JSON): the runtime would refuse the "
                             "event with Runtime.UnmarshalError") from None
    except json.JSONDecodeError as error:  # its message names the place, never the content
        raise EventFileError(f"the event file {path!r} is not JSON: {error.msg} (line {error.lineno}, "
                             f"column {error.colno})") from None
    except RecursionError:
        raise EventFileError(f"the event file {path!r} is nested too deeply to parse") from None


def _no_key(config: Config, what: str) -> str:
    if config.require_key:
        return f"{what}, and IDEMPOTENCY_REQUIRE_KEY is true: the layer refuses it"
    return f"{what}: the layer runs it without idempotency (a pass-through)"


def derive(config: Config, event: Any) -> dict[str, Any]:
    """What the layer does with `event` under `config`, from the layer's own plan of it: the source that serves it
    and one entry per unit of work (the whole event, an HTTP request, each batch record), with its stored key or
    why it has none."""
    if config.disabled:
        return {"source": "disabled", "entries": [],
                "error": "IDEMPOTENCY_DISABLED is true: the runtime calls the handler directly, nothing is stored"}
    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    try:
        found = plan(config, keys, event)
    except IdempotencyKeyError as error:
        return {"source": "none", "entries": [], "error": str(error)}
    if found.kind == DURABLE:
        return {"source": "durable", "entries": [{"key": None, "reason": (
            "a Lambda durable execution's invocation: the layer never claims it (a pass-through)")}]}
    if found.kind == EXECUTION:
        entry = ({"key": None, "reason": f"{found.refusal} (the execution is answered FAILED)"}
                 if found.units[0].refused == NO_KEY else _whole(config, found))
        return {"source": "execution", "execution": found.execution,
                "rule": f"{rule(config, None)}, applied to the execution's input", "entries": [entry]}
    facts = _facts(config, found)
    target = durable_target(event)
    if target is not None and config.function_name is None:
        # The layer passes such an event through only as that function: without its name, say what it hinges on.
        facts["note"] = (f"the envelope of a durable execution of function {target[0]!r} in {target[1]}: the layer "
                         "passes it through, unclaimed, when it runs as that function there; pass --function-name "
                         "(and --region) to know")
    elif target is not None:
        facts["note"] = (f"the envelope of a durable execution of function {target[0]!r} in {target[1]}, not of "
                         f"this function ({config.function_name!r}"
                         + (f" in {config.region}" if config.region else "") + "): keyed as any other event")
    return facts


def _facts(config: Config, found: Plan) -> dict[str, Any]:
    if found.kind == HTTP:
        # The form and method only: a path, route or query can carry the very data a key must hide.
        return {"source": "http", "form": found.request.form, "method": found.request.method,
                "rule": rule(config, HTTP), "entries": [_request(config, found)]}
    if found.kind == BATCH:
        return {**_batch(config, found), "rule": rule(config, BATCH)}
    return {"source": "event", "rule": rule(config, None), "entries": [_whole(config, found)]}


def rule(config: Config, kind: str | None) -> str:
    """Where a key of `kind` (HTTP, BATCH, None: a whole event) comes from under `config`, and whether that is the
    key expression or a default."""
    expression = f"IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath!r}" if config.key_jmespath else None
    if kind == HTTP:
        return f"the {config.key_header} header" + (f", else {expression}" if expression else "")
    if kind == BATCH:
        return (f"{expression}, applied to each record" if expression
                else "each record's delivery identity (the default: IDEMPOTENCY_KEY_JMESPATH is unset or @)")
    return expression or "the whole event (the default: IDEMPOTENCY_KEY_JMESPATH is unset or @)"


def _whole(config: Config, found: Plan) -> dict[str, Any]:
    unit = found.units[0]
    nothing = f"IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath or '@'!r} selected nothing from the event"
    if unit.refused == REQUIRED or (unit.key is None and found.refusal is None):
        return {"key": None, "reason": _no_key(config, nothing)}
    if found.refusal is not None:
        return {"key": None, "reason": f"{found.refusal} (the handler does not run)"}
    return {"key": unit.key, "fingerprint": unit.fingerprint}


def _request(config: Config, found: Plan) -> dict[str, Any]:
    unit = found.units[0]
    if unit.key is not None:
        entry = {"key": unit.key, "fingerprint": unit.fingerprint}
        if unit.previous is not None:  # its key before the API and stage were part of keys, still read by a first run
            entry["previous_key"] = unit.previous
        return entry
    if found.refusal is not None and unit.refused != REQUIRED:
        return {"key": None, "reason": f"answered 400: {found.refusal}"}
    what = f"the request has no {config.key_header} header"
    if config.key_jmespath:
        what += f" and IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath!r} selected nothing"
    if config.require_key:
        return {"key": None, "reason": f"{what}, and IDEMPOTENCY_REQUIRE_KEY is true: answered 400"}
    return {"key": None, "reason": _no_key(config, what)}


def _batch(config: Config, found: Plan) -> dict[str, Any]:
    batch = found.batch
    facts: dict[str, Any] = {"source": "batch", "batch_source": batch.source.name, "entries": []}
    if found.refusal is not None:  # an expression written for the whole event, as the executor refuses it
        facts["error"] = str(found.refusal)
        found = _batch_units(config, found)
    for unit in found.units:
        entry: dict[str, Any] = {"index": unit.position, "id": batch.identifiers[unit.position], "key": unit.key}
        if unit.refused in (NO_KEY, NO_FINGERPRINT):
            entry.update(key=None, reason=f"reported as failed: {unit.why}")
        elif unit.key is None:
            entry["reason"] = (f"IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath!r} selected nothing from the "
                               "record: " + ("reported as failed (IDEMPOTENCY_REQUIRE_KEY is true)"
                                             if config.require_key else "it runs without idempotency"))
        elif unit.fingerprint is not None:
            entry["fingerprint"] = unit.fingerprint
        if unit.key is not None and unit.refused not in (NO_KEY, NO_FINGERPRINT) and unit.first is not None:
            entry["same_as"] = unit.first  # one claim per distinct key, at its first record
            if unit.refused == MISMATCH:
                entry["reason"] = "reported as failed: the key of an earlier record with another payload"
        facts["entries"].append(entry)
    return facts


def _batch_units(config: Config, found: Plan) -> Plan:
    """The units of a batch the plan refused whole (no record had a key): each record, without a key."""
    return found._replace(units=tuple(Unit(None, position=index) for index in range(len(found.batch.records))))


def keys_of(facts: dict[str, Any]) -> list[str]:
    """The distinct stored keys in `derive`'s facts, in order."""
    if facts.get("error"):
        return []
    return list(dict.fromkeys(entry["key"] for entry in facts["entries"] if entry["key"] is not None))


def text(facts: dict[str, Any]) -> list[str]:
    lines = []
    source = facts["source"]
    if source == "http":
        from .output import clean

        lines.append(f"source: HTTP request ({facts['form']}: {clean(facts['method'])})")
    elif source == "batch":
        lines.append(f"source: {facts['batch_source']} batch of {len(facts['entries'])} record(s)")
    elif source == "event":
        lines.append("source: whole event")
    elif source == "durable":
        lines.append("source: durable execution")
    elif source == "execution":
        lines.append("source: durable execution, keyed by its input (IDEMPOTENCY_DURABLE=execution)")
        lines.append(f"execution: {facts['execution']} (`show --event` says whether it owns the key)")
    if facts.get("rule"):
        lines.append(f"key from: {facts['rule']}")
    if facts.get("note"):
        lines.append(f"note: {facts['note']}")
    if facts.get("error"):
        lines.append(f"no key: {facts['error']}")
        return lines
    for entry in facts["entries"]:
        label = f"record {entry['index']} ({entry['id']}): " if "index" in entry else ""
        if entry["key"] is None:
            lines.append(f"{label}no key: {entry['reason']}")
            continue
        same = f" (same key as record {entry['same_as']}: one claim)" if "same_as" in entry else ""
        if "reason" in entry:
            same = f" ({entry['reason']})"
        lines.append(f"{label}{entry['key']}{same}")
        if entry.get("fingerprint"):
            lines.append(f"{' ' * len(label)}fingerprint {entry['fingerprint']}")
        if entry.get("previous_key"):
            lines.append(f"previous key {entry['previous_key']} (a first run reads it: IDEMPOTENCY_HTTP_PREVIOUS_KEYS)")
    return lines
