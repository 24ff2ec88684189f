"""`slogate forecast (--record DIR | --synthetic SEED) [--held-back-days N] [--history-days N]
[--bin-s S] [--name NAME]`: each tenant's seasonal forecast fitted from a traffic record, as
`slogate serve` refits it (forecast.refit), and every model's error on the held-back days:
a table per tenant, written to bench/results/forecast-<name>.md and .json.

`--synthetic SEED`: the simulator's synthetic weeks (sim.fleet.synthetic_weeks: three weeks of
a weekly shape, a 09:00 class ramp, a holiday) instead of a record; the name defaults to
synthetic-weeks. The refit happens as if at the end of the record (its last entry).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from tooling.cli.common import read_record

RESULTS = Path("bench/results")


def register(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "forecast",
        help="fit each tenant's seasonal demand forecast from a traffic record; each "
        "model's error on the held-back days",
    )
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--record", type=Path, action="append", help="a record dir or file")
    source.add_argument(
        "--synthetic", type=int, metavar="SEED", help="the simulator's synthetic weeks instead"
    )
    command.add_argument("--held-back-days", type=int, default=7, help="default 7")
    command.add_argument("--history-days", type=int, default=21, help="default 21")
    command.add_argument(
        "--bin-s", type=int, action="append", help="demand bin; repeat to compare (default 300)"
    )
    command.add_argument(
        "--name", default=None, help="results' name (default: the record dir's, or synthetic-weeks)"
    )
    command.add_argument("--out", type=Path, default=RESULTS, help="default bench/results")
    command.set_defaults(handler=forecast_record)


def forecast_record(args: argparse.Namespace) -> int:
    from forecast.refit import RefitSettings, refit

    entries: list[Any]
    if args.synthetic is not None:
        from sim.fleet.synthetic_weeks import synthetic_weeks

        entries = synthetic_weeks(args.synthetic, days=args.history_days)
        name = args.name or "synthetic-weeks"
        source = f"sim.fleet.synthetic_weeks, seed {args.synthetic}, {args.history_days} days"
    else:
        read = read_record(args.record, None, None, "forecast")
        if read is None:
            return 1
        entries = read.entries
        name = args.name or args.record[0].resolve().name
        source = ", ".join(str(path) for path in args.record)
    if not entries:
        print("forecast: the record holds no requests", file=sys.stderr)
        return 1
    # As if refitted just after the record's last request (the synthetic weeks: at the
    # midnight that ends them, so that their last day is whole).
    now_s = entries[-1].t + 1
    if args.synthetic is not None:
        now_s = math.ceil(now_s / 86400) * 86400
    runs = []
    for bin_s in args.bin_s or [300]:
        settings = RefitSettings(
            history_days=args.history_days,
            bin_s=float(bin_s),
            held_back_days=args.held_back_days,
            ahead_s=86400.0,
        )
        started = time.perf_counter()
        try:
            done = refit(entries, now_s, settings)
        except ValueError as error:
            print(f"forecast: {error}", file=sys.stderr)
            return 2
        run = _run(done, bin_s, time.perf_counter() - started)
        if args.synthetic is not None:
            run["noise_floor"] = _noise_floor(
                entries, done, float(bin_s), args.held_back_days, args.history_days
            )
            run["class_ramp"] = _class_ramp(done, float(bin_s))
        runs.append(run)
    report = {
        "name": name,
        "source": source,
        "requests": len(entries),
        "history_days": args.history_days,
        "held_back_days": args.held_back_days,
        "runs": runs,
    }
    text = render(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"forecast-{name}.md").write_text(text)
    (args.out / f"forecast-{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}/forecast-{name}.md and .json")
    return 0


def _run(done: Any, bin_s: int, took_s: float) -> dict[str, Any]:
    from forecast.seasonal import MODELS

    tenants = {}
    for tenant, fitted in done.forecasts.items():
        tenants[tenant] = {
            "chosen": None if fitted.model is None else fitted.model.value,
            "wape": {model.value: _number(fitted.errors.get(model)) for model in MODELS},
            "unfit": {model.value: why for model, why in fitted.unfit.items()},
        }
    return {
        "bin_s": bin_s,
        "fit_s": round(took_s, 2),
        "history": [done.start_s, done.end_s],
        "tenants": tenants,
    }


def _noise_floor(
    entries: list[Any], done: Any, bin_s: float, held_back_days: int, days: int
) -> dict[str, float | None]:
    """Per tenant: the WAPE, on the held-back days, of the demand the synthetic weeks are
    drawn around (the record's noise: no forecast does better but by luck)."""
    from forecast.accuracy import wape
    from forecast.demand import demand_series
    from sim.fleet.synthetic_weeks import MONDAY_S, WEEKLY_TENANTS, expected_tokens_per_minute

    drawn = demand_series(entries, bin_s=bin_s, start_s=done.start_s, end_s=done.end_s)
    held = round(held_back_days * 86400 / bin_s)
    offset = round((done.start_s - MONDAY_S) / bin_s)
    floors: dict[str, float | None] = {}
    for shape in WEEKLY_TENANTS:
        expected = expected_tokens_per_minute(shape, bin_s, days=days)
        actual = drawn[shape.tenant].tokens_per_minute
        expected = expected[offset : offset + len(actual)]
        floors[shape.tenant] = _number(wape(actual[-held:], expected[-held:]))
    return floors


RAMP_TIMES = ("08:30", "08:50", "08:55", "09:00", "09:30", "10:30")


def _class_ramp(done: Any, bin_s: float) -> dict[str, Any]:
    """The school's forecast around 09:00 on the first day forecast (a working day for the
    synthetic weeks), beside the demand it is drawn around, and the outlook's multiple from
    08:30: what the quota controller would read ahead of the ramp."""
    from forecast.seasonal_outlook import SeasonalOutlook
    from sim.fleet.synthetic_weeks import MONDAY_S, WEEKLY_TENANTS, expected_tokens_per_minute

    school = next(shape for shape in WEEKLY_TENANTS if shape.tenant == "school")
    day_s = done.end_s
    days = round((day_s - MONDAY_S) / 86400) + 1
    expected = expected_tokens_per_minute(school, bin_s, days=days, holiday_days=())
    outlook = SeasonalOutlook(done.forecasts)
    at_0830 = day_s + 8.5 * 3600
    rows = []
    for clock in RAMP_TIMES:
        hours, minutes = (int(part) for part in clock.split(":"))
        at_s = day_s + hours * 3600 + minutes * 60
        ahead = outlook.expected("school", at_0830, at_s)
        rows.append(
            {
                "at": clock,
                "forecast": None if ahead is None else round(ahead.tokens_per_minute or 0.0),
                "expected": round(expected[int((at_s - MONDAY_S) // bin_s)]),
                "multiple_from_0830": None if ahead is None else round(ahead.multiple, 2),
            }
        )
    return {"tenant": "school", "day_start_s": day_s, "rows": rows}


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 3)


def render(report: dict[str, Any]) -> str:
    from forecast.seasonal import MODELS

    lines = [
        f"# Forecast accuracy: {report['name']}",
        "",
        f"`slogate forecast` on {report['source']} ({report['requests']} requests): each "
        f"tenant's weighted tokens per minute fitted on {report['history_days']} days less "
        f"the last {report['held_back_days']}, scored on those (WAPE: absolute error over "
        "demand; 0 perfect, 1 as bad as forecasting nothing). The lowest (bold) is chosen "
        "and refitted on all the days.",
    ]
    if any("noise_floor" in run for run in report["runs"]):
        lines += [
            "",
            "Noise floor: the WAPE of the demand the synthetic record is drawn around "
            "(Poisson arrivals, lognormal token counts), on the same days: what no forecast "
            "beats but by luck.",
        ]
    for run in report["runs"]:
        floors = run.get("noise_floor", {})
        lines += [
            "",
            f"## Bins of {run['bin_s']} s (all tenants fitted in {run['fit_s']} s)",
            "",
            "| tenant | "
            + " | ".join(m.value for m in MODELS)
            + " | chosen |"
            + (" noise floor |" if floors else ""),
            "|---" * (len(MODELS) + 2 + bool(floors)) + "|",
        ]
        for tenant, fitted in run["tenants"].items():
            cells = []
            for model in MODELS:
                value = fitted["wape"][model.value]
                cell = "-" if value is None else f"{value:.3f}"
                cells.append(f"**{cell}**" if model.value == fitted["chosen"] else cell)
            row = f"| {tenant} | " + " | ".join(cells) + f" | {fitted['chosen']} |"
            if floors:
                floor = floors.get(tenant)
                row += " - |" if floor is None else f" {floor:.3f} |"
            lines.append(row)
        ramp = run.get("class_ramp")
        if ramp:
            lines += [
                "",
                "The class ramp on the first day forecast (the school; weighted tokens per "
                "minute, its bin's forecast and true expected demand; the outlook's multiple "
                "against 08:30):",
                "",
                "| at | " + " | ".join(step["at"] for step in ramp["rows"]) + " |",
                "|---" * (len(ramp["rows"]) + 1) + "|",
            ]
            for label, field in (
                ("forecast", "forecast"),
                ("expected", "expected"),
                ("multiple", "multiple_from_0830"),
            ):
                shown = " | ".join(str(step[field]) for step in ramp["rows"])
                lines.append(f"| {label} | {shown} |")
    return "\n".join(lines) + "\n"
