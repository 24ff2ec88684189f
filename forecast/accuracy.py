"""How wrong a forecast was, on days it was not fitted on.

What lives here: `wape` (weighted absolute percentage error) and `held_back_split` (a series
cut into what is fitted and the last whole days held back to score it). No I/O.

Why WAPE: demand is zero through quiet nights, where a percentage error per bin (MAPE) is
undefined or explodes; WAPE is the absolute error summed over the held-back bins over the
demand summed over them, so a bin counts by how much demand it carries, as a budget does.
0 is perfect; 1 is as wrong as forecasting nothing at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def wape(actual: Sequence[float], forecast: Sequence[float]) -> float:
    """sum |actual - forecast| / sum actual over the bins both have; NaN when no demand."""
    if len(actual) != len(forecast):
        raise ValueError(f"{len(actual)} actual bins against {len(forecast)} forecast")
    total = sum(actual)
    if total <= 0:
        return math.nan
    return sum(abs(a - f) for a, f in zip(actual, forecast, strict=True)) / total


def held_back_split(
    values: Sequence[float], bins_per_day: int, held_back_days: int
) -> tuple[Sequence[float], Sequence[float]]:
    """(fitted on, held back): the last `held_back_days` whole days held back."""
    held = bins_per_day * held_back_days
    if held <= 0 or held >= len(values):
        raise ValueError(
            f"{held_back_days} held-back days leave nothing to fit on in {len(values)} bins"
        )
    return values[:-held], values[-held:]
