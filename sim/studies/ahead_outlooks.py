"""The forecasts the quotas-ahead study's arms know: fitted, or read off a workload.

What lives here: `fitted_week_forecast` (the seasonal fit, forecast.refit, on weeks recorded
before the simulated one), `OnCalendarClock` (an outlook asked on the simulator's clock) and
`ShapeOutlook` (a forecast read off a workload's own declared rates: a perfect one, for the
ramps minutes long that have no weeks of history).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from extproc.service.traffic_read import TrafficEntry
from forecast.calendar import CalendarClock
from forecast.outlook import Expected, Outlook
from forecast.refit import RefitSettings, refit
from forecast.seasonal_outlook import SeasonalOutlook
from sim.fleet.workload_files import SIMULATION_POLICY, workload_from
from sim.studies.ahead_workloads import WEEK_ORIGIN, WEEK_SCALE, week_document

PRIOR_WEEKS = 3


@functools.lru_cache(maxsize=1)
def fitted_week_forecast(seed: int = 11) -> SeasonalOutlook:
    """The seasonal forecast (forecast.refit: Holt-Winters weekly / daily x weekday vs seasonal
    naive, the best per tenant on the held-back week) fitted on PRIOR_WEEKS weeks of the
    usual week (`week_document`, other seeds) recorded before the simulated one, in calendar
    time: what `slogate serve` would have refitted at the week's start."""
    entries: list[TrafficEntry] = []
    for back in range(1, PRIOR_WEEKS + 1):
        week = workload_from(week_document(), SIMULATION_POLICY, seed * 100 + back, source="prior")
        start_s = WEEK_ORIGIN - back * 7 * 86_400.0
        entries += [
            TrafficEntry(
                v=1,
                t=start_s + a.at_s * WEEK_SCALE,
                outcome="admitted",
                tenant=a.key.tenant,
                prompt=a.prompt_tokens,
                max_tokens=a.max_tokens,
            )
            for a in week.arrivals
        ]
    # Hourly bins: a day played in 6 min puts a few requests in a 5-minute bin, and their
    # noise read as ramps (a quiet tenant's 1 request against 3: "3x").
    settings = RefitSettings(
        history_days=7 * PRIOR_WEEKS, bin_s=3600.0, held_back_days=7, ahead_s=8 * 86_400.0
    )
    return SeasonalOutlook(refit(entries, WEEK_ORIGIN, settings).forecasts)


class OnCalendarClock:
    """An outlook on Unix seconds asked in the simulator's: its clock mapped to the calendar's."""

    def __init__(self, outlook: Outlook, clock: CalendarClock) -> None:
        self.outlook = outlook
        self.clock = clock

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        return self.outlook.expected(tenant, self.clock.unix(now_s), self.clock.unix(at_s))


class ShapeOutlook:
    """The rates a workload document declares, as a forecast (reason "forecast"): a tenant's
    demand at `at_s` over its demand at `now_s`. `shift_s`: the forecast that much early
    (the ramp comes that much later than forecast)."""

    def __init__(self, raw: dict[str, Any], shift_s: float = 0.0) -> None:
        self._streams: dict[str, list[tuple[float, float, float, list[float], list[float]]]] = {}
        self.shift_s = shift_s
        duration_s = float(raw["duration_s"])
        for tenant in raw["tenants"]:
            for stream in tenant["streams"]:
                shape = stream.get("shape") or [[0.0, 1.0], [duration_s, 1.0]]
                self._streams.setdefault(tenant["tenant"], []).append(
                    (
                        float(stream["rate_per_s"]),
                        float(stream.get("start_s", 0.0)),
                        float(stream.get("end_s", duration_s)),
                        [float(t) for t, _ in shape],
                        [float(f) for _, f in shape],
                    )
                )

    def rate(self, tenant: str, at_s: float) -> float:
        at_s += self.shift_s
        return sum(
            rate * float(np.interp(at_s, times, factors))
            for rate, start, end, times, factors in self._streams.get(tenant, [])
            if start <= at_s < end
        )

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        if tenant not in self._streams:
            return None
        now, then = self.rate(tenant, now_s), self.rate(tenant, at_s)
        multiple = then / now if now > 0 else (1.0 if then == 0 else float("inf"))
        return Expected(tenant, at_s, multiple, None, "forecast")
