"""deadline: how long an attempt may take (shrinking smoothly to nothing past the deadline), whether a
backoff fits, and a deadline moved earlier."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.stores.dynamodb import LAST_CHANCE_S, Deadline


def test_the_time_an_attempt_gets_shrinks_smoothly_to_nothing():
    now = time.monotonic()
    given_ = [Deadline(now + left).attempt_time() for left in (1.0, 0.3, 0.05, 0.0, -0.05, -0.09, -0.11)]
    expected = [1.0, 0.3, LAST_CHANCE_S, LAST_CHANCE_S, 0.05, 0.01, None]
    assert given_[-1] is None
    assert all(abs(g - e) < 0.005 for g, e in zip(given_[:-1], expected[:-1], strict=True)), given_


@settings(max_examples=200, deadline=None)
@given(st.floats(-1.0, 5.0))
def test_every_attempt_ends_by_the_last_chance_and_never_gets_less_than_what_is_left(left):
    deadline = Deadline.after(left)
    allowed = deadline.attempt_time()
    end = deadline.at + LAST_CHANCE_S
    if allowed is None:
        assert time.monotonic() >= end - 0.001  # nothing may start only once the last chance is over
        return
    assert 0 < allowed <= max(left, LAST_CHANCE_S) + 0.001
    assert time.monotonic() + allowed <= end + 0.001
    if left > LAST_CHANCE_S:
        assert allowed == pytest.approx(left, abs=0.01)


def test_after_left_passed():
    deadline = Deadline.after(10)
    assert deadline.left() == pytest.approx(10, abs=0.5) and not deadline.passed()
    gone = Deadline(time.monotonic() - 1)
    assert gone.passed() and gone.left() < 0


def test_allows_only_a_wait_that_ends_before_the_deadline():
    deadline = Deadline.after(5)
    assert deadline.allows(0) and deadline.allows(4)
    assert not deadline.allows(6)
    gone = Deadline(time.monotonic() - 0.01)
    assert not gone.allows(0)  # past the deadline no backoff fits, however short (the last chance is no backoff)


def test_earlier_moves_the_deadline_by_a_margin():
    deadline = Deadline(1000.0)
    assert deadline.earlier(2.5) == Deadline(997.5)
    assert deadline.earlier(0) == deadline
    assert deadline == Deadline(1000.0)  # a value: the original is unchanged
