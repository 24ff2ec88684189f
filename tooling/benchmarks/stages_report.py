"""The page of `slogate bench stages` (tooling.benchmarks.stages): its tables in
Markdown, from the report's JSON (a finished run re-renders the same way)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tooling.benchmarks.profile import table as spy_table


def _processors(report: Mapping[str, Any], profile: str) -> list[str]:
    return list(report["threads_median"][profile])


def stage_table(report: Mapping[str, Any], profile: str) -> list[tuple[str, dict[str, float]]]:
    """Per stage, each processor's µs per request on its event loop thread: its profile's
    share times its loop thread's unprofiled CPU per request; this checkout's largest first."""
    rows: dict[str, dict[str, float]] = {}
    for processor in _processors(report, profile):
        loop_us = report["threads_median"][profile][processor].get("event loop thread", 0.0)
        share = report["profiles"][profile][processor]["profile"]["share"]
        for stage, fraction in share.items():
            rows.setdefault(stage, {})[processor] = fraction * loop_us
    return sorted(rows.items(), key=lambda item: -item[1].get("slogate", 0.0))


def _in_process_markdown(report: Mapping[str, Any]) -> list[str]:
    lines = [
        "## In process (no gRPC): CPU per request by phase and stage",
        "",
        f"The sidecar's servicers driven with Envoy's messages, {report['requests_in_process']}"
        " requests per run (after 200 of warm-up), the process's CPU time per phase; the "
        "median of the rounds' means. Stage µs: the phases' total x the stage's share of a "
        "cProfile of the same requests.",
        "",
    ]
    for profile, arms in report["in_process"].items():
        names = list(arms)
        lines += [f"### {profile}", ""]
        lines.append("| CPU µs per request | " + " | ".join(names) + " |")
        lines.append("| --- |" + " ---: |" * len(names))
        phases = list(arms[names[0]]["cpu_us_per_request"])
        for phase in phases:
            cells = " | ".join(f"{arms[n]['cpu_us_per_request'][phase]:.0f}" for n in names)
            lines.append(f"| {phase} | {cells} |")
        totals = {n: sum(arms[n]["cpu_us_per_request"].values()) for n in names}
        lines.append(
            "| **all three** | " + " | ".join(f"**{totals[n]:.0f}**" for n in names) + " |"
        )
        lines += ["", "| stage | " + " | ".join(f"{n} µs" for n in names) + " |"]
        lines.append("| --- |" + " ---: |" * len(names))
        stages = sorted(
            {stage for n in names for stage in arms[n]["stage_share"]},
            key=lambda stage: -arms["slogate"]["stage_share"].get(stage, 0.0),
        )
        for stage in stages:
            cells = " | ".join(
                f"{arms[n]['stage_share'].get(stage, 0.0) * totals[n]:.0f}" for n in names
            )
            lines.append(f"| {stage} | {cells} |")
        lines.append("")
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    baseline = report.get("baseline")
    lines = [
        f"# Sidecar cost per stage ({report['when']})",
        "",
        f"{report['machine']['cpus']} CPUs, Python {report['machine']['python']}; commit "
        f"{report.get('commit')}"
        + (f", baseline {report.get('baseline_commit')} ({baseline})" if baseline else "")
        + f"; {report['rounds']} interleaved rounds. Bodies as `bench overhead`'s.",
        "",
        *_in_process_markdown(report),
    ]
    if "threads_median" not in report:
        return "\n".join(lines) + "\n"
    lines += [
        "## Through Envoy and gRPC, 16 connections",
        "",
        f"Runs of {report['seconds']:g} s per processor and round (medians), then one "
        "yappi-profiled run of each. Threads: measured (/proc), not scaled. Stage µs = the "
        "stage's share of the yappi profile (own time of the functions in its files, "
        "tooling/benchmarks/stage_map.py STAGES) x the event loop thread's unprofiled CPU per "
        "request (yappi inflates Python calls, not C: counting, mostly C, reads low here).",
        "",
    ]
    for profile in report["threads_median"]:
        threads = report["threads_median"][profile]
        rps = report["rps_median"][profile]
        names = _processors(report, profile)
        lines += [f"### {profile}", ""]
        lines.append(
            "| CPU per request (µs) | " + " | ".join(names) + " | slogate / pass-through |"
        )
        lines.append("| --- |" + " ---: |" * (len(names) + 1))
        kinds = sorted({kind for n in names for kind in threads[n]})
        for kind in kinds:
            base = threads["passthrough"].get(kind, 0.0)
            ratio = f"{threads['slogate'].get(kind, 0.0) / base:.2f}x" if base else "-"
            cells = " | ".join(f"{threads[n].get(kind, 0.0):.0f}" for n in names)
            lines.append(f"| {kind} | {cells} | {ratio} |")
        totals = {n: sum(threads[n].values()) for n in names}
        cells = " | ".join(f"**{totals[n]:.0f}**" for n in names)
        ratio = totals["slogate"] / max(totals["passthrough"], 1e-9)
        lines.append(f"| **all threads** | {cells} | **{ratio:.2f}x** |")
        cells = " | ".join(f"{rps[n]:.0f}" for n in names)
        lines.append(
            f"| req/s at 16 connections | {cells} "
            f"| {rps['slogate'] / max(rps['passthrough'], 1e-9):.2f}x |"
        )
        prof = {n: report["profiles"][profile][n]["profile"] for n in names}
        for key, label in (
            ("loop_callbacks_per_request", "event-loop callbacks per request (yappi)"),
            ("tasks_per_request", "tasks per request (yappi)"),
            ("calls_per_request", "Python calls per request (yappi)"),
        ):
            cells = " | ".join(f"{prof[n][key]:.1f}" for n in names)
            lines.append(f"| {label} | {cells} | - |")
        lines += ["", "| stage (event loop thread), µs/req | " + " | ".join(names) + " |"]
        lines.append("| --- |" + " ---: |" * len(names))
        for stage, by in stage_table(report, profile):
            lines.append(
                f"| {stage} | " + " | ".join(f"{by.get(n, 0.0):.0f}" for n in names) + " |"
            )
        lines.append("")
    if report.get("py_spy"):
        lines += ["### py-spy on this checkout's unprofiled sidecar (last round)", ""]
        lines.append(spy_table(report["py_spy"]))
    return "\n".join(lines) + "\n"
