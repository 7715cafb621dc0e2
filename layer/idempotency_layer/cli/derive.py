"""`key`: the stored key(s) the layer derives for an event, by the layer's own functions (`keys.route`,
`sources.batch.record_key`, `sources.http.request_key`, `KeyDeriver`), so the answer cannot drift from the
runtime's. Facts only: no event content is ever part of them."""

from __future__ import annotations

import json

from ..errors import IdempotencyError, IdempotencyKeyError
from ..keys import KeyDeriver, durable_target, route

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
    """What the layer does with `event` under `config`: the source that serves it and one entry per unit of
    work (the whole event, an HTTP request, each batch record), with its stored key or why it has none."""
    if config.disabled:
        return {"source": "disabled", "entries": [],
                "error": "IDEMPOTENCY_DISABLED is true: the runtime calls the handler directly, nothing is stored"}
    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    try:
        kind, found = route(config, event)
    except IdempotencyKeyError as error:
        return {"source": "none", "entries": [], "error": str(error)}
    if kind == "durable":
        return {"source": "durable", "entries": [{"key": None, "reason": (
            "a Lambda durable execution's invocation: the layer never claims it (a pass-through)")}]}
    target = durable_target(event)
    if target is not None and config.function_name is None:
        # The layer passes such an event through only as that function: without its name, say what it hinges on.
        facts = _whole_or_other(config, keys, kind, found, event)
        facts["note"] = (f"the envelope of a durable execution of function {target[0]!r} in {target[1]}: the layer "
                         "passes it through, unclaimed, when it runs as that function there; pass --function-name "
                         "(and --region) to know")
        return facts
    return _whole_or_other(config, keys, kind, found, event)


def _whole_or_other(config: Config, keys: KeyDeriver, kind: str, found: Any, event: Any) -> dict[str, Any]:
    if kind == "http":
        # The form and method only: a path, route or query can carry the very data a key must hide.
        return {"source": "http", "form": found.form, "method": found.method,
                "entries": [_request(config, keys, found, event)]}
    if kind == "batch":
        return _batch(config, keys, found, event)
    return {"source": "event", "entries": [_whole(config, keys, event)]}


def _whole(config: Config, keys: KeyDeriver, event: Any) -> dict[str, Any]:
    try:
        key = keys.key(event)
        if key is None:
            return {"key": None, "reason": _no_key(
                config, f"IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath or '@'!r} selected nothing from the event")}
        return {"key": key, "fingerprint": keys.fingerprint(event)}
    except IdempotencyError as error:
        return {"key": None, "reason": f"{error} (the handler does not run)"}


def _request(config: Config, keys: KeyDeriver, request: Any, event: Any) -> dict[str, Any]:
    from ..sources.http import HeaderError, request_key

    try:
        key, fingerprint = request_key(keys, config, request, event)
    except (HeaderError, IdempotencyError) as error:
        return {"key": None, "reason": f"answered 400: {error}"}
    if key is None:
        what = f"the request has no {config.key_header} header"
        if config.key_jmespath:
            what += f" and IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath!r} selected nothing"
        if config.require_key:
            return {"key": None, "reason": f"{what}, and IDEMPOTENCY_REQUIRE_KEY is true: answered 400"}
        return {"key": None, "reason": _no_key(config, what)}
    return {"key": key, "fingerprint": fingerprint}


def _batch(config: Config, keys: KeyDeriver, batch: Any, event: Any) -> dict[str, Any]:
    from ..sources.batch import record_key, refuse_a_whole_event_expression

    facts: dict[str, Any] = {"source": "batch", "batch_source": batch.source.name, "entries": []}
    nothing = 0  # records the expression selected nothing from
    for index, identifier in enumerate(batch.identifiers):
        entry: dict[str, Any] = {"index": index, "id": identifier}
        try:
            entry["key"] = record_key(keys, batch, index)
            if entry["key"] is None:
                nothing += 1
                entry["reason"] = (f"IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath!r} selected nothing from the "
                                   "record: " + ("reported as failed (IDEMPOTENCY_REQUIRE_KEY is true)"
                                                 if config.require_key else "it runs without idempotency"))
            elif keys.payload is not None:
                entry["fingerprint"] = keys.fingerprint(batch.records[index])
        except IdempotencyKeyError as error:
            entry.update(key=None, reason=f"reported as failed: {error}")
        facts["entries"].append(entry)
    if nothing and nothing == len(batch.records):  # as the batch runner judges it
        try:
            refuse_a_whole_event_expression(keys, batch, event)
        except IdempotencyKeyError as error:
            facts["error"] = str(error)
    first: dict[str, int] = {}
    for entry in facts["entries"]:
        key = entry["key"]
        if key is None:
            continue
        if key in first:
            entry["same_as"] = first[key]  # one claim per distinct key, at its first record
            if entry.get("fingerprint") != facts["entries"][first[key]].get("fingerprint"):
                entry["reason"] = "reported as failed: the key of an earlier record with another payload"
        else:
            first[key] = entry["index"]
    return facts


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
    return lines
