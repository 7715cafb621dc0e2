"""One invocation, as a value the interceptor makes for each call and passes down: its time and its counts.

Nothing long-lived holds the running invocation: the executor and the cycle are given it. `tally` is the
invocation's counts (`metrics.Tally`) when metrics or INFO logs are on, else None, and counting then costs one test
of it.
"""

from __future__ import annotations

import time

from .deadline import Deadline

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Invocation:
    """`remaining_ms`: what the invocation had left when it started to be served (a claim lasts that long);
    `deadline`: the same point on the monotonic clock, for every request after the handler."""

    __slots__ = ("deadline", "remaining_ms", "tally")

    def __init__(self, remaining_ms: int, tally: Any = None) -> None:
        self.remaining_ms = remaining_ms
        self.deadline = Deadline.after(remaining_ms / 1000)
        self.tally = tally

    def count(self, name: str, n: int = 1) -> None:
        if self.tally is not None:
            self.tally.add(name, n)

    def counts(self, **counts: int) -> None:
        if self.tally is not None:
            self.tally.add_many(**counts)

    def describe(self, kind: str, key: str | None = None, records: int = 0) -> None:
        """What the invocation serves, for its metrics and its INFO line."""
        tally = self.tally
        if tally is not None:
            tally.kind = kind
            if key is not None:
                tally.key = key
            if records:
                tally.records = records

    def request(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, one request of the store, timed into the invocation's counts when it is counted."""
        tally = self.tally
        if tally is None:
            return call(*args)
        started = time.perf_counter()
        failed = True
        try:
            answer = call(*args)
            failed = False
            return answer
        finally:
            tally.stored(time.perf_counter() - started, failed)
