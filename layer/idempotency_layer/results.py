"""The result protocol: how a result is stored and handed back (`Results`), and under the Lambda runtime, how:
marshalled once with the runtime's own marshaller, found in `sys.modules` (the runtime has loaded it; outside a
runtime there is none, and results are stored as values)."""

from __future__ import annotations

import os
import re
import sys
from functools import partial

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, Protocol

    from . import codec
else:
    Protocol = object  # the interface's documentation at run time; structural for type checkers


class Undeliverable(Exception):
    """Raised by `Results.encode`: the runtime cannot send the result; `kind` names the type it refused (a type's
    name, never content). The handler ran: the key is completed without a result, so copies do not run again."""

    def __init__(self, kind: str = "?") -> None:
        super().__init__(kind)
        self.kind = kind


# Compiled by `re` when a result is first refused, not at init.
_REFUSED_TYPE = r"type '?([A-Za-z_][A-Za-z0-9_.]{0,120})'? is not JSON serializable"


def refused(error: BaseException, value: Any) -> Undeliverable:
    """The `Undeliverable` for the runtime marshaller's `error` about `value`: the type its message names (the
    json encoder's words, "Object of type X is not JSON serializable"), else the value's own type."""
    found = re.search(_REFUSED_TYPE, str(error))
    return Undeliverable(found.group(1) if found else type(value).__name__)


class Results(Protocol):
    """How a result is stored and handed back; both paths must hand back the same kind of value."""

    def encode(self, value: Any) -> tuple[Any, codec.Encoded]:
        """What to hand back for a fresh result, and what to store; raises `Undeliverable`."""

    def decode(self, encoded: codec.Encoded) -> Any:
        """What to hand back for a stored result."""


class ValueResults:
    """Outside a runtime: the value itself first, an equal value on replay."""

    def encode(self, value: Any) -> tuple[Any, codec.Encoded]:
        from . import codec  # (codec and orjson: loaded by the layer's cycle; not by the disabled layer's init)

        return value, codec.encode(value)

    def decode(self, encoded: codec.Encoded) -> Any:
        from . import codec

        return codec.decode(encoded)


class ExecutionResults(ValueResults):
    """A durable execution's `Result`: JSON text, stored and answered as that text. An empty or absent one (the
    durable execution SDK checkpointed a result over Lambda's response limit, and answers without it) is stored
    as a result too large to keep."""

    def encode(self, value: Any) -> tuple[Any, codec.Encoded]:
        from . import codec

        if not value:
            return value, codec.Encoded(codec.TOO_LARGE, None)
        return super().encode(value)


def runtime_attribute(attribute: str, *names: str) -> Any:
    """`attribute` of the first of the runtime's modules `names` that has it, or None outside a runtime."""
    # The runtime has loaded these already: looking them up costs nothing and imports nothing new.
    for name in names:
        found = getattr(sys.modules.get(name), attribute, None)
        if found is not None:
            return found
    return None


def marshaller() -> Any:
    """The runtime's marshaller class, or None outside a runtime."""
    return runtime_attribute("LambdaMarshaller", "awslambdaric.lambda_runtime_marshaller", "lambda_runtime_marshaller")


def chained() -> bool:
    """Whether a wrapper runs after ours (IDEMPOTENCY_NEXT_WRAPPER, which the wrapper has checked): its handler
    then calls ours and looks at what we return (a tracer reads a dict's statusCode), so it must get the
    handler's own kind of value, not the runtime's raw JSON."""
    return bool(os.environ.get("IDEMPOTENCY_NEXT_WRAPPER", "").strip())  # blank counts as unset, as in the wrapper


def restore(text: str) -> Any:
    """A value the runtime marshals back to `text`, its own marshalling of a result (a record stored as
    `response` before a wrapper was chained): a number is an int or a float when the runtime writes that one
    so, else a Decimal (which it writes as its text: `1.50`, `1E+5`, `-0`)."""
    import json
    from decimal import Decimal

    def number(token: str, kind: Any) -> Any:
        value = kind(token)
        return value if repr(value) == token else Decimal(token)

    return json.loads(text, parse_float=partial(number, kind=float), parse_int=partial(number, kind=int))


