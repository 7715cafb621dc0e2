"""Result encoding: what the handler returned, as stored in the record and given back on replay.

Most results are plain JSON and take the orjson fast path. Values JSON has no type for (`Decimal`, `bytes`,
integers beyond 64 bits, tuples of named fields) take a tagged form, so that a replay gives back an equal
value, falsy ones included. Results over `COMPRESS_ABOVE` bytes are zlib-compressed; a result still over the
item budget is not stored at all (`TOO_LARGE`), and its replays raise `IdempotencyResultTooLargeError`.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections import namedtuple
from decimal import Decimal

import orjson

JSON = "json"
TAGGED = "tagged"
RESPONSE = "response"  # the exact JSON text the runtime sent for the first run
BYTES = "bytes"  # the exact bytes the runtime sent (a handler that returned bytes)
COMPRESSED = "+z"
TOO_LARGE = "too_large"
DONE = "done"  # a batch record: completed, with no result kept (there is nothing to replay)
# The handler returned a value the runtime cannot send: completed, its data the value's type name (no content).
UNDELIVERABLE = "undeliverable"
FORMATS = frozenset(
    {f + z for f in (JSON, TAGGED, RESPONSE, BYTES) for z in ("", COMPRESSED)} | {TOO_LARGE, DONE, UNDELIVERABLE}
)

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

ITEM_LIMIT = 400 * 1024  # a record's size in every store: DynamoDB's item limit, names and values together
RECORD_OVERHEAD = 1024  # room kept for the key and the other attributes of the record
COMPRESS_ABOVE = 8 * 1024  # below this, compression costs more CPU than it saves write units

# Tags of the tagged form; a dict whose only key is a tag is itself wrapped, so user data never collides.
_DECIMAL, _BYTES, _INT, _OBJECT, _FLOAT = "$decimal", "$bytes", "$int", "$object", "$float"
_TAGS = frozenset({_DECIMAL, _BYTES, _INT, _OBJECT, _FLOAT})
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


if TYPE_CHECKING:
    class _EncodedFields(NamedTuple):
        format: str
        data: bytes | str | None  # JSON text (format without "+z"), zlib data (with "+z"), None (TOO_LARGE)
else:
    _EncodedFields = namedtuple("Encoded", ("format", "data"))


class Encoded(_EncodedFields):
    __slots__ = ()


class Oversized(Encoded):
    """A result too large for the record: TOO_LARGE, as every store and check sees it, which still carries what
    `pack` made of it (`inner`: the format, `packed`: the bytes) for the large-results bucket to take
    (IDEMPOTENCY_LARGE_RESULTS_BUCKET). Never stored as it is: a store completes it without data."""

    inner: str
    packed: bytes

    @classmethod
    def of(cls, inner: str, packed: bytes) -> Oversized:
        found = cls(TOO_LARGE, None)
        found.inner, found.packed = inner, packed
        return found


STORED = "s3:"  # a result in the large-results bucket: STORED + its format; the data is the pointer (JSON)


class ResultNotEncodable(TypeError):
    """The value has a type the layer cannot store faithfully."""


def _refuse(value: Any) -> Any:
    raise TypeError


def _key(key: Any) -> str:
    # The runtime's JSON encoder turns these keys into strings the same way.
    if isinstance(key, str):
        return str.__str__(key)  # a str-based Enum key is its text
    if isinstance(key, bytes):
        return key.decode("utf-8")
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float):
        key = float(key)
        if math.isnan(key):
            return "NaN"
        return repr(key) if math.isfinite(key) else ("Infinity" if key > 0 else "-Infinity")
    raise ResultNotEncodable(f"a dict key of type {type(key).__name__} is not a JSON key")


def _tag(value: Any) -> Any:
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a str-based Enum marshals as its text, not as 'Name.MEMBER'
    if isinstance(value, int):
        value = int(value)
        return value if _INT_MIN <= value <= _INT_MAX else {_INT: str(value)}
    if isinstance(value, float):
        value = float(value)
        # orjson writes NaN and the infinities as null; the runtime writes NaN, Infinity, -Infinity.
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(value, dict):
        tagged = {_key(k): _tag(v) for k, v in value.items()}
        return {_OBJECT: tagged} if len(tagged) == 1 and next(iter(tagged)) in _TAGS else tagged
    if callable(getattr(value, "_asdict", None)):
        return _tag(value._asdict())  # the runtime marshals named tuples, and anything with _asdict, as objects
    if isinstance(value, (list, tuple)):
        return [_tag(item) for item in value]
    if isinstance(value, Decimal):
        return {_DECIMAL: str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES: base64.b64encode(bytes(value)).decode()}
    raise ResultNotEncodable(f"a result of type {type(value).__name__} cannot be stored")


def _untag(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        tag, inner = next(iter(value.items()))
        if tag == _DECIMAL:
            return Decimal(inner)
        if tag == _BYTES:
            return base64.b64decode(inner)
        if tag == _INT:
            return int(inner)
        if tag == _FLOAT:
            return float(inner)
        if tag == _OBJECT:
            return {k: _untag(v) for k, v in inner.items()}
    return {k: _untag(v) for k, v in value.items()}


def has_non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in `value` (orjson writes them as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_non_finite(v) for v in value)
    return False


def to_json(value: Any) -> tuple[str, bytes]:
    """The result as JSON text, and which form it took."""
    try:
        # Subclasses and dataclasses go to the tagged path, which knows how the runtime sees them.
        option = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
        text = orjson.dumps(value, default=_refuse, option=option)
        # A null may be a NaN or an infinity orjson wrote as null: only then is the whole value scanned.
        if b"null" not in text or not has_non_finite(value):
            return JSON, text
    except TypeError:
        pass
    try:
        tagged = _tag(value)
    except RecursionError:
        raise ResultNotEncodable("the result cannot be stored: RecursionError") from None
    try:
        return TAGGED, orjson.dumps(tagged)
    except orjson.JSONEncodeError:  # over orjson's 255 levels (the runtime's marshaller goes deeper), or not UTF-8
        pass
    import json

    try:  # a lone surrogate still fails, in encode(): stored text must be UTF-8
        return TAGGED, json.dumps(tagged, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (ValueError, RecursionError) as error:
        raise ResultNotEncodable(f"the result cannot be stored: {type(error).__name__}") from None


def is_binary(form: str) -> bool:
    """Whether a format's data is bytes (stored as B) rather than UTF-8 text (stored as S). A pointer to the
    large-results bucket is JSON text, whatever the format of what it points to."""
    return not form.startswith(STORED) and (form.endswith(COMPRESSED) or form == BYTES)


def pack(form: str, text: bytes, budget: int = ITEM_LIMIT - RECORD_OVERHEAD) -> Encoded:
    """Fit `text` in `budget` bytes, compressing when that saves space, or mark it too large."""
    if len(text) <= COMPRESS_ABOVE:
        return Encoded(form, text)
    packed = zlib.compress(text, 1)
    if len(packed) > budget:
        packed = zlib.compress(text, 9)
    if len(packed) < len(text) and len(packed) <= budget:
        return Encoded(form + COMPRESSED, packed)
    if len(text) <= budget:
        return Encoded(form, text)
    if len(packed) < len(text):
        return Oversized.of(form + COMPRESSED, packed)
    return Oversized.of(form, text)


def encode(value: Any, budget: int = ITEM_LIMIT - RECORD_OVERHEAD) -> Encoded:
    """Encode a result to fit in `budget` bytes, compressing when that saves space, or mark it too large."""
    form, text = to_json(value)
    return pack(form, text, budget)


def unpack(encoded: Encoded) -> tuple[str, bytes]:
    """The format without compression, and the data as it was before `pack`."""
    form, data = encoded
    if form in (TOO_LARGE, DONE, UNDELIVERABLE) or data is None:
        raise ValueError(f"a result of format {form!r} has no data to decode")
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if form.endswith(COMPRESSED):
        return form[: -len(COMPRESSED)], zlib.decompress(data)
    return form, data


def decode(encoded: Encoded) -> Any:
    """The value an `encode`d result stood for (the runtime's formats give its text or bytes back)."""
    form, data = unpack(encoded)
    if form == BYTES:
        return data
    if form == RESPONSE:
        return data.decode("utf-8")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:  # what only the standard library wrote (see to_json) or reads
        import json

        value = json.loads(data)
    return value if form == JSON else _untag(value)
