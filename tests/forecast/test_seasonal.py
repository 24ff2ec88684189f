from __future__ import annotations

import math

import numpy as np
import pytest

from forecast.demand import DemandSeries
from forecast.seasonal import Model, fit_tenant, weekday_factors
from tests.forecast.series import HOUR_BIN_S, MONDAY_S, flat, weekly

DAY_S = 86400.0


def test_a_weekly_season_is_recovered_and_holt_winters_weekly_is_chosen() -> None:
    fitted = fit_tenant(weekly(days=21), held_back_days=7, ahead_s=7 * DAY_S)
    assert fitted.model is Model.HOLT_WINTERS_WEEKLY
    assert fitted.errors[Model.HOLT_WINTERS_WEEKLY] < 0.08  # the noise is 5% a bin
    # One daily shape scaled per weekday cannot hold a flat weekend beside business hours.
    assert fitted.errors[Model.HOLT_WINTERS_DAILY] > 2 * fitted.errors[Model.HOLT_WINTERS_WEEKLY]
    assert fitted.error == fitted.errors[Model.HOLT_WINTERS_WEEKLY]
    # The path starts where the history ends (Monday 00:00 of the fourth week).
    assert fitted.start_s == MONDAY_S + 21 * DAY_S
    monday, sunday = fitted.start_s, fitted.start_s + 6 * DAY_S
    assert fitted.at(monday + 10.5 * 3600) == pytest.approx(1000, rel=0.1)
    assert fitted.at(monday + 3.5 * 3600) == pytest.approx(100, rel=0.2)
    assert fitted.at(sunday + 10.5 * 3600) == pytest.approx(200, rel=0.15)
    assert fitted.at(fitted.start_s - 1) is None
    assert fitted.at(fitted.start_s + 7 * DAY_S) is None  # past the path


def test_a_flat_series_gets_no_invented_season() -> None:
    fitted = fit_tenant(flat(days=21), held_back_days=7, ahead_s=7 * DAY_S)
    assert fitted.model is not None
    assert fitted.errors[fitted.model] < 0.08
    assert min(fitted.path) > 0.85 * 500 and max(fitted.path) < 1.15 * 500


def test_a_constant_series_is_forecast_as_itself() -> None:
    series = DemandSeries("c", MONDAY_S, HOUR_BIN_S, (50.0,) * 24 * 9, (1.0,) * 24 * 9)
    fitted = fit_tenant(series, held_back_days=1, ahead_s=DAY_S)
    assert fitted.errors[Model.HOLT_WINTERS_WEEKLY] == 0.0
    assert set(fitted.path) == {50.0}


def test_with_less_than_a_week_only_the_daily_model_fits() -> None:
    fitted = fit_tenant(weekly(days=4), held_back_days=1, ahead_s=DAY_S)
    assert set(fitted.unfit) == {Model.HOLT_WINTERS_WEEKLY, Model.SEASONAL_NAIVE}
    assert fitted.model is Model.HOLT_WINTERS_DAILY
    assert len(fitted.path) == 24


def test_too_short_to_hold_days_back_fits_nothing() -> None:
    fitted = fit_tenant(weekly(days=1), held_back_days=1, ahead_s=DAY_S)
    assert fitted.model is None and fitted.path == () and fitted.error is None
    assert set(fitted.unfit) == set(Model)


def test_weekday_factors_are_each_weekdays_mean_over_all_days() -> None:
    series = weekly(days=7, noise=0.0)
    factors = weekday_factors(np.asarray(series.tokens_per_minute), 24, first_day=0)
    weekday_mean = (8 * 1000 + 16 * 100) / 24
    overall = (5 * weekday_mean + 2 * 200) / 7
    assert factors[0] == pytest.approx(weekday_mean / overall)
    assert factors[6] == pytest.approx(200 / overall)
    assert not any(math.isnan(f) for f in factors)
