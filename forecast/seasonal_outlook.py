"""The fitted seasonal forecast as the quota controller's outlook.

What lives here: `SeasonalOutlook` (forecast.outlook.Outlook over the tenants' fitted paths,
forecast.seasonal.TenantForecast). No I/O, no clock: the caller names now and the time
ahead, in the record's clock (Unix seconds).

The multiple is the forecast at the time ahead over the forecast now (one model on both
sides, so a level the forecast misses cancels out); where the forecast now is next to
nothing (a quiet night, a tenant that sends nothing at 04:00), over what the tenant
actually sends now when the caller measures that, and never over less than
`min_tokens_per_minute`: a ramp from 0 is a large multiple, not an infinite one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from forecast.outlook import Expected
from forecast.seasonal import TenantForecast

REASON = "forecast"


class SeasonalOutlook:
    def __init__(
        self,
        forecasts: Mapping[str, TenantForecast],
        min_tokens_per_minute: float = 1.0,
        actual: Callable[[str], float | None] | None = None,
    ) -> None:
        """`actual(tenant)`: its weighted tokens per minute now, where measured."""
        self.forecasts = dict(forecasts)
        self._floor = min_tokens_per_minute
        self._actual = actual

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        fitted = self.forecasts.get(tenant)
        if fitted is None or fitted.model is None:
            return None
        ahead = fitted.at(at_s)
        now = fitted.at(now_s)
        if ahead is None or now is None:
            return None  # outside what was forecast: the controller reacts only
        if now < self._floor and self._actual is not None:
            now = max(now, self._actual(tenant) or 0.0)
        return Expected(tenant, at_s, ahead / max(now, self._floor), ahead, REASON)

    def tokens_per_minute(self, tenant: str, at_s: float) -> float | None:
        """The forecast demand at `at_s` (None: not forecast then)."""
        fitted = self.forecasts.get(tenant)
        return None if fitted is None else fitted.at(at_s)

    def peak(self, tenant: str, from_s: float, to_s: float) -> float | None:
        """The highest forecast demand over [from_s, to_s)."""
        fitted = self.forecasts.get(tenant)
        if fitted is None:
            return None
        values = [
            v
            for step in range(max(1, int((to_s - from_s) // fitted.bin_s)))
            if (v := fitted.at(from_s + step * fitted.bin_s)) is not None
        ]
        return max(values) if values else None
