"""The handler that the exec wrapper points `_HANDLER` at.

Everything that can be done once happens at import, during the function's init: the configuration is read
and validated, the user's handler resolved by the runtime's own resolver (so a bad module fails init with the
runtime's error naming the user's module), and `build` assembles the handler: the key expression compiled, the
transport built, the table checked. `build` only assembles: each event is planned by `sources.plan` and carried out
by `executor.Executor`, with an `Invocation` made for each call; the runtime's marshalling is in `results`.
"""

from __future__ import annotations

import importlib
import logging
import os

from . import config as _config
from .errors import IdempotencyConfigurationError
from .log import LOGGER_NAME, setup
from .results import runtime_attribute, runtime_results

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LONGEST_INVOCATION_MS = 900_000  # Lambda's 15-minute limit: the claim for a context with no deadline
INIT_CHECK_S = 2.0  # the most the table check at init may take, retries included (Lambda's init has 10 s)
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


def _opened(config: _config.Config, transport: Any) -> Any:
    """The store `config` names (`stores.open_store`), its client's set-up failure a configuration error."""
    from .stores import open_store

    try:
        return open_store(config, transport)
    except IdempotencyConfigurationError:
        raise
    except Exception as error:
        raise IdempotencyConfigurationError(_unopened(config, error)) from error


def _unopened(config: _config.Config, error: Exception) -> str:
    if config.store == "valkey":
        return f"the Valkey client could not be set up: {type(error).__name__}: {error}"
    return (f"the DynamoDB client (IDEMPOTENCY_TRANSPORT={config.transport}) could not be set up: "
            f"{type(error).__name__}: {error}; check AWS_REGION, the credentials and AWS_ENDPOINT_URL_DYNAMODB")


def _record_mac(config: _config.Config, store: Any) -> Any:
    """The record MAC of IDEMPOTENCY_RECORD_MAC_KEY for `store`: its keys read once, within record_mac.KEYS_S of
    init (`record_mac.keyed`, whose errors name the setting and the source, never a key)."""
    from .record_mac import keyed

    return keyed(config, os.environ, store.identity)


def build(config: _config.Config, user_handler: Any, *, transport: Any = None, store: Any = None,
          cycle: Any = None) -> Any:
    """The handler that makes `user_handler` idempotent under `config`: each event planned (`sources.plan`) and the
    plan carried out (`executor.Executor`) on the cycle, built on `store` (by default on `transport`, by default the
    one `config` names; the table's key schema checked) unless one is given. A source's module is imported with the
    first event of its kind."""
    from .cycle import Cycle
    from .deadline import Deadline
    from .executor import Executor
    from .invocation import Invocation
    from .keys import KeyDeriver
    from .sources import plan
    from .stores import open_bucket

    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    if cycle is None:
        if store is None:
            store = _opened(config, transport)
            # A store that does not keep what the settings describe (a table of another key schema, an evicting
            # Valkey server) fails init, before any handler runs. Bounded: Lambda gives init 10 s, and a store
            # that does not answer in time is checked again before the first claim, within that invocation's
            # deadline.
            store.verify(Deadline.after(INIT_CHECK_S))
        bucket = open_bucket(config)  # None without IDEMPOTENCY_LARGE_RESULTS_BUCKET, and no S3 code imported
        mac = _record_mac(config, store) if config.record_mac_sources else None
        cycle = Cycle(store, config.ttl_seconds, config.local_cache_size, results=runtime_results(),
                      min_claim_ms=config.in_progress_seconds * 1000, wait_seconds=config.wait_seconds,
                      precheck=config.batch_precheck, bucket=bucket, mac=mac)
    earlier = None
    if config.powertools_handler is not None:  # a migration from Powertools' @idempotent: imported only then
        from .powertools import Reader

        earlier = Reader(cycle.store, keys, config.function_name or "", config.powertools_handler)
    executor = Executor(cycle, user_handler, config, earlier=earlier)
    observer: Any = None
    if config.metrics or _logger.isEnabledFor(logging.INFO):
        # Only then: each invocation counted and written (metrics.Observer). Otherwise an invocation's tally is None,
        # and a test of it is all counting costs.
        from .metrics import Observer, Tally

        observer = Observer(config.metrics, config.metrics_namespace)

    def handler(event: Any, context: Any) -> Any:
        tally = None if observer is None else Tally()
        error = None
        try:
            found = plan(config, keys, event)  # imports a source's module for the first event of its kind
            return executor.run(found, event, context, Invocation(_remaining_ms(context), tally))
        except BaseException as raised:
            error = raised
            # The runtime reports the traceback: drop the layer's frames (this one frame stays, as in any re-raise).
            # A bare re-raise, not `from`: the user's __cause__ and __context__ stay as they were.
            raise raised.with_traceback(_without_layer_frames(raised.__traceback__))  # noqa: B904
        finally:
            if tally is not None:
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
