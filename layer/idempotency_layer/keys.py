"""Idempotency keys: select part of the event with JMESPath, hash its canonical JSON, prefix it.

The same value must give the same key in every process and on every Python version, so the canonical
form is orjson with sorted keys and no whitespace, and the digest is SHA-256.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Callable

import orjson

from .codec import has_non_finite
from .errors import IdempotencyConfigurationError, IdempotencyKeyError, IdempotencyPayloadMismatchError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

_CANONICAL = orjson.OPT_SORT_KEYS


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace: equal values give equal bytes, and values json tells apart differ."""
    try:
        text = orjson.dumps(value, option=_CANONICAL)
        # orjson writes NaN and the infinities as null: only a text with a null can hide one.
        if b"null" not in text or not has_non_finite(value):
            return text
    except orjson.JSONEncodeError:
        pass  # integers beyond 64 bits, lone surrogates, nesting beyond orjson's depth
    # The same form by json, which writes NaN/Infinity as such, big integers exactly, and surrogates escaped.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode(
        "utf-8", "surrogatepass"
    )


def _describe(error: Exception) -> str:
    """What went wrong, without the event's content (some messages quote the value they failed on)."""
    if isinstance(error, json.JSONDecodeError):
        return f"not JSON ({error.msg} at position {error.pos})"
    if isinstance(error, UnicodeDecodeError):
        return f"not {error.encoding} text (at byte {error.start})"
    if isinstance(error, binascii.Error):
        return "not base64"
    if isinstance(error, (OSError, EOFError, zlib.error)):
        return "not gzip data"
    actual = getattr(error, "actual_type", None)
    if actual is not None:
        return f"{getattr(error, 'function_name', 'a function')}() was given a {actual}"
    if isinstance(error, RecursionError):
        return "the event is nested too deeply"
    return type(error).__name__


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def is_empty(value: Any) -> bool:
    """Whether a selected value means 'no key': null, "", [], {}, or a multi-field list of all nulls."""
    if value is None:
        return True
    if isinstance(value, (str, list, dict)) and len(value) == 0:
        return True
    return isinstance(value, list) and all(item is None for item in value)


def _check_functions(variable: str, expression: str, node: Any, known: dict[str, Any]) -> None:
    """JMESPath looks functions up only when it calls them: an unknown name or a wrong arity fails here, at init."""
    if isinstance(node, dict):
        if node.get("type") == "function_expression":
            name, given = node.get("value"), len(node.get("children", []))
            spec = known.get(name) if isinstance(name, str) else None
            if spec is None:
                raise IdempotencyConfigurationError(
                    f"{variable}={expression!r} calls unknown function {name}(); known: "
                    + ", ".join(sorted(known))
                )
            signature = spec["signature"]
            variadic = bool(signature) and signature[-1].get("variadic")
            if given < len(signature) or (not variadic and given != len(signature)):
                raise IdempotencyConfigurationError(
                    f"{variable}={expression!r} calls {name}() with {given} argument(s); "
                    f"it takes {len(signature)}{' or more' if variadic else ''}"
                )
        for child in node.get("children", []):
            _check_functions(variable, expression, child, known)
    elif isinstance(node, list):
        for child in node:
            _check_functions(variable, expression, child, known)


