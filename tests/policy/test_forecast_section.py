from __future__ import annotations

import pytest

from policy._reader import PolicyError
from policy.loader import parse_policy

RECORD = {"traffic_record": {"dir": "record", "keep_days": 21}}


def test_forecasts_are_off_by_default_and_read_when_given() -> None:
    assert parse_policy({}).forecast.enabled is False
    policy = parse_policy(
        {
            **RECORD,
            "forecast": {
                "enabled": True,
                "refit_interval_s": 600,
                "history_days": 14,
                "held_back_days": 2,
                "bin_s": 900,
            },
        }
    )
    config = policy.forecast
    assert config.enabled and config.refit_interval_s == 600.0 and config.bin_s == 900
    assert (config.history_days, config.held_back_days, config.max_tenants) == (14, 2, 200)


@pytest.mark.parametrize(
    ("raw", "path", "reason"),
    [
        ({"forecast": {"colour": "red"}}, "forecast.colour", "unknown field"),
        ({"forecast": {"bin_s": 0}}, "forecast.bin_s", "must be > 0"),
        ({"forecast": {"bin_s": 7}}, "forecast.bin_s", "divide a day"),
        ({"forecast": {"held_back_days": 21}}, "forecast.held_back_days", "leaves none"),
        ({"forecast": {"refit_interval_s": "often"}}, "forecast.refit_interval_s", "expected"),
        ({"forecast": {"enabled": True}}, "forecast.enabled", "needs a traffic_record"),
        (
            {"traffic_record": {"dir": "r"}, "forecast": {"enabled": True}},
            "forecast.history_days",
            "keeps 7",
        ),
    ],
)
def test_bad_forecast_settings_are_named_by_path(
    raw: dict[str, object], path: str, reason: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(raw)
    assert str(info.value).startswith(path + ":"), str(info.value)
    assert reason in str(info.value)


def test_a_forecast_without_its_fitting_library_is_refused_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """statsmodels is an extra (the image leaves it out unless built with WITH_FORECAST=1):
    where it is missing the policy is refused at load, not at the first refit an hour on.
    The lookup is the module's own, so this stands in for a machine without the extra."""
    import policy._forecast as forecast_section

    raw = {**RECORD, "forecast": {"enabled": True}}
    assert forecast_section.fit_library_installed()  # the test environment has the extra
    assert parse_policy(raw).forecast.enabled
    monkeypatch.setattr(forecast_section, "FIT_LIBRARY", "statsmodels_not_installed_here")
    with pytest.raises(PolicyError, match=r"forecast\.enabled: .*slogate\[forecast\]"):
        parse_policy(raw)
    assert parse_policy({**RECORD, "forecast": {"enabled": False}}).forecast.enabled is False
