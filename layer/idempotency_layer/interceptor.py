"""The handler that the exec wrapper points `_HANDLER` at.

Everything that can be done once happens at import, during the function's init: the configuration is read
and validated, the key expression compiled, the transport built and the user's handler resolved by the
runtime's own resolver, so a bad module fails init with the runtime's error naming the user's module.
"""

from __future__ import annotations

import importlib
import os
import sys
from functools import partial
from typing import Any

from . import config as _config
from .errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyClaimConflictError,
    IdempotencyConfigurationError,
    IdempotencyKeyError,
    IdempotencyPayloadMismatchError,
    IdempotencyPersistenceLayerError,
    IdempotencyResultTooLargeError,
)
from .log import setup

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LONGEST_INVOCATION_MS = 900_000  # Lambda's 15-minute limit: the claim for a context with no deadline


def _runtime_module(attribute: str, *names: str) -> Any:
    # The runtime has loaded these already: looking them up costs nothing and imports nothing new.
    for name in names:
        found = getattr(sys.modules.get(name), attribute, None)
        if found is not None:
            return found
    return None


def _get_handler(name: str) -> Any:
    """The runtime's resolution rules, for when no runtime is loaded (local runs, benchmarks)."""
    module_name, _, function_name = name.rpartition(".")
    if not module_name:
        raise ImportError(f"Bad handler '{name}': not enough values to unpack (expected 2, got 1)")
    module = importlib.import_module(module_name.replace("/", "."))
    try:
        return getattr(module, function_name)
    except AttributeError:
        raise ImportError(f"Handler '{function_name}' missing on module '{module_name}'") from None


def _marshaller() -> Any:
    """The runtime's marshaller class, or None outside a runtime."""
    return _runtime_module("LambdaMarshaller", "awslambdaric.lambda_runtime_marshaller", "lambda_runtime_marshaller")


def _chained() -> bool:
    """Whether a wrapper runs after ours (IDEMPOTENCY_NEXT_WRAPPER, which the wrapper has checked): its handler
    then calls ours and looks at what we return (a tracer reads a dict's statusCode), so it must get the
    handler's own kind of value, not the runtime's raw JSON."""
    return bool(os.environ.get("IDEMPOTENCY_NEXT_WRAPPER", "").strip())  # blank counts as unset, as in the wrapper


def _restore(text: str) -> Any:
    """A value the runtime marshals back to `text`, its own marshalling of a result (a record stored as
    `response` before a wrapper was chained): a number is an int or a float when the runtime writes that one
    so, else a Decimal (which it writes as its text: `1.50`, `1E+5`, `-0`)."""
    import json
    from decimal import Decimal

    def number(token: str, kind: Any) -> Any:
        value = kind(token)
        return value if repr(value) == token else Decimal(token)

    return json.loads(text, parse_float=partial(number, kind=float), parse_int=partial(number, kind=int))


class _Values:
    """Results stored and handed back as values: the handler's value itself on the first run, an equal value
    restored from the codec's tagged form (Decimal, bytes, big integers, non-finite floats) on replay.

    With the runtime's `marshal`, a value it cannot marshal is refused (`Undeliverable`: never stored), and
    `shape(value, text)`, given the text the runtime makes of the value, says what to store."""

    def __init__(self, marshal: Any = None, shape: Any = None) -> None:
        self.marshal = marshal
        self.shape = shape

    def shaped(self, shape: Any) -> _Values:
        return _Values(self.marshal, shape)

    def text(self, value: Any) -> Any:
        """The text the runtime makes of `value` (json.dumps's outside a runtime)."""
        if self.marshal is None:
            import json

            return json.dumps(value)
        return self.marshal(value)[0]

    def encode(self, value: Any) -> tuple[Any, Any]:
        from . import codec
        from .cycle import Undeliverable

        if self.marshal is None:
            return value, codec.encode(value)
        try:
            text = self.marshal(value)[0]
        except Exception:
            raise Undeliverable from None
        return value, codec.encode(value if self.shape is None else self.shape(value, text))

    def decode(self, encoded: Any) -> Any:
        from . import codec

        value = codec.decode(encoded)
        if encoded.format.removesuffix(codec.COMPRESSED) == codec.RESPONSE:
            return _restore(value)  # the runtime's text, stored before a wrapper was chained
        return value


