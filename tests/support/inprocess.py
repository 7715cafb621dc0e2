"""A handler built in process as at an init, with a Lambda context of 30 s: for tests that count what it did."""

from __future__ import annotations

import uuid
from typing import Any

from idempotency_layer import config as _config


class Context:
    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


class Function:
    """A handler built from the environment's settings by `interceptor.build`, calling `user`; `runs` holds each
    event the handler body was called with (the count of executions, from the body's own side)."""

    def __init__(self, interceptor: Any) -> None:
        self.runs: list[Any] = []
        self.user: Any = lambda event, context: {"ok": True}
        self.handler = interceptor.build(_config.load(), self._call)

    def _call(self, event: Any, context: Any) -> Any:
        self.runs.append(event)
        return self.user(event, context)

    def __call__(self, event: Any) -> Any:
        return self.handler(event, Context())
