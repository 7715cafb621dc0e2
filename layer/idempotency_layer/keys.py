"""Idempotency keys: select part of the event with JMESPath, hash its canonical JSON, prefix it.

The same value must give the same key in every process and on every Python version, so the canonical
form is orjson with sorted keys and no whitespace, and the digest is SHA-256.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Callable
from typing import Any

import orjson

from .errors import IdempotencyConfigurationError, IdempotencyKeyError

_CANONICAL = orjson.OPT_SORT_KEYS


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace: equal values give equal bytes."""
    try:
        return orjson.dumps(value, option=_CANONICAL)
    except orjson.JSONEncodeError:
        # JSON integers beyond 64 bits (the runtime parses them to int) are beyond orjson: same form, by json.
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8", "surrogatepass")


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def is_empty(value: Any) -> bool:
    """Whether a selected value means 'no key': null, "", [], {}, or a multi-field list of all nulls."""
    if value is None:
        return True
    if isinstance(value, (str, list, dict)) and len(value) == 0:
        return True
    return isinstance(value, list) and all(item is None for item in value)


def _compile(expression: str) -> Callable[[Any], Any]:
    # jmespath ships with botocore in every Lambda Python runtime; it is only imported when configured.
    import jmespath
    from jmespath import functions

    class _Functions(functions.Functions):
        # A missing field (null) selects nothing, so an event without a body is one without a key.
        @functions.signature({"types": ["string", "null"]})
        def _func_json_parse(self, value: str | None) -> Any:
            return None if value is None else orjson.loads(value)

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
            f"IDEMPOTENCY_KEY_JMESPATH={expression!r} is not a valid JMESPath expression: {error}"
        ) from None
    options = jmespath.Options(custom_functions=_Functions())

    def select(event: Any) -> Any:
        try:
            return parsed.search(event, options=options)
        except (jmespath.exceptions.JMESPathError, ValueError, TypeError, UnicodeDecodeError) as error:
            raise IdempotencyKeyError(
                f"IDEMPOTENCY_KEY_JMESPATH={expression!r} could not be applied to the event: "
                f"{type(error).__name__}: {error}"
            ) from None

    return select


class KeyDeriver:
    """Turns an event into the stored key, or None when the expression selects nothing."""

    def __init__(self, prefix: str, expression: str | None) -> None:
        self.prefix = prefix
        self.expression = expression
        self._select: Callable[[Any], Any] | None = _compile(expression) if expression else None

    def select(self, event: Any) -> Any:
        return event if self._select is None else self._select(event)

    def key(self, event: Any) -> str | None:
        value = self.select(event)
        if is_empty(value):
            return None
        try:
            return f"{self.prefix}#{digest(value)}"
        except TypeError as error:
            raise IdempotencyKeyError(
                f"the value selected by IDEMPOTENCY_KEY_JMESPATH={self.expression!r} cannot be hashed: {error}"
            ) from None
