"""The seasonal forecast's metrics: its error, the demand it expects, its refits.

What lives here: `ForecastMetrics`. `slogate_forecast_error_ratio{tenant}`: the chosen
model's WAPE on the held-back days at the last refit (forecast.accuracy; a tenant folded
into "other" has none of its own); the forecast demand, as two more kinds of
`slogate_tenant_demand_tokens_per_minute` (`seasonal`: now; `seasonal_next_hour`: the
highest bin of the next hour); `slogate_forecast_refits_total{result}`,
`slogate_forecast_last_refit_timestamp_seconds` and `slogate_forecast_refit_seconds`;
`slogate_calendar_learned_multiple{event}`: each `learn: true` calendar event's multiple
as the refits learned it (the events are the policy's: a bounded label).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from prometheus_client import Counter, Gauge

from extproc.service.metrics import SidecarMetrics
from extproc.service.tenant_family import TenantFamily
from forecast.refit import Refit
from forecast.seasonal_outlook import SeasonalOutlook

NEXT_HOUR_S = 3600.0


class ForecastMetrics:
    def __init__(self, metrics: SidecarMetrics) -> None:
        r = metrics.registry
        self._tenants = metrics.tenants
        self._demand = metrics.tenant_demand
        self.error = TenantFamily(
            Gauge(
                "slogate_forecast_error_ratio",
                "The seasonal forecast's error on the held-back days of the traffic record "
                "(WAPE: absolute error over demand; 0 perfect, 1 as bad as forecasting "
                "nothing), by tenant, at the last refit; NaN: no demand held back.",
                ["tenant"],
                registry=r,
            ),
            metrics.tenants,
        )
        self.refits = Counter(
            "slogate_forecast_refits",
            "Refits of the seasonal forecasts, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        for result in ("ok", "failed"):
            self.refits.labels(result)
        self.last_refit = Gauge(
            "slogate_forecast_last_refit_timestamp_seconds",
            "When the last successful refit of the seasonal forecasts was done (Unix time).",
            registry=r,
        )
        self.refit_seconds = Gauge(
            "slogate_forecast_refit_seconds",
            "How long the last successful refit took, in its own process (read and fit).",
            registry=r,
        )

        self.learned_multiple = Gauge(
            "slogate_calendar_learned_multiple",
            "The multiple a `learn: true` business calendar event was learned at from the "
            "traffic record (demand during its past occurrences over demand just before), "
            "by event; absent: not learned yet (the event raises nothing).",
            ["event"],
            registry=r,
        )

    def learned(self, multiples: Mapping[str, float]) -> None:
        self.learned_multiple.clear()  # an event dropped from the policy leaves no series
        for event, multiple in multiples.items():
            self.learned_multiple.labels(event).set(multiple)

    def refitted(self, done: Refit, took_s: float) -> None:
        self.refits.labels("ok").inc()
        self.last_refit.set(done.fitted_at_s)
        self.refit_seconds.set(took_s)
        for tenant, fitted in done.forecasts.items():
            error = fitted.error
            if self._tenants.place(tenant) == tenant:  # "other" holds no one tenant's error
                self.error(tenant).set(math.nan if error is None else error)

    def failed(self) -> None:
        self.refits.labels("failed").inc()

    def export_demand(self, outlook: SeasonalOutlook, now_s: float) -> None:
        """The forecast demand now and in the next hour; folded tenants summed."""
        now: dict[str, float] = {}
        next_hour: dict[str, float] = {}
        for tenant in outlook.forecasts:
            label = self._tenants.place(tenant)
            current = outlook.tokens_per_minute(tenant, now_s)
            if current is not None:
                now[label] = now.get(label, 0.0) + current
            peak = outlook.peak(tenant, now_s, now_s + NEXT_HOUR_S)
            if peak is not None:
                next_hour[label] = next_hour.get(label, 0.0) + peak
        for label, value in now.items():
            self._demand(label, "seasonal").set(value)
        for label, value in next_hour.items():
            self._demand(label, "seasonal_next_hour").set(value)
