"""A batch served by the layer's own executor, as the interceptor serves one, for tests that drive the batch path
with a cycle of their own (a store, a clock, a cache of their choosing)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from idempotency_layer.executor import Executor
from idempotency_layer.invocation import Invocation
from idempotency_layer.sources import batch


class BatchRunner:
    """`run(parsed, event, context, remaining_ms)`: the plan of `parsed` carried out by an `Executor` on `cycle`,
    the handler `handler` (reassignable), each invocation counted into `tally` when one is set (a
    `metrics.Tally`). `stream_failures` and `batch_response` as the settings spell them."""

    def __init__(self, cycle: Any, keys: Any, require_key: bool, handler: Any, stream_failures: str = "checkpoint",
                 batch_response: str = "partial") -> None:
        self.cycle = cycle
        self.keys = keys
        self.handler = handler
        self.settings = SimpleNamespace(require_key=require_key, key_jmespath=keys.expression,
                                        payload_jmespath=keys.payload,
                                        stream_checkpoint=stream_failures == "checkpoint",
                                        fail_whole_batch=batch_response == "fail")
        self.executor = Executor(cycle, lambda event, context: self.handler(event, context), self.settings)
        self.tally: Any = None

    def run(self, parsed: Any, event: Any, context: Any, remaining_ms: int) -> Any:
        plan = batch.plan(self.settings, self.keys, parsed, event)
        return self.executor.run(plan, event, context, Invocation(remaining_ms, self.tally))
