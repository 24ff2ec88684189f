"""A tenant's seasonal demand, fitted: Holt-Winters (statsmodels) against seasonal naive.

What lives here: `Model` (the candidates), `forecast_with` (one model fitted on a series,
forecasting bins ahead), `TenantForecast` (what was fitted for one tenant: each model's
error on the held-back days, the model chosen, its forecast path ahead) and `fit_tenant`.
No I/O; fitting holds the interpreter lock for tens of milliseconds a tenant, so the
sidecar runs it in a process of its own (extproc.runtime.forecast_refit).

Daily and weekly seasons, with statsmodels' one seasonal period per model:
- `holt_winters_weekly`: additive Holt-Winters (no trend) whose period is a week of bins.
  A week holds the daily shape too (seven of them, each its own), so one period covers both,
  weekends included; it needs a week of history at least, and averages more weeks' noise
  away with more. The one to use when weekends differ from weekdays.
- `holt_winters_daily`: additive Holt-Winters whose period is a day, on demand divided by a
  weekday factor (each weekday's mean over the mean of all days, from the fitted days), the
  forecast multiplied back by it. Cheaper in history (two days), but one daily shape for
  every day: a weekend's shape is a weekday's, scaled.
- `seasonal_naive`: the same bin a week before ("same time last week"), the baseline.
The model with the smallest error on the held-back days is chosen per tenant (a tenant with
no season is served as well by any), then refitted on all the history to forecast ahead.
Forecasts below 0 are 0 (demand is never negative).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from forecast.accuracy import held_back_split, wape
from forecast.demand import DemandSeries

DAY_S = 86400
WEEK_DAYS = 7


class Model(StrEnum):
    HOLT_WINTERS_WEEKLY = "holt_winters_weekly"
    HOLT_WINTERS_DAILY = "holt_winters_daily"
    SEASONAL_NAIVE = "seasonal_naive"


# The order a tie (or a tenant with no demand held back) is settled in.
MODELS: tuple[Model, ...] = (
    Model.HOLT_WINTERS_WEEKLY,
    Model.HOLT_WINTERS_DAILY,
    Model.SEASONAL_NAIVE,
)


class NotEnoughHistory(ValueError):
    """The series is shorter than the model's season needs."""


def history_needed(model: Model, bins_per_day: int) -> int:
    """The fewest bins `model` fits on."""
    if model is Model.HOLT_WINTERS_DAILY:
        return 2 * bins_per_day
    return WEEK_DAYS * bins_per_day


def forecast_with(
    model: Model, values: Sequence[float], bins_per_day: int, ahead: int, first_day: int
) -> np.ndarray:
    """`ahead` bins after `values`, by `model`. `first_day`: the weekday (Monday 0) of the
    first bin's day (the series starts at a day's start). Raises NotEnoughHistory."""
    y = np.asarray(values, dtype=float)
    if len(y) < history_needed(model, bins_per_day):
        raise NotEnoughHistory(
            f"{model.value} needs {history_needed(model, bins_per_day)} bins, has {len(y)}"
        )
    if model is Model.SEASONAL_NAIVE:
        week = WEEK_DAYS * bins_per_day
        last = y[-week:]
        path = np.resize(last, ahead)  # repeats the last week as often as needed
    elif model is Model.HOLT_WINTERS_WEEKLY:
        path = _holt_winters(y, WEEK_DAYS * bins_per_day, ahead)
    else:
        path = _daily_with_weekday_factor(y, bins_per_day, ahead, first_day)
    return np.maximum(path, 0.0)


def _holt_winters(y: np.ndarray, period: int, ahead: int) -> np.ndarray:
    if float(np.ptp(y)) == 0.0:  # a constant: nothing to fit (the optimiser divides by 0)
        return np.full(ahead, float(y[0]))
    # It starts from the mean of every whole season in the history, the optimiser fitting
    # the smoothing alone. statsmodels' heuristic start decomposes the first two seasons
    # only, and the optimiser hardly moves off it (the seasonal smoothing fits to ~0): the
    # start is the forecast, and one noisy week in it is copied forward. The mean of the
    # seasons halves that noise with two weeks, and more with more (held-back WAPE on the
    # synthetic weeks of seed 7, 5-minute bins: bank 0.36 -> 0.25, school 0.54 -> 0.43).
    # Imported here: the sidecar holds forecasts (this module's types) but fits only in its
    # refit process, and statsmodels (with scipy) takes ~2 s to import.
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    seasons = len(y) // period
    mean_season = y[: seasons * period].reshape(seasons, period).mean(axis=0)
    level = float(mean_season.mean())
    with warnings.catch_warnings():
        # Its convergence and frequency notes are about the optimiser's last digits; the
        # fit is judged by its error on the held-back days instead.
        warnings.simplefilter("ignore")
        fitted = ExponentialSmoothing(
            y,
            trend=None,
            seasonal="add",
            seasonal_periods=period,
            initialization_method="known",
            initial_level=level,
            initial_seasonal=mean_season - level,
        ).fit()
        return np.asarray(fitted.forecast(ahead), dtype=float)


