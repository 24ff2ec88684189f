from __future__ import annotations

import math

import pytest

from forecast.accuracy import held_back_split, wape


def test_wape_is_the_absolute_error_over_the_demand() -> None:
    assert wape([10, 0, 30], [10, 0, 30]) == 0.0
    assert wape([10, 0, 30], [0, 0, 0]) == 1.0  # forecasting nothing
    assert wape([10, 0, 30], [20, 5, 20]) == pytest.approx((10 + 5 + 10) / 40)
    assert math.isnan(wape([0, 0], [1, 1]))  # no demand held back: no error to speak of
    with pytest.raises(ValueError):
        wape([1], [1, 2])


def test_the_last_whole_days_are_held_back() -> None:
    fitted, held = held_back_split(list(range(10)), bins_per_day=2, held_back_days=2)
    assert list(fitted) == list(range(6)) and list(held) == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="nothing to fit"):
        held_back_split(list(range(4)), bins_per_day=2, held_back_days=2)