def _reads_the_event(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("type") in ("field", "current", "identity"):
            return True
        return any(_reads_the_event(child) for child in node.get("children", []))
    return isinstance(node, list) and any(_reads_the_event(child) for child in node)


# A JMESPath unquoted identifier: the expression is one field of the event.
_BARE_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _field(name: str, variable: str) -> Callable[[Any], Any]:
    """A bare field read as JMESPath reads it (its TreeInterpreter.visit_field): the value's `get(name)`, None
    for a value without `get` (a list, a string, a number). jmespath is not even imported."""

    def select(event: Any) -> Any:
        try:
            return event.get(name)
        except AttributeError:
            return None
        except Exception as error:  # as _compile's: a failure to apply it is the event's
            raise _not_applied(variable, name, error) from None

    return select


def _not_applied(variable: str, expression: str, error: Exception) -> IdempotencyKeyError:
    """Every failure to apply an expression is the event's, and is named the same way (without its content)."""
    return IdempotencyKeyError(f"{variable}={expression!r} could not be applied to the event: {_describe(error)}")


def _compile(expression: str, variable: str = "IDEMPOTENCY_KEY_JMESPATH") -> Callable[[Any], Any]:
    if _BARE_FIELD.fullmatch(expression):
        return _field(expression, variable)
    # jmespath ships with botocore in every Lambda Python runtime; it is only imported when configured.
    import jmespath
    from jmespath import functions

    class _Functions(functions.Functions):
        # A missing field (null) selects nothing, so an event without a body is one without a key.
        @functions.signature({"types": ["string", "null"]})
        def _func_json_parse(self, value: str | None) -> Any:
            # json, not orjson: orjson turns integers beyond 64 bits into floats, so two orders would share a key.
            return None if value is None else json.loads(value)

        @functions.signature({"types": ["string", "null"]})
        def _func_base64_decode(self, value: str | None) -> str | None:
            return None if value is None else base64.b64decode(value).decode()

        @functions.signature({"types": ["string", "null"]})
        def _func_base64_gzip_decode(self, value: str | None) -> str | None:
            return None if value is None else gzip.decompress(base64.b64decode(value)).decode()

        # The names Powertools users already have in their expressions.
        _func_powertools_json = _func_json_parse
        _func_powertools_base64 = _func_base64_decode
        _func_powertools_base64_gzip = _func_base64_gzip_decode

    try:
        parsed = jmespath.compile(expression)
    except jmespath.exceptions.JMESPathError as error:
        raise IdempotencyConfigurationError(
            f"{variable}={expression!r} is not a valid JMESPath expression: {error}"
        ) from None
    registry = _Functions()
    _check_functions(variable, expression, parsed.parsed, registry.FUNCTION_TABLE)
    if not _reads_the_event(parsed.parsed):
        # E.g. 'orderId' in single quotes: a JMESPath raw string, the same text for every event, so every
        # event would share one key and replay the first one's result.
        raise IdempotencyConfigurationError(
            f"{variable}={expression!r} reads nothing from the event, so every event would get the "
            f"same {'key' if variable == 'IDEMPOTENCY_KEY_JMESPATH' else 'fingerprint'}; name a field (orderId, "
            "not 'orderId': single quotes make a literal string)"
        )
    options = jmespath.Options(custom_functions=registry)

    def select(event: Any) -> Any:
        try:
            return parsed.search(event, options=options)
        except Exception as error:
            raise _not_applied(variable, expression, error) from None

    return select


class KeyDeriver:
    """Turns an event into the stored key, or None when the expression selects nothing; and into the
    fingerprint of its payload, when a payload expression is set."""

    def __init__(self, prefix: str, expression: str | None, payload: str | None = None) -> None:
        self.prefix = prefix
        self.expression = expression
        self.payload = payload
        self._select: Callable[[Any], Any] | None = _compile(expression) if expression else None
        self._payload = _compile(payload, "IDEMPOTENCY_PAYLOAD_JMESPATH") if payload else None
        # Which expression made a fingerprint: one made by another expression cannot be compared with ours.
        self._tag = hashlib.sha256(payload.encode()).hexdigest()[:16] if payload else ""

    def fingerprint(self, event: Any) -> str | None:
        """`<SHA-256 of what the payload expression selects, null included>.<tag of the expression>`, or None
        when none is set."""
        if self._payload is None:
            return None
        selected = self._payload(event)
        try:
            return f"{digest(selected)}.{self._tag}"
        except Exception as error:
            raise IdempotencyKeyError(
                f"the value selected by IDEMPOTENCY_PAYLOAD_JMESPATH={self.payload!r} cannot be hashed: "
                f"{_describe(error)}"
            ) from None

    def select(self, event: Any) -> Any:
        return event if self._select is None else self._select(event)

    def select_payload(self, event: Any) -> Any:
        """What the payload expression selects from `event` (None when none is set)."""
        return None if self._payload is None else self._payload(event)

    def key(self, event: Any) -> str | None:
        return self.key_of(self.select(event))

    def key_of(self, value: Any) -> str | None:
        """The stored key for an already selected value, or None when it means 'no key'."""
        if is_empty(value):
            return None
        try:
            return f"{self.prefix}#{digest(value)}"
        except Exception as error:
            raise IdempotencyKeyError(
                f"the value selected by IDEMPOTENCY_KEY_JMESPATH={self.expression or '@'!r} cannot be hashed: "
                f"{_describe(error)}"
            ) from None


def check_fingerprint(key: str, stored: str | None, given: str | None) -> None:
    """Raise `IdempotencyPayloadMismatchError` when the fingerprint `key`'s record was claimed with (`stored`) is
    not the one this copy carries (`given`), both made by the same expression."""
    # A record claimed before IDEMPOTENCY_PAYLOAD_JMESPATH was set, or under another expression (the part after
    # the dot names it), has nothing this copy's fingerprint can be compared with.
    if stored is None or given is None or stored.partition(".")[2] != given.partition(".")[2]:
        return
    if stored != given:
        # An HTTP request's default fingerprint (method, path, body) ends in ".http"; anything else is the expression's.
        what = ("its method, path, query or body differ" if given.endswith(".http")
                else "its path differs, or IDEMPOTENCY_PAYLOAD_JMESPATH selects something else from it"
                if given.endswith("+path") else "IDEMPOTENCY_PAYLOAD_JMESPATH selects something else from this event")
        raise IdempotencyPayloadMismatchError(
            f"key {key!r} was used before with another payload ({what}); the handler did not run"
        )


def powertools_key(prefix: str, value: Any) -> str | None:
    """The key Powertools' DynamoDB persistence layer stores for the selected `value` (its default hash:
    `<prefix>#<MD5 of json.dumps(value, sort_keys=True)>`), or None where Powertools sees no key."""
    if isinstance(value, dict):
        missing = all(item is None for item in value.values())
    elif isinstance(value, (list, tuple)):
        missing = all(item is None for item in value)
    else:
        missing = not isinstance(value, (int, float, bool)) and not value
    return None if missing else f"{prefix}#{powertools_hash(value)}"


def powertools_hash(value: Any) -> str:
    """Powertools' hash of a selected value: MD5 (its default) of its JSON with sorted keys. Not a security use."""
    return hashlib.md5(json.dumps(value, sort_keys=True).encode(), usedforsecurity=False).hexdigest()
