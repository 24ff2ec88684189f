"""The `forecast:` section: each tenant's demand forecast from the traffic record.

What lives here: `ForecastConfig` and its reader. The fit is forecast.seasonal; the refit
on this schedule, in a process of its own, is extproc.runtime.forecast_refit. It reads the
traffic record (`traffic_record:`), so it needs one, kept for `history_days` at least.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from policy._reader import PolicyError, Section, positive

# What the refit imports (forecast/seasonal.py); an extra, so it may be missing.
FIT_LIBRARY = "statsmodels"


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    enabled: bool = False
    refit_interval_s: float = 3600.0
    # Days of the record fitted on, the last `held_back_days` of them held back to score
    # each model (then refitted on all). The weekly model needs a week besides those held
    # back; three weeks let it average two.
    history_days: int = 21
    held_back_days: int = 7
    # Demand is binned into `bin_s` (5 minutes: a ramp in the five minutes before a class
    # shows in its own bin).
    bin_s: int = 300
    max_tenants: int = 200  # the ones with the most demand; the rest are not forecast


def parse_forecast(sec: Section, traffic_record_keep_days: int | None) -> ForecastConfig:
    """`traffic_record_keep_days`: None without a traffic record."""
    config = sec.config(ForecastConfig)
    sec.close()
    for name in ("refit_interval_s", "history_days", "held_back_days", "bin_s", "max_tenants"):
        positive(getattr(config, name), sec.child(name))
    if 86400 % config.bin_s:
        raise PolicyError(f"{sec.child('bin_s')}: must divide a day (86400 s) evenly")
    if config.held_back_days >= config.history_days:
        raise PolicyError(
            f"{sec.child('held_back_days')}: {config.held_back_days} leaves none of the "
            f"{config.history_days} history days to fit on"
        )
    if config.enabled:
        if not fit_library_installed():
            # Refused here, not at the first refit an hour later: a sidecar that took the
            # policy would run on without a forecast and say so only in a metric.
            raise PolicyError(
                f"{sec.child('enabled')}: forecasts are fitted with {FIT_LIBRARY}, which is "
                "not installed: pip install 'slogate[forecast]' (the image: build it with "
                "--build-arg WITH_FORECAST=1)"
            )
        if traffic_record_keep_days is None:
            raise PolicyError(f"{sec.child('enabled')}: a forecast needs a traffic_record")
        if traffic_record_keep_days < config.history_days:
            raise PolicyError(
                f"{sec.child('history_days')}: {config.history_days} days, but the traffic "
                f"record keeps {traffic_record_keep_days} (traffic_record.keep_days)"
            )
    return config


def fit_library_installed() -> bool:
    """Whether the refit's library can be imported (looked up, not imported: it takes ~2 s)."""
    return importlib.util.find_spec(FIT_LIBRARY) is not None