class Values:
    """Results stored and handed back as values: the handler's value itself on the first run, an equal value
    restored from the codec's tagged form (Decimal, bytes, big integers, non-finite floats) on replay.

    With the runtime's `marshal`, a value it cannot marshal is refused (`Undeliverable`: never stored), and
    `shape(value, text)`, given the text the runtime makes of the value, says what to store."""

    def __init__(self, marshal: Any = None, shape: Any = None) -> None:
        self.marshal = marshal
        self.shape = shape

    def shaped(self, shape: Any) -> Values:
        return Values(self.marshal, shape)

    def text(self, value: Any) -> Any:
        """The text the runtime makes of `value` (json.dumps's outside a runtime)."""
        if self.marshal is None:
            import json

            return json.dumps(value)
        return self.marshal(value)[0]

    def encode(self, value: Any) -> tuple[Any, Any]:
        from . import codec

        if self.marshal is None:
            return value, codec.encode(value)
        try:
            text = self.marshal(value)[0]
        except Exception as error:
            raise refused(error, value) from None
        return value, codec.encode(value if self.shape is None else self.shape(value, text))

    def decode(self, encoded: Any) -> Any:
        from . import codec

        value = codec.decode(encoded)
        if encoded.format.removesuffix(codec.COMPRESSED) == codec.RESPONSE:
            return restore(value)  # the runtime's text, stored before a wrapper was chained
        return value


def runtime_results() -> Any:
    """How results are stored and handed back, or None outside a runtime (nobody marshals them there).

    The runtime marshals what the handler returns after we return. We marshal it first, with the runtime's
    own marshaller: a result it cannot marshal must not be stored. What we store is the text the runtime will
    send, and both the first run and every replay hand back that text wrapped so the runtime's encoder emits it
    as it is: the replay's bytes are the first response's bytes. With a wrapper chained after ours, whose
    handler calls ours, values are stored and handed back instead (`Values`), so it gets the handler's own
    kind of value on both paths.
    """
    found = marshaller()
    if found is None:
        return None
    from . import codec

    marshal = found().marshal_response
    if chained():
        return Values(marshal)
    raw = getattr(getattr(sys.modules.get(found.__module__), "json", None), "RawJSON", None)
    probe = '{"probe":[1,"\u00e9"]}'
    try:
        if raw is None or marshal(raw(probe))[0] != probe:
            raw = None
    except Exception:
        raw = None

    if raw is None:
        # A marshaller that does not pass raw JSON through: check the value, then store and replay the value.
        return Values(marshal)

    wrap: Any = raw  # (not None here)

    class RuntimeResults:
        def encode(self, value: Any) -> tuple[Any, codec.Encoded]:
            try:
                text, _content_type = marshal(value)
                data = text if isinstance(text, bytes) else text.encode("utf-8")  # as the runtime sends it
            except Exception as error:
                raise refused(error, value) from None
            if isinstance(text, bytes):
                return text, codec.pack(codec.BYTES, data)
            return wrap(text), codec.pack(codec.RESPONSE, data)

        def decode(self, encoded: codec.Encoded) -> Any:
            value = codec.decode(encoded)  # the text or bytes we stored; a value for a record of Values
            if isinstance(value, bytes):
                return value
            if encoded.format.removesuffix(codec.COMPRESSED) == codec.RESPONSE:
                return wrap(value)
            return wrap(marshal(value)[0])

    return RuntimeResults()


def value_results() -> Values:
    """Results stored and replayed as values, checked first with the runtime's marshaller when there is one.

    For HTTP responses: a replay gains the Idempotent-Replayed header, so it is a value to amend, not the
    first response's bytes."""
    found = marshaller()
    return Values(None if found is None else found().marshal_response)
