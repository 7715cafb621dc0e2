"""deadline.Backoff: the one value every hand-written backoff of the cycle became (its polls, its completion
retries, the batch pre-check's re-reads), giving the pauses those loops gave for the same random draws."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer import cycle, deadline, precheck
from idempotency_layer.deadline import Backoff


def _by_hand(first: float, cap: float, draws: list[float]) -> list[float]:
    """The loops as they were written before: a delay doubled after each pause, capped, half of it drawn."""
    pauses, delay = [], first
    for draw in draws:
        pauses.append(delay * (0.5 + draw / 2))
        delay = min(delay * 2, cap)
    return pauses


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(0.05, 1.0), (0.1, 2.0), (0.025, 20.0), (1e-9, 3.0)]), st.integers(0, 2**32),
       st.integers(1, 60))
def test_the_pauses_are_the_hand_written_loops_for_the_same_draws(bounds, seed, attempts):
    first, cap = bounds
    rng = random.Random(seed)
    expected = _by_hand(first, cap, [rng.random() for _ in range(attempts)])
    saved = deadline.random
    deadline.random = random.Random(seed)  # type: ignore[assignment]  # the draws, seeded as tools/model.py does
    try:
        backoff = Backoff(first, cap)
        assert [backoff.delay(attempt) for attempt in range(1, attempts + 1)] == expected  # exactly, not nearly
    finally:
        deadline.random = saved  # type: ignore[assignment]


def test_each_pause_keeps_its_share_and_draws_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff(0.1, 2.0)
    monkeypatch.setattr(deadline.random, "random", lambda: 0.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 5, 6, 50)] == [0.05, 0.1, 0.2, 0.8, 1.0, 1.0]
    monkeypatch.setattr(deadline.random, "random", lambda: 0.999999)
    assert backoff.delay(1) == pytest.approx(0.1) and backoff.delay(6) == pytest.approx(2.0)
    full = Backoff(1.0, 20.0, jitter=1.0)  # full jitter: nothing kept
    monkeypatch.setattr(deadline.random, "random", lambda: 0.0)
    assert full.delay(3) == 0.0


def test_a_long_waits_thousandth_poll_is_the_cap() -> None:
    backoff = Backoff(0.05, 1.0)
    assert all(0.5 <= backoff.delay(n) <= 1.0 for n in (11, 1024, 1025, 10_000, 10**9))


def test_it_is_one_immutable_value() -> None:
    backoff = Backoff(0.05, 1.0)
    with pytest.raises(AttributeError):
        backoff.first = 1.0  # type: ignore[misc]
    assert backoff == Backoff(0.05, 1.0, 0.5) and hash(backoff) == hash(Backoff(0.05, 1.0))
    assert not hasattr(backoff, "__dict__")


def test_the_layers_backoffs_are_the_documented_ones() -> None:
    # Polls of a wait from 50 ms to 1 s; completion retries from 100 ms to 2 s; the pre-check's re-reads from
    # 50 ms to 1 s (docs/keys-and-fingerprints.md, docs/how-it-works.md, docs/batches.md).
    found = [cycle.POLLS, cycle.COMPLETE_RETRIES, precheck.READ_RETRIES]
    assert found == [Backoff(0.05, 1.0), Backoff(0.1, 2.0), Backoff(0.05, 1.0)]
