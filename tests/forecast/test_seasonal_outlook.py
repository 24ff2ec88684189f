from __future__ import annotations

import pytest

from forecast.outlook import Outlook
from forecast.seasonal import Model, TenantForecast
from forecast.seasonal_outlook import SeasonalOutlook

T0 = 1_793_577_600.0


def forecast(
    path: tuple[float, ...], model: Model | None = Model.HOLT_WINTERS_WEEKLY
) -> TenantForecast:
    return TenantForecast("school", 300.0, {}, {}, model, T0, path)


def test_the_multiple_is_the_forecast_ahead_over_the_forecast_now() -> None:
    outlook: Outlook = SeasonalOutlook({"school": forecast((100.0, 100.0, 800.0))})
    expected = outlook.expected("school", T0 + 10, T0 + 610)
    assert expected is not None
    assert expected.multiple == pytest.approx(8.0)
    assert expected.tokens_per_minute == 800.0
    assert expected.reason == "forecast" and expected.at_s == T0 + 610
    assert outlook.expected("school", T0 + 10, T0 + 900) is None  # past the path
    assert outlook.expected("bank", T0, T0) is None  # not forecast
    unfitted = SeasonalOutlook({"school": forecast((), model=None)})
    assert unfitted.expected("school", T0, T0) is None


def test_a_ramp_from_a_quiet_night_is_large_but_finite() -> None:
    path = (0.0, 50.0)
    quiet = SeasonalOutlook({"school": forecast(path)}, min_tokens_per_minute=5.0)
    expected = quiet.expected("school", T0, T0 + 300)
    assert expected is not None and expected.multiple == pytest.approx(10.0)
    # Where the tenant is measured sending more than the forecast says, that counts.
    measured = SeasonalOutlook(
        {"school": forecast(path)}, min_tokens_per_minute=5.0, actual=lambda tenant: 25.0
    )
    expected = measured.expected("school", T0, T0 + 300)
    assert expected is not None and expected.multiple == pytest.approx(2.0)


def test_demand_now_and_the_peak_ahead() -> None:
    outlook = SeasonalOutlook({"school": forecast((1.0, 2.0, 9.0, 3.0))})
    assert outlook.tokens_per_minute("school", T0 + 301) == 2.0
    assert outlook.peak("school", T0, T0 + 900) == 9.0
    assert outlook.peak("school", T0, T0 + 600) == 2.0
    assert outlook.peak("bank", T0, T0 + 600) is None
