"""Small statistics helpers: medians and nearest-rank percentiles, in milliseconds."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median_ms(values_ns: Sequence[float]) -> float:
    return statistics.median(values_ns) / 1e6 if values_ns else math.nan


def percentile_ms(values_ns: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: a value that was really measured."""
    if not values_ns:
        return math.nan
    ordered = sorted(values_ns)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1] / 1e6


def mean_ms(values_ns: Sequence[float]) -> float:
    return statistics.fmean(values_ns) / 1e6 if values_ns else math.nan


def ratio(a: float, b: float) -> float:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or not b:
        return math.nan
    return a / b
