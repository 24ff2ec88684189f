"""One refit of every tenant's forecast from the traffic record's entries.

What lives here: `RefitSettings` (the history, bins and held-back days a refit uses),
`history_window` (which part of the record a refit at `now_s` reads), `Refit` (what a refit
made: each tenant's forecast, the business calendar's learned multiples, what it read) and
`refit` (entries -> demand series -> per-tenant fits; the same entries -> the multiples of
the policy's `learn: true` events, forecast.calendar.learn_multiples). No I/O: the sidecar
reads the record and calls this in a process of its own (extproc.runtime.forecast_refit);
`slogate forecast` calls it on a record directory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from forecast.calendar import learn_multiples
from forecast.demand import RecordedRequest, demand_series
from forecast.seasonal import DAY_S, MODELS, Model, TenantForecast, fit_tenant
from policy._ahead import AheadConfig


@dataclass(frozen=True, slots=True)
class RefitSettings:
    history_days: int = 21
    bin_s: float = 300.0
    held_back_days: int = 7
    ahead_s: float = 2 * DAY_S  # the forecast path's length from the history's end
    # The tenants with the most demand are fitted; the rest have no forecast (each fit
    # is ~0.1-0.2 s of CPU in the refit's process).
    max_tenants: int = 200
    models: tuple[Model, ...] = MODELS


def history_window(
    now_s: float, settings: RefitSettings, first_s: float | None = None
) -> tuple[float, float]:
    """[start, end): from the UTC midnight `history_days` days before today's to the last
    whole bin before now (the daily model's weekdays count from a midnight). `first_s`: the
    record's first request; a record younger than the history starts at its first midnight
    (one within a bin of it counts): days before it would read as days without demand."""
    start = (math.floor(now_s / DAY_S) - settings.history_days) * DAY_S
    if first_s is not None:
        start = max(start, math.ceil((first_s - settings.bin_s) / DAY_S) * DAY_S)
    end = start + max(0, math.floor((now_s - start) / settings.bin_s)) * settings.bin_s
    return float(start), float(end)


@dataclass(frozen=True, slots=True)
class Refit:
    fitted_at_s: float
    start_s: float
    end_s: float
    entries: int  # the record's entries read in the window
    forecasts: dict[str, TenantForecast] = field(default_factory=dict)
    left_out: int = 0  # tenants past max_tenants, not fitted
    problems: tuple[str, ...] = ()  # what the record's reader skipped (first few)
    # The `learn: true` calendar events' multiples from the same window (event name ->
    # multiple; an event with no whole occurrence in it is left out).
    learned: dict[str, float] = field(default_factory=dict)


def refit(
    entries: Iterable[RecordedRequest],
    now_s: float,
    settings: RefitSettings,
    cost_weight: Callable[[str | None], float] | Mapping[str, float] | None = None,
    problems: tuple[str, ...] = (),
    calendar: AheadConfig | None = None,
) -> Refit:
    """`calendar`: the policy's `ahead:` section, whose `learn: true` events are learned
    from the same entries (None: none)."""
    listed = list(entries)
    first_s = min((entry.t for entry in listed), default=None)
    start_s, end_s = history_window(now_s, settings, first_s)
    series = demand_series(
        listed, bin_s=settings.bin_s, start_s=start_s, end_s=end_s, cost_weight=cost_weight
    )
    ranked = sorted(series.values(), key=lambda s: -sum(s.tokens_per_minute))
    fitted = ranked[: settings.max_tenants]
    forecasts = {
        s.tenant: fit_tenant(s, settings.held_back_days, settings.ahead_s, settings.models)
        for s in fitted
    }
    return Refit(
        now_s,
        start_s,
        end_s,
        len(listed),
        forecasts,
        left_out=len(ranked) - len(fitted),
        problems=problems,
        learned={} if calendar is None else learn_multiples(calendar, listed, start_s, end_s),
    )
