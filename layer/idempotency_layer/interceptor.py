"""The handler that the exec wrapper points `_HANDLER` at.

Everything that can be done once happens at import, during the function's init: the configuration is read
and validated, the user's handler resolved by the runtime's own resolver (so a bad module fails init with the
runtime's error naming the user's module), and `build` assembles the handler: the key expression compiled, the
transport built, the table checked. `build` only assembles: each source's rules are in its module
(`sources.batch`, `sources.http`), the runtime's marshalling in `results`.
"""

from __future__ import annotations

import importlib
import logging
import os
from functools import partial

from . import config as _config
from .errors import IdempotencyConfigurationError, IdempotencyKeyError
from .log import LOGGER_NAME, fields, setup
from .results import runtime_attribute, runtime_results

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LONGEST_INVOCATION_MS = 900_000  # Lambda's 15-minute limit: the claim for a context with no deadline
_logger = logging.getLogger(LOGGER_NAME)


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


def _without_layer_frames(tb: Any) -> Any:
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    return tb


def _remaining_ms(context: Any) -> int:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() if remaining is not None else _LONGEST_INVOCATION_MS


def _transport(config: _config.Config) -> Any:
    from .dynamodb import make_transport

    try:
        return make_transport(
            config.transport,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            max_attempts=config.max_attempts,
        )
    except Exception as error:
        raise IdempotencyConfigurationError(
            f"the DynamoDB client (IDEMPOTENCY_TRANSPORT={config.transport}) could not be set up: "
            f"{type(error).__name__}: {error}; check AWS_REGION, the credentials and AWS_ENDPOINT_URL_DYNAMODB"
        ) from error


class _Whole:
    """An event run whole: one key for the event (the key expression's, or the whole event's)."""

    def __init__(self, cycle: Any, keys: Any, require_key: bool, handler: Any, expression: str | None) -> None:
        self.cycle, self.keys, self.require_key, self.handler = cycle, keys, require_key, handler
        self.expression = expression or "@"

    def run(self, event: Any, context: Any) -> Any:
        key = self.keys.key(event)  # before the handler runs: a handler that mutates its event cannot move it
        if key is None:
            if self.require_key:
                raise IdempotencyKeyError(
                    f"IDEMPOTENCY_KEY_JMESPATH={self.expression!r} selected nothing from the event "
                    "and IDEMPOTENCY_REQUIRE_KEY is true, so the handler did not run"
                )
            _logger.warning(
                "IDEMPOTENCY_KEY_JMESPATH=%r selected nothing from the event; running without idempotency",
                self.expression, extra=fields(None, "passed_through"),
            )
            self.cycle.count("PassThroughs")
            return self.handler(event, context)
        fingerprint = self.keys.fingerprint(event)
        return self.cycle.run(key, partial(self.handler, event, context), _remaining_ms(context), fingerprint).value


def build(config: _config.Config, user_handler: Any, *, transport: Any = None, store: Any = None,
          cycle: Any = None) -> Any:
    """The handler that makes `user_handler` idempotent under `config`: the cycle built on `store` (by default
    on `transport`, by default the one `config` names; the table's key schema checked) unless one is given.

    Each event goes to one runner: an HTTP request to `sources.http`'s, a batch to `sources.batch`'s (each
    module imported, and its runner built, for the first event of its kind), anything else to the whole-event
    runner."""
    from .cycle import Cycle
    from .keys import KeyDeriver, route
    from .store import DynamoDBStore

    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    if cycle is None:
        if store is None:
            store = DynamoDBStore(transport if transport is not None else _transport(config), config.table,
                                  config.attributes, config.partition_value)
            store.verify()  # a table whose key schema does not match the settings fails init, before any handler runs
        cycle = Cycle(store, config.ttl_seconds, config.local_cache_size, results=runtime_results(),
                      min_claim_ms=config.in_progress_seconds * 1000, wait_seconds=config.wait_seconds,
                      batch_precheck=config.batch_precheck)
    whole = _Whole(cycle, keys, config.require_key, user_handler, config.key_jmespath)
    batches: Any = None  # the batch runner, built for the first batch
    requests: Any = None  # the HTTP runner, built for the first HTTP event

    said_durable = False

    def durable(event: Any, context: Any) -> Any:
        # A durable execution re-invokes its function many times by design (each replay with a new checkpoint
        # token): claiming those invocations would break it. Passed through, whatever the key settings.
        nonlocal said_durable
        if not said_durable:
            said_durable = True
            _logger.info("a Lambda durable execution's invocation: passed through untouched (the layer never "
                         "claims durable executions; see the README's Durable functions)")
        if cycle.tally is not None:
            cycle.tally.kind = "durable"
        cycle.count("PassThroughs")
        return user_handler(event, context)

    def handler(event: Any, context: Any) -> Any:
        nonlocal batches, requests
        try:
            kind, found = route(config, event)  # imports a source's module for the first event of its kind
            if kind == "durable":
                return durable(event, context)
            if kind == "http":
                if requests is None:
                    from .sources import http

                    requests = http.Runner(cycle, keys, user_handler, _remaining_ms, config)
                return requests.run(found, event, context)
            if kind == "batch":
                if batches is None:
                    from .sources import batch

                    batches = batch.Runner(cycle, keys, config.require_key, user_handler, config.stream_failures,
                                           config.batch_response)
                return batches.run(found, event, context, _remaining_ms(context))
            return whole.run(event, context)
        except BaseException as error:
            # The runtime reports the traceback: drop the layer's frames (this one frame stays, as in any re-raise).
            # A bare re-raise, not `from`: the user's __cause__ and __context__ stay as they were.
            raise error.with_traceback(_without_layer_frames(error.__traceback__))  # noqa: B904

    if config.metrics != "off" or _logger.isEnabledFor(logging.INFO):
        # Only then: each invocation counted and written (metrics.Observer). Otherwise the handler above is the
        # one, and a test of `cycle.tally` (two for an HTTP request) is all an invocation pays.
        from .metrics import Observer

        observer = Observer(cycle, config.metrics == "emf", config.metrics_namespace)
        dispatch = handler

        def handler(event: Any, context: Any) -> Any:
            tally = observer.start()
            error = None
            try:
                return dispatch(event, context)
            except BaseException as raised:
                error = raised
                # As in the handler above: this frame stays, the layer's frames below it go.
                raise raised.with_traceback(_without_layer_frames(raised.__traceback__))  # noqa: B904
            finally:
                observer.finish(tally, context, error)
                del error  # no cycle from this frame to the exception and back

    handler.cycle = cycle  # type: ignore[attr-defined]  # what it runs on (its store, their transport): for tests
    return handler


CONFIG = _config.load()
logger = setup(CONFIG.log_level)
user_handler = (runtime_attribute("_get_handler", "awslambdaric.bootstrap", "__main__", "bootstrap")
                or _get_handler)(CONFIG.original_handler)
# Pass-through when disabled: the runtime calls the user's function itself, at no cost per invocation.
handler = user_handler if CONFIG.disabled else build(CONFIG, user_handler)