def _results() -> Any:
    """How results are stored and handed back, or None outside a runtime (nobody marshals them there).

    The runtime marshals what the handler returns after we return. We marshal it first, with the runtime's
    own marshaller: a result it cannot marshal must not be stored. What we store is the text the runtime will
    send, and both the first run and every replay hand back that text wrapped so the runtime's encoder emits it
    as it is: the replay's bytes are the first response's bytes. With a wrapper chained after ours, whose
    handler calls ours, values are stored and handed back instead (`_Values`), so it gets the handler's own
    kind of value on both paths.
    """
    marshaller = _marshaller()
    if marshaller is None:
        return None
    from . import codec
    from .cycle import Undeliverable

    marshal = marshaller().marshal_response
    if _chained():
        return _Values(marshal)
    raw = getattr(getattr(sys.modules.get(marshaller.__module__), "json", None), "RawJSON", None)
    probe = '{"probe":[1,"\u00e9"]}'
    try:
        if raw is None or marshal(raw(probe))[0] != probe:
            raw = None
    except Exception:
        raw = None

    if raw is None:
        # A marshaller that does not pass raw JSON through: check the value, then store and replay the value.
        return _Values(marshal)

    class RuntimeResults:
        def encode(self, value: Any) -> tuple[Any, codec.Encoded]:
            try:
                text, _content_type = marshal(value)
                data = text if isinstance(text, bytes) else text.encode("utf-8")  # as the runtime sends it
            except Exception:
                raise Undeliverable from None
            if isinstance(text, bytes):
                return text, codec.pack(codec.BYTES, data)
            return raw(text), codec.pack(codec.RESPONSE, data)

        def decode(self, encoded: codec.Encoded) -> Any:
            value = codec.decode(encoded)  # the text or bytes we stored; a value for a record of _Values
            if isinstance(value, bytes):
                return value
            if encoded.format.removesuffix(codec.COMPRESSED) == codec.RESPONSE:
                return raw(value)
            return raw(marshal(value)[0])

    return RuntimeResults()


def _value_results() -> _Values:
    """Results stored and replayed as values, checked first with the runtime's marshaller when there is one.

    For HTTP responses: a replay gains the Idempotent-Replayed header, so it is a value to amend, not the
    first response's bytes."""
    marshaller = _marshaller()
    return _Values(None if marshaller is None else marshaller().marshal_response)


def _without_layer_frames(tb: Any) -> Any:
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    return tb


CONFIG = _config.load()
logger = setup(CONFIG.log_level)
_resolve = _runtime_module("_get_handler", "awslambdaric.bootstrap", "__main__", "bootstrap") or _get_handler
user_handler = _resolve(CONFIG.original_handler)

if CONFIG.disabled:
    # Pass-through: the runtime calls the user's function itself, at no cost per invocation.
    handler = user_handler
