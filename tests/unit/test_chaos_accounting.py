"""The soak's verdict on hand-made histories: a run after one that was not killed or timed out is a double,
whatever became of it; a re-run after one that was is early unless that run was over and its claim could have
ended, as the re-running environment's clock saw it."""

from __future__ import annotations

import pytest

from tools.chaos import Attempt, verdict

TIMEOUT = 4.0


def history(rerun_clock: float, *, skew_s: float = 0.0, first: str = "timeout",
            second: str = "ok", overruns: bool = True) -> tuple[list[str], list[str]]:
    """A first run sent at 100.0 that ended with `first`, and a re-run whose handler read `rerun_clock` in an
    environment `skew_s` ahead (every second one, as the soak skews them): (doubles, early)."""
    attempts = {
        "a.0.1": Attempt("a.0.1", "a", 0.0, outcome=first, killed=first == "killed", sent_at=100.0),
        "a.1.3": Attempt("a.1.3", "a", 0.0, outcome=second, killed=second == "killed", skewed=skew_s > 0,
                         sent_at=rerun_clock - skew_s - 0.2),
    }
    runs = {"a": [{"key": "a", "run": "r1", "attempt": "a.0.1", "clock": 100.01},
                  {"key": "a", "run": "r2", "attempt": "a.1.3", "clock": rerun_clock}]}
    return verdict(runs, attempts, timeout=TIMEOUT, skew_s=skew_s, overruns=lambda key: overruns, margin_s=1.0)


@pytest.mark.parametrize("first", ["timeout", "killed"])
def test_a_rerun_inside_the_claim_is_early_and_one_after_it_is_not(first: str) -> None:
    assert history(104.90, first=first) == ([], ["a"])  # before the deadline (104) plus the margin
    assert history(105.00, first=first) == ([], [])


def test_a_clock_ahead_may_take_the_claim_over_that_much_sooner() -> None:
    assert history(104.40 + 0.5, skew_s=0.5) == ([], ["a"])  # true 104.40: before 105 - 0.5
    assert history(104.50 + 0.5, skew_s=0.5) == ([], [])


def test_beyond_the_margin_a_rerun_while_the_first_may_still_run_is_early() -> None:
    # 2.5 s ahead, the claim looks over at 102.5; the first run was alive until 104.
    assert history(103.90 + 2.5, skew_s=2.5) == ([], ["a"])
    assert history(104.00 + 2.5, skew_s=2.5) == ([], [])


@pytest.mark.parametrize("second", ["ok", "killed", "timeout"])
def test_any_run_after_one_that_answered_is_a_double(second: str) -> None:
    assert history(100.02, first="ok", second=second) == (["a"], [])  # killed or not, it ran a second time
    assert history(110.0, first="ok", second=second) == (["a"], [])


def test_a_timeout_the_handler_did_not_cause_excuses_nothing() -> None:
    # The key's handler does not overrun: its timeout is the layer's (a write held past the deadline).
    assert history(105.6, overruns=False) == (["a"], [])
    assert history(105.6, overruns=True) == ([], [])


def test_an_environment_lost_on_its_own_excuses_its_run() -> None:
    assert history(105.0, first="connection") == ([], [])
    assert history(104.5, first="connection") == ([], ["a"])


def test_documented_crash_window_reruns_are_counted_apart_from_doubles() -> None:
    from tools.chaos import windowed_reruns

    attempts = {
        "a.0.1": Attempt("a.0.1", "a", 0.0, outcome="killed", killed=True, sent_at=100.0),
        "a.1.2": Attempt("a.1.2", "a", 0.0, outcome="ok", sent_at=105.2),
        "a.1.3": Attempt("a.1.3", "a", 0.0, outcome="ok", sent_at=106.0),
    }
    runs = {"a": [{"key": "a", "run": "r1", "attempt": "a.0.1", "clock": 100.01},
                  {"key": "a", "run": "r2", "attempt": "a.1.2", "clock": 105.21}]}
    options = {"timeout": TIMEOUT, "skew_s": 0.0, "overruns": lambda key: False, "margin_s": 1.0}
    assert windowed_reruns(runs, attempts, **options) == 1 and verdict(runs, attempts, **options) == ([], [])
    # A third run after the answered second: a double, not a documented re-run.
    runs["a"].append({"key": "a", "run": "r3", "attempt": "a.1.3", "clock": 106.01})
    assert windowed_reruns(runs, attempts, **options) == 1 and verdict(runs, attempts, **options) == (["a"], [])
