"""One invocation, as a value the interceptor makes for each call and passes down: its time and its counts.

Nothing long-lived holds the running invocation: the executor and the cycle are given it. `tally` is the
invocation's counts (`metrics.Tally`) when metrics or INFO logs are on, else None, and counting then costs one test
of it.

Every request of the store or the bucket is made inside `timed`, where it reads as the call it is:

    with inv.timed:
        record = self.store.claim(key, ...)

which counts the request, its time and whether it raised into the tally (`metrics.Tally` is that context manager),
or does nothing when the invocation is not counted.
"""

from __future__ import annotations

from .deadline import Deadline

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any


class _Untimed:
    """`timed` of an invocation that is not counted."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        return None


UNTIMED = _Untimed()


class Invocation:
    """`remaining_ms`: what the invocation had left when it started to be served (a claim lasts that long);
    `deadline`: the same point on the monotonic clock, for every request after the handler; `timed`: the context
    manager each store request is made in (an attribute, not a method: a request costs what `request(call, *args)`
    cost, measured, with no object made for it)."""

    __slots__ = ("deadline", "remaining_ms", "tally", "timed")

    def __init__(self, remaining_ms: int, tally: Any = None) -> None:
        self.remaining_ms = remaining_ms
        self.deadline = Deadline.after(remaining_ms / 1000)
        self.tally = tally
        self.timed: AbstractContextManager[None] = UNTIMED if tally is None else tally

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
