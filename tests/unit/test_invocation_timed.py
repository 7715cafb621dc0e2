"""Invocation.timed: the seam every store request is made in (`with inv.timed: record = store.claim(...)`): the
request counted in the invocation's tally with its time, a raise counted as a store error and passed on; nothing
at all when the invocation is not counted."""

from __future__ import annotations

import threading
import time

import pytest

from idempotency_layer.invocation import UNTIMED, Invocation
from idempotency_layer.metrics import Tally, document


def test_an_uncounted_invocation_times_nothing_and_passes_errors_on() -> None:
    inv = Invocation(1000)
    assert inv.timed is UNTIMED
    with inv.timed:
        answer = 42
    assert answer == 42
    with pytest.raises(ValueError, match="refused"), inv.timed:
        raise ValueError("refused")


def test_each_request_is_counted_with_its_time_and_a_raise_as_a_store_error() -> None:
    tally = Tally()
    inv = Invocation(1000, tally)
    with inv.timed:
        time.sleep(0.02)
    with pytest.raises(KeyError), inv.timed:
        raise KeyError("lost")
    with pytest.raises(KeyboardInterrupt), inv.timed:  # any raise, as the request's try/finally counted it
        raise KeyboardInterrupt
    assert tally.store_requests == 3 and tally.counts == {"StoreErrors": 2}
    assert 0.02 <= tally.store_s < 1.0
    emf = document(tally, "Idempotency", "fn", 0)  # what EMF reports of it
    assert emf["StoreErrors"] == 2 and emf["StoreTime"] == round(tally.store_s * 1000, 3)


def test_concurrent_requests_of_one_invocation_sum_to_their_times() -> None:
    # A batch's claims run on several threads with one invocation: each request's start may pair with another's
    # end, but the sum, all the tally keeps, is the sum of the requests' times.
    tally = Tally()
    inv = Invocation(1000, tally)
    spans: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def request(seconds: float) -> None:
        start.wait()
        began = time.perf_counter()
        with inv.timed:
            time.sleep(seconds)
        with lock:
            spans.append(time.perf_counter() - began)

    threads = [threading.Thread(target=request, args=(0.01 * (i + 1),)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tally.store_requests == 8 and "StoreErrors" not in tally.counts
    assert tally.store_s == pytest.approx(sum(spans), abs=0.005)
    assert not tally._started  # every start was taken by an end
