"""`slogate forecast --record DIR`: a table per tenant and the results written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.fleet.synthetic_weeks import WEEKLY_TENANTS, synthetic_weeks, write_record
from tooling.cli.main import main


def test_a_record_is_fitted_and_every_models_error_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shapes = [s for s in WEEKLY_TENANTS if s.tenant in ("bank", "steady")]
    write_record(synthetic_weeks(seed=4, days=9, tenants=shapes, scale=0.2), tmp_path / "rec")
    argv = ["forecast", "--record", str(tmp_path / "rec"), "--out", str(tmp_path / "out")]
    flags = ["--history-days", "9", "--held-back-days", "1", "--bin-s", "3600"]
    assert main([*argv, *flags]) == 0
    printed = capsys.readouterr().out
    assert "| bank |" in printed and "| steady |" in printed
    report = json.loads((tmp_path / "out" / "forecast-rec.json").read_text())
    (run,) = report["runs"]
    assert run["bin_s"] == 3600 and set(run["tenants"]) == {"bank", "steady"}
    bank = run["tenants"]["bank"]
    assert bank["chosen"] in bank["wape"] and bank["wape"][bank["chosen"]] < 0.5
    assert (tmp_path / "out" / "forecast-rec.md").read_text().startswith("# Forecast accuracy")


def test_no_record_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forecast", "--record", str(tmp_path), "--out", str(tmp_path)]) == 1
    assert "no traffic record files found" in capsys.readouterr().err