else:
    from .cycle import Cycle
    from .keys import KeyDeriver, digest, is_empty
    from .store import DynamoDBStore
    from .transport import make_transport

    _keys = KeyDeriver(CONFIG.key_prefix, CONFIG.key_jmespath, CONFIG.payload_jmespath)
    try:
        _transport = make_transport(
            CONFIG.transport,
            connect_timeout=CONFIG.connect_timeout,
            read_timeout=CONFIG.read_timeout,
            max_attempts=CONFIG.max_attempts,
        )
    except Exception as error:
        raise IdempotencyConfigurationError(
            f"the DynamoDB client (IDEMPOTENCY_TRANSPORT={CONFIG.transport}) could not be set up: "
            f"{type(error).__name__}: {error}; check AWS_REGION, the credentials and AWS_ENDPOINT_URL_DYNAMODB"
        ) from error
    _store = DynamoDBStore(_transport, CONFIG.table, CONFIG.attributes, CONFIG.partition_value)
    _store.verify()  # a table whose key schema does not match the settings fails init, before any handler runs
    _cycle = Cycle(_store, CONFIG.ttl_seconds, CONFIG.local_cache_size, results=_results(),
                   min_claim_ms=CONFIG.in_progress_seconds * 1000, wait_seconds=CONFIG.wait_seconds)
    _batches: Any = None  # the batch runner, built for the first event with a Records list

    def _batch_of(event: Any) -> Any:
        """The batch runner and the batch `event` is, or (None, None) to handle it whole."""
        global _batches
        if CONFIG.scope == "event":
            return None, None
        if CONFIG.scope == "auto" and not (isinstance(event, dict) and isinstance(event.get("Records"), list)):
            return None, None  # not a batch, and the batch module is not even imported for it
        from .sources import batch  # a function that is never sent a batch never pays for its import

        if _batches is None:
            _batches = batch.Runner(_cycle, _keys, CONFIG.require_key, user_handler, CONFIG.stream_failures)
        found = batch.parse(event, required=CONFIG.scope == "record")
        return (_batches, found) if found is not None else (None, None)

    def _remaining_ms(context: Any) -> int:
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        return remaining() if remaining is not None else _LONGEST_INVOCATION_MS

    _http_results: Any = None  # built for the first HTTP event

    def handler(event: Any, context: Any) -> Any:  # type: ignore[misc]
        try:
            if (CONFIG.http == "auto" and CONFIG.scope != "record" and isinstance(event, dict)
                    and isinstance(event.get("requestContext"), dict)):
                from .sources import http  # only functions behind an HTTP source pay for its import

                request = http.parse(event)
                if request is not None:
                    return _http(http, request, event, context)
            runner, batch = _batch_of(event)
            if batch is not None:
                return runner.run(batch, event, context, _remaining_ms(context))
            return _whole(event, context)
        except BaseException as error:
            # The runtime reports the traceback: drop the layer's frames (this one frame stays, as in any re-raise).
            # A bare re-raise, not `from`: the user's __cause__ and __context__ stay as they were.
            raise error.with_traceback(_without_layer_frames(error.__traceback__))  # noqa: B904

    def _whole(event: Any, context: Any) -> Any:
        key = _keys.key(event)  # before the handler runs: a handler that mutates its event cannot move it
        if key is None:
            if CONFIG.require_key:
                raise IdempotencyKeyError(
                    f"IDEMPOTENCY_KEY_JMESPATH={CONFIG.key_jmespath or '@'!r} selected nothing from the event "
                    "and IDEMPOTENCY_REQUIRE_KEY is true, so the handler did not run"
                )
            logger.warning(
                "IDEMPOTENCY_KEY_JMESPATH=%r selected nothing from the event; running without idempotency",
                CONFIG.key_jmespath or "@",
            )
            return user_handler(event, context)
        fingerprint = _keys.fingerprint(event)
        return _cycle.run(key, partial(user_handler, event, context), _remaining_ms(context), fingerprint).value

    def _http(http: Any, request: Any, event: Any, context: Any) -> Any:
        """An HTTP request: the key from the header, the layer's errors as HTTP responses, replays marked."""
        global _http_results
        try:
            value = http.key_header(request, CONFIG.key_header)
        except http.HeaderError as error:
            return http.problem(request, 400, str(error))
        try:
            # The header's value, else what the key expression selects; tagged, so the two never meet.
            value = None if value is None else ["header", value]
            if value is None and CONFIG.key_jmespath:
                selected = _keys.select(event)
                value = None if is_empty(selected) else ["expression", selected]
            key = fingerprint = None  # the whole-event key would make every retry new: requests carry ids
            if value is not None:
                key = _keys.key_of(http.key_material(request, value, CONFIG.caller_headers))
                if CONFIG.payload_jmespath:
                    fingerprint = _keys.fingerprint(event)
                else:
                    fingerprint = f"{digest(http.default_payload(request))}.http"
        except IdempotencyKeyError as error:
            return http.problem(request, 400, str(error))
        if key is None:
            if CONFIG.require_key:
                return http.problem(
                    request, 400, f"the request has no {CONFIG.key_header} header and IDEMPOTENCY_REQUIRE_KEY is true"
                )
            logger.warning("an HTTP request without the %s header%s; running it without idempotency", CONFIG.key_header,
                           f" and nothing selected by IDEMPOTENCY_KEY_JMESPATH={CONFIG.key_jmespath!r}"
                           if CONFIG.key_jmespath else "")
            return user_handler(event, context)
        if _http_results is None:
            _http_results = _value_results()
        # A payload 2.0 value without a statusCode is stored in the explicit form API Gateway made of it: its body
        # is the text the runtime sent the first time, whatever a later runtime's marshaller would write.
        results = _http_results.shaped(lambda value, text: http.explicit(request, value, lambda _: text))
        try:
            outcome = _cycle.run(key, partial(user_handler, event, context), _remaining_ms(context), fingerprint,
                                 results=results, keep=lambda response: http.status_of(request, response) < 500)
        except IdempotencyPayloadMismatchError as error:
            logger.info("%s; answered 422", error)
            if not CONFIG.payload_jmespath:  # the default fingerprint: say what it covers
                return http.problem(request, 422, f"key {key!r} was used before with another request (its method, "
                                    "path, query or body differ); the request did not run")
            return http.problem(request, 422, str(error))
        except IdempotencyAlreadyInProgressError as error:
            logger.info("%s; answered 409", error)
            return http.problem(request, 409, str(error), retry_after=1)
        except IdempotencyResultTooLargeError as error:
            logger.warning("%s; answered 500", error)
            return http.problem(request, 500, str(error))
        except IdempotencyKeyError as error:
            logger.warning("%s; answered 400", error)
            return http.problem(request, 400, str(error))
        except (IdempotencyPersistenceLayerError, IdempotencyClaimConflictError) as error:
            logger.error("%s", error)
            return http.problem(request, 503, "the idempotency store is unavailable; the request did not run",
                                retry_after=1)
        if not outcome.replayed:
            return outcome.value
        return http.mark_replayed(request, outcome.value, _http_results.text)  # text: for an earlier version's record
