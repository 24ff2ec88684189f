"""Demand series made to a known shape, for the forecast's tests."""

from __future__ import annotations

import numpy as np

from forecast.demand import DemandSeries

# Monday 2026-11-02 00:00 UTC.
MONDAY_S = 1_793_577_600.0
HOUR_BIN_S = 3600.0  # hourly bins: a week is 168 of them, small enough to fit in ms


def weekly(days: int, seed: int = 1, noise: float = 0.05) -> DemandSeries:
    """Hourly demand: 1000 tokens/min through weekday business hours (09-17), 100 at night,
    200 on weekend days, with `noise` (relative, normal) on every bin."""
    rng = np.random.default_rng(seed)
    values = []
    for hour in range(days * 24):
        weekday, of_day = (hour // 24) % 7, hour % 24
        business = weekday < 5 and 9 <= of_day < 17
        base = 1000.0 if business else 200.0 if weekday >= 5 else 100.0
        values.append(max(0.0, base * (1 + noise * rng.standard_normal())))
    return DemandSeries("t", MONDAY_S, HOUR_BIN_S, tuple(values), tuple(v / 500 for v in values))


def flat(days: int, level: float = 500.0, seed: int = 2, noise: float = 0.05) -> DemandSeries:
    rng = np.random.default_rng(seed)
    values = tuple(max(0.0, level * (1 + noise * rng.standard_normal())) for _ in range(days * 24))
    return DemandSeries("flat", MONDAY_S, HOUR_BIN_S, values, values)
