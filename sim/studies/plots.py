"""PNG plots of a static-vs-dynamic comparison: load, P99 TTFT and breaker level over time.

What lives here: `draw_comparison`, which reads the JSON that `sim.studies.scenarios.compare`
writes (the best static run and the dynamic run carry a timeline) and draws one figure
with both runs on shared time axes. matplotlib is an optional dependency (`slogate[sim]`);
without it the caller gets an ImportError it can report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from policy.domain import Tier
from policy.quantiles import quantile
from policy.schema import BreakerConfig

RUNS = (("static_best", "static (best sweep)", "tab:gray"), ("dynamic", "dynamic", "tab:blue"))


def _report(comparison: dict[str, Any], name: str) -> dict[str, Any]:
    run = comparison[name]
    report: dict[str, Any] = run.get("report", run)
    return report


def _finish(figure: Any, axes: tuple[Any, ...], title: str, out: Path) -> Path:
    """Legends, grids and the title; the figure written small (committed results)."""
    import matplotlib.pyplot as plt

    for axis in axes:
        if axis.get_legend_handles_labels()[0]:  # an empty panel (nothing scraped) has none
            axis.legend(loc="upper right", fontsize="small")
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=64)
    plt.close(figure)
    return out


def draw_comparison(comparison: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    figure, (load, latency, level) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    pool = _report(comparison, "dynamic")["timeline"][0]["kv_usage"]
    busiest = max(
        pool, key=lambda name: _report(comparison, "dynamic")["utilisation_by_pool"][name]
    )
    for name, label, colour in RUNS:
        report = _report(comparison, name)
        timeline = report["timeline"]
        times = [s["at_s"] for s in timeline]
        load.plot(times, [s["kv_usage"][busiest] for s in timeline], color=colour, label=label)
        series = report["p99_ttft_series"]
        latency.plot(
            [b["at_s"] for b in series],
            [b["critical"] for b in series],
            color=colour,
            label=f"{label}: critical",
        )
        latency.plot(
            [b["at_s"] for b in series],
            [b["all"] for b in series],
            color=colour,
            linestyle=":",
            label=f"{label}: all tiers",
        )
        level.step(times, [s["levels"][busiest] for s in timeline], color=colour, label=label)
        if name == "dynamic":
            load.plot(
                times,
                [s["multipliers"]["sheddable"] for s in timeline],
                color=colour,
                linestyle="--",
                label="dynamic: sheddable multiplier",
            )
            # What sheddable may fill: its share plus the KV reserve lent to it (budget.lending).
            lent = [
                (t, value)
                for t, _, what, value in report.get("kv_lending") or []
                if what == f"kv_lend:sheddable:{busiest}"
            ]
            if lent:
                base = BreakerConfig().kv_shares[Tier.SHEDDABLE]  # the simulator's policy's
                load.step(
                    [0.0, *(t for t, _ in lent)],
                    [base, *(base + value for _, value in lent)],
                    where="post",
                    color=colour,
                    linestyle="-.",
                    linewidth=0.8,
                    label="dynamic: sheddable KV share (lent)",
                )
    for start, end in comparison.get("bursts", []):
        for axis in (load, latency, level):
            axis.axvspan(start, end, color="tab:orange", alpha=0.15)
    load.set_ylabel(f"KV-cache usage ({busiest})")
    load.set_ylim(0, 1.1)
    latency.set_ylabel("P99 TTFT s (10 s of arrivals)")
    latency.set_yscale("log")
    level.set_ylabel("breaker level")
    level.set_yticks([0, 1, 2, 3])
    level.set_xlabel("simulated time s (bursts shaded)")
    return _finish(
        figure, (load, latency, level), f"{comparison['workload']} (seed {comparison['seed']})", out
    )


LIVE_COLOURS = ("tab:blue", "tab:gray", "tab:green")


def draw_live(runs: dict[str, dict[str, Any]], out: Path, bin_s: float = 10.0) -> Path:
    """`slogate loadtest` runs (one, or each mode of `--compare`) on shared axes in workload
    seconds: the busiest pool's KV-cache usage and running requests from its scrapes, P99
    TTFT of the streams that arrived in each `bin_s`, and the breaker level with the
    sheddable tier's quota multiplier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (load, latency, level) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for (mode, run), colour in zip(runs.items(), LIVE_COLOURS, strict=False):
        scale = run["time_scale"]
        timeline = run["timeline"]
        pools = {p for row in timeline for p in row["pools"]}
        # Against `--url` nothing of the fleet is scraped: the streams' latency only.
        busiest = max(
            sorted(pools),
            key=lambda p: sum(
                r["pools"].get(p, {}).get("num_requests_running", 0.0) for r in timeline
            ),
            default=None,
        )
        times = [row["at_s"] / scale for row in timeline]
        if busiest is not None:
            usage = [r["pools"].get(busiest, {}).get("kv_cache_usage_perc", 0.0) for r in timeline]
            load.plot(times, usage, color=colour, label=f"{mode}: KV usage ({busiest})")
        bins: dict[int, list[float]] = {}
        for shot in run["shots"]:
            if shot["stream"] and shot["status"] == 200 and shot["ttft_s"] is not None:
                at = int(shot["scheduled_s"] / scale // bin_s)
                bins.setdefault(at, []).append(shot["ttft_s"] / scale)
        ordered = sorted(bins)
        p99s = [quantile(bins[b], 0.99, empty=math.nan) for b in ordered]
        latency.plot([b * bin_s for b in ordered], p99s, color=colour, label=f"{mode}: streams")
        if busiest is not None:
            levels = [r["breakers"].get(busiest, 0.0) for r in timeline]
            level.step(times, levels, color=colour, label=f"{mode}: breaker ({busiest})")
        shed = [r["multipliers"].get("sheddable", 1.0) for r in timeline]
        level.plot(times, shed, color=colour, linestyle="--", label=f"{mode}: sheddable x")
    first = next(iter(runs.values()))
    load.set_ylabel("KV-cache usage")
    load.set_ylim(0, 1.1)
    latency.set_ylabel(f"P99 TTFT s ({bin_s:g} s of arrivals)")
    latency.set_yscale("log")
    level.set_ylabel("level / multiplier")
    level.set_xlabel("workload time s")
    title = f"loadtest {first['workload']} at time scale {first['time_scale']}"
    return _finish(figure, (load, latency, level), title, out)