def weekday_factors(y: np.ndarray, bins_per_day: int, first_day: int) -> np.ndarray:
    """Each weekday's mean demand over all days' mean (1 for a weekday not seen, or when
    there is no demand at all)."""
    days = len(y) // bins_per_day
    daily = y[: days * bins_per_day].reshape(days, bins_per_day).mean(axis=1)
    overall = float(daily.mean()) if days else 0.0
    factors = np.ones(WEEK_DAYS)
    if overall <= 0:
        return factors
    for weekday in range(WEEK_DAYS):
        seen = daily[[(first_day + d) % WEEK_DAYS == weekday for d in range(days)]]
        if len(seen):
            factors[weekday] = float(seen.mean()) / overall
    return factors


def _daily_with_weekday_factor(
    y: np.ndarray, bins_per_day: int, ahead: int, first_day: int
) -> np.ndarray:
    factors = weekday_factors(y, bins_per_day, first_day)
    # A weekday with no demand at all stays 0 either way; the floor only avoids 0/0.
    floor = 1e-6
    day_of = (first_day + np.arange(len(y) + ahead) // bins_per_day) % WEEK_DAYS
    scale = np.maximum(factors[day_of], floor)
    plain = y / scale[: len(y)]
    path = _holt_winters(plain, bins_per_day, ahead)
    return path * scale[len(y) :]


@dataclass(frozen=True, slots=True)
class TenantForecast:
    """One tenant's fit: every model's held-back error, the one chosen, its path ahead."""

    tenant: str
    bin_s: float
    errors: dict[Model, float]  # WAPE on the held-back days; NaN: no demand held back
    unfit: dict[Model, str]  # models that could not be fitted, and why
    model: Model | None  # None: no model could be fitted
    start_s: float  # where `path` starts: the end of the history
    path: tuple[float, ...]  # weighted tokens per minute, a bin each, from start_s

    @property
    def error(self) -> float | None:
        """The chosen model's held-back error."""
        return None if self.model is None else self.errors.get(self.model)

    def at(self, at_s: float) -> float | None:
        """The forecast for the bin holding `at_s`; None outside the path."""
        index = math.floor((at_s - self.start_s) / self.bin_s)
        if not 0 <= index < len(self.path):
            return None
        return self.path[index]


def fit_tenant(
    series: DemandSeries,
    held_back_days: int,
    ahead_s: float,
    models: Sequence[Model] = MODELS,
) -> TenantForecast:
    """Each model fitted on the series less its last `held_back_days` days and scored on
    them; the best refitted on the whole series, forecasting `ahead_s` from its end. The
    series starts at a UTC midnight and holds whole days."""
    per_day = series.bins_per_day()
    values = series.tokens_per_minute
    first_day = _weekday(series.start_s)
    errors: dict[Model, float] = {}
    unfit: dict[Model, str] = {}
    try:
        fitted_on, held = held_back_split(values, per_day, held_back_days)
    except ValueError as error:
        unfit = {model: str(error) for model in models}
        return TenantForecast(series.tenant, series.bin_s, errors, unfit, None, series.end_s, ())
    for model in models:
        try:
            guess = forecast_with(model, fitted_on, per_day, len(held), first_day)
        except (NotEnoughHistory, ValueError, np.linalg.LinAlgError) as error:
            unfit[model] = str(error)
            continue
        errors[model] = wape(held, guess.tolist())
    chosen = _choose(errors)
    path: tuple[float, ...] = ()
    if chosen is not None:
        ahead = math.ceil(ahead_s / series.bin_s)
        path = tuple(forecast_with(chosen, values, per_day, ahead, first_day).tolist())
    return TenantForecast(series.tenant, series.bin_s, errors, unfit, chosen, series.end_s, path)


def _choose(errors: dict[Model, float]) -> Model | None:
    if not errors:
        return None
    ranked = sorted(errors, key=lambda m: math.inf if math.isnan(errors[m]) else errors[m])
    return ranked[0]  # sorted is stable: MODELS' order settles a tie


def _weekday(at_s: float) -> int:
    return (math.floor(at_s / DAY_S) + 3) % WEEK_DAYS  # 1970-01-01 was a Thursday
