"""The deadline rule: how much time a request may take, in one place.

A `Deadline` is a point on `time.monotonic()`'s clock by which a call must be done. The cycle makes one from
the invocation's remaining time and moves it earlier by its margins; the client asks it how long an attempt
starting now may take (`attempt_time`) and whether a backoff still fits (`allows`). Near its end an attempt still
gets `LAST_CHANCE_S`, ending at most that long after the deadline: a write that usually takes milliseconds is
worth making, and the time an attempt gets shrinks smoothly to nothing instead of to a useless sliver.

A `Backoff` is how long to pause between attempts (the cycle's polls and retries), as one value that owns its
base, its cap and its jitter, as urllib3's `Retry` owns its backoff.
"""

from __future__ import annotations

import random
import time
from collections import namedtuple
from collections.abc import Callable

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

__all__ = ["LAST_CHANCE_S", "Backoff", "Deadline", "within"]

LAST_CHANCE_S = 0.1


if TYPE_CHECKING:
    class _DeadlineFields(NamedTuple):
        at: float  # time.monotonic()
else:
    _DeadlineFields = namedtuple("Deadline", ("at",))


class Deadline(_DeadlineFields):
    __slots__ = ()

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def earlier(self, seconds: float) -> Deadline:
        """This deadline moved `seconds` earlier (a margin kept for what comes after)."""
        return Deadline(self.at - seconds)

    def left(self) -> float:
        """Seconds until the deadline; negative once it passed."""
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def allows(self, seconds: float) -> bool:
        """Whether waiting `seconds` from now still ends before the deadline."""
        return time.monotonic() + seconds < self.at

    def attempt_time(self) -> float | None:
        """Seconds an attempt starting now may take, or None: none may start. Every attempt ends by
        `at + LAST_CHANCE_S`."""
        left = self.at - time.monotonic()
        allowed = min(max(left, LAST_CHANCE_S), left + LAST_CHANCE_S)
        return allowed if allowed > 0 else None


class Backoff:
    """Pauses doubling from `first` to `cap`, each with its `jitter` share drawn at random, so that copies that
    failed together do not try again together. Immutable: one value serves every invocation and thread. (A class of
    its own, not a namedtuple: making a namedtuple type costs ~0.15 ms of every init.)"""

    __slots__ = ("cap", "first", "jitter")
    first: float  # the pause after the first attempt, before jitter
    cap: float  # no pause is longer, before jitter
    jitter: float  # the share of each pause drawn at random

    def __init__(self, first: float, cap: float, jitter: float = 0.5) -> None:
        object.__setattr__(self, "first", first)
        object.__setattr__(self, "cap", cap)
        object.__setattr__(self, "jitter", jitter)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Backoff is immutable: {name} cannot be set")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Backoff):
            return NotImplemented
        return (self.first, self.cap, self.jitter) == (other.first, other.cap, other.jitter)

    def __hash__(self) -> int:
        return hash((self.first, self.cap, self.jitter))

    def __repr__(self) -> str:
        return f"Backoff(first={self.first!r}, cap={self.cap!r}, jitter={self.jitter!r})"

    def delay(self, attempt: int) -> float:
        """The pause after attempt `attempt` (1, 2, ...): `min(first * 2 ** (attempt - 1), cap)`, of which
        `1 - jitter` is kept and the rest drawn (one `random.random()`)."""
        # The exponent is bounded so that a long wait's thousandth poll does not overflow a float; 2.0 ** k is
        # exact, so the pause is the one doubling `first` attempt - 1 times gives.
        base = min(self.first * 2.0 ** min(attempt - 1, 1000), self.cap)
        return base * (1 - self.jitter + self.jitter * random.random())


def within(seconds: float, call: Callable[[], Any], name: str) -> Any:
    """`call()` on a thread of its own, waited for `seconds`: for work whose own timeouts cannot be set (a boto3
    client's, botocore's credential refresh). Raises `TimeoutError` when it is still running then; it is left to
    finish on its own."""
    import threading

    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:  # handed to the waiting caller, raised there
            outcome.append((False, error))

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        raise TimeoutError(f"not done within {seconds:.2f} s")
    done, value = outcome[0]
    if not done:
        raise value
    return value
