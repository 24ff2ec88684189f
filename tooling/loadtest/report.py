"""`slogate loadtest`'s report: per tier, tenant and pool (statuses, P50/P99 TTFT and
latency, SLO attainment, goodput), and its markdown tables (one run; modes side by side)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from breaker.objectives import latency_objective_s
from policy.domain import Tier
from policy.quantiles import quantile
from policy.schema import Policy
from tooling.loadtest.cpu_share import IDLE, OTHERS
from tooling.loadtest.shots import GENERATOR_STALL_S, Shot


def _objective_s(policy: Policy, shot: Shot) -> float | None:
    bucket = policy.bucket_for(shot.prompt_tokens + shot.max_tokens).name
    return latency_objective_s(
        policy, Tier(shot.tier), bucket, shot.stream, shot.completion_tokens, shot.tenant
    )


def _within(policy: Policy, shot: Shot, time_scale: float) -> bool:
    objective = _objective_s(policy, shot)
    if objective is None or shot.ttft_s is None:
        return objective is None
    return shot.ttft_s / time_scale <= objective


def misses(shots: Sequence[Shot], policy: Policy, time_scale: float) -> dict[str, Any]:
    """Why requests missed their objective: refused (4xx, by status and reason), failed
    (5xx or no answer, by status and reason), or served late. For the late ones: by how much
    (TTFT over the objective, workload seconds, median and max), where their time went
    (median seconds to the response's headers: the generator, Envoy, the sidecar and its
    waiting room; then to the first token: the engine's queue and prefill — vLLM sends a
    stream's headers with its first output, so this split is a lower bound on the part
    before the engine), and how many left late or lived through a stall of the generator."""
    refused: dict[str, int] = {}
    failed: dict[str, int] = {}
    late: list[tuple[Shot, float]] = []
    for shot in shots:
        name = str(shot.status) + (f" {shot.reason}" if shot.reason else "")
        if shot.status == 0 or shot.status >= 500:
            failed[name] = failed.get(name, 0) + 1
        elif shot.status != 200:
            refused[name] = refused.get(name, 0) + 1
        elif shot.ttft_s is not None and not _within(policy, shot, time_scale):
            objective = _objective_s(policy, shot)
            late.append((shot, shot.ttft_s / time_scale - (objective or 0.0)))

    def median(values: list[float]) -> float | None:
        return quantile(values, 0.5, empty=None)

    return {
        "refused": dict(sorted(refused.items())),
        "failed": dict(sorted(failed.items())),
        "late": len(late),
        "late_over_objective_p50_s": median([over for _, over in late]),
        "late_over_objective_max_s": max((over for _, over in late), default=None),
        "late_to_headers_p50_s": median(
            [s.headers_s / time_scale for s, _ in late if s.headers_s is not None]
        ),
        "late_headers_to_first_token_p50_s": median(
            [
                (s.ttft_s - s.headers_s) / time_scale
                for s, _ in late
                if s.headers_s is not None and s.ttft_s is not None
            ]
        ),
        "late_left_late": sum(1 for s, _ in late if s.lag_s > GENERATOR_STALL_S),
        "late_generator_held": sum(1 for s, _ in late if s.generator_held),
    }


def _summary(
    shots: Sequence[Shot], policy: Policy, time_scale: float, duration_s: float | None = None
) -> dict[str, Any]:
    served = [s for s in shots if s.status == 200 and s.ttft_s is not None]
    statuses: dict[str, int] = {}
    for s in shots:
        name = str(s.status) + (f" {s.reason}" if s.reason else "")
        statuses[name] = statuses.get(name, 0) + 1

    def scaled(values: list[float], q: float) -> float | None:
        value = quantile(values, q, empty=None)
        return None if value is None else value / time_scale

    calm = [s for s in served if s.judged]
    within = [s for s in served if _within(policy, s, time_scale)]
    ttfts = [s.ttft_s for s in served if s.ttft_s is not None]
    latencies = [s.latency_s for s in served if s.latency_s is not None]
    return {
        "requests": len(shots),
        "served": len(served),
        "statuses": dict(sorted(statuses.items())),
        "p50_ttft_s": scaled(ttfts, 0.5),
        "p99_ttft_s": scaled(ttfts, 0.99),
        "p50_latency_s": scaled(latencies, 0.5),
        "p99_latency_s": scaled(latencies, 0.99),
        "slo_attainment": len(within) / len(served) if served else None,
        # As the simulator counts it (sim.studies.scenarios.summarize): a refusal is a miss.
        "slo_attainment_of_all": len(within) / len(shots) if shots else None,
        # Completion tokens of the answers within their SLO, per workload second.
        "goodput_tokens_per_s": (
            sum(s.completion_tokens or 0 for s in within) / duration_s if duration_s else None
        ),
        "slo_attainment_outside_faults": (
            sum(_within(policy, s, time_scale) for s in calm) / len(calm) if calm else None
        ),
        "server_errors_outside_faults": sum(
            1 for s in shots if (s.status >= 500 or s.status == 0) and s.judged
        ),
        # Outside faults but not judged: the generator was held while they were alive.
        "generator_held": sum(1 for s in shots if s.generator_held and not s.during_fault),
        "tokens_received": sum(s.completion_tokens or 0 for s in served),
    }


def report(
    shots: Sequence[Shot],
    policy: Policy,
    time_scale: float,
    workload: str,
    processes: Mapping[str, Mapping[str, float]] | None = None,
    cpu: Mapping[str, Any] | None = None,
    after_drain: Mapping[str, int] | None = None,
    faults: Sequence[Mapping[str, Any]] = (),
    stalls: Sequence[tuple[float, float]] = (),
    signals: Mapping[str, Any] | None = None,
    timeline: Sequence[Mapping[str, Any]] = (),
    duration_s: float | None = None,
    bursts: Sequence[tuple[float, float]] = (),
    burst_tenants: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """`duration_s`: the workload's (for goodput); `bursts` and `burst_tenants`: its burst
    windows in workload seconds and whose requests count there (burst handling, as the
    simulator reports it: the share of those requests served within their SLO); `stalls`:
    the generator's own (real seconds after the start)."""
    lags = [s.lag_s for s in shots]
    in_burst = [
        s
        for s in shots
        if (not burst_tenants or s.tenant in burst_tenants)
        and any(a <= s.scheduled_s / time_scale < b for a, b in bursts)
    ]
    handled = [
        s
        for s in in_burst
        if s.status == 200 and s.ttft_s is not None and _within(policy, s, time_scale)
    ]
    return {
        "all": _summary(shots, policy, time_scale, duration_s),
        "burst_handling": len(handled) / len(in_burst) if in_burst else None,
        "faults": list(faults),
        "generator_stalls": [{"from_s": a, "to_s": b} for a, b in stalls],
        "signals": dict(signals or {}),
        "timeline": list(timeline),
        "processes": dict(processes or {}),
        "cpu": dict(cpu or {}),
        "after_drain": dict(after_drain or {}),
        "workload": workload,
        "time_scale": time_scale,
        "tiers": {
            tier.value: _summary(
                [s for s in shots if s.tier == tier.value], policy, time_scale, duration_s
            )
            for tier in Tier
        },
        "misses": {
            tier.value: misses([s for s in shots if s.tier == tier.value], policy, time_scale)
            for tier in Tier
        },
        "tenants": {
            tenant: _summary(
                [s for s in shots if s.tenant == tenant], policy, time_scale, duration_s
            )
            for tenant in sorted({s.tenant for s in shots})
        },
        "pools": pool_answers(shots),
        # Real seconds, unscaled: how late the generator sent.
        "lag_p99_s": quantile(lags, 0.99, empty=None),
        "lag_max_s": max(lags, default=None),
        "errors_without_json": sum(1 for s in shots if s.status != 200 and not s.error_json),
        "shots": [asdict(s) for s in shots],
    }


def pool_answers(shots: Sequence[Shot]) -> dict[str, dict[str, int]]:
    """Per pool, the requests it answered (x-slogate-pool, which Envoy's pool routes add):
    how many, served, and 5xx (an injected fault, a full engine queue). slogate's own
    refusals (they carry x-slogate-reason) are left out: Envoy names the route it had
    picked before the decision on them, not a pool that saw them."""
    pools: dict[str, dict[str, int]] = {}
    for shot in shots:
        if shot.pool and not shot.reason:
            row = pools.setdefault(shot.pool, {"requests": 0, "served": 0, "server_errors": 0})
            row["requests"] += 1
            row["served"] += shot.status == 200
            row["server_errors"] += shot.status >= 500
    return dict(sorted(pools.items()))


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A table after a blank line; nothing without rows."""
    if not rows:
        return []
    return [
        "",
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _format(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def cpu_table(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """ "CPU share per process", one column per run: each process tree's cores (CPU seconds
    per wall second) and its share of the machine, then everyone else's and idle; the load
    average read meanwhile."""
    cpus = {mode: run.get("cpu") or {} for mode, run in runs.items()}
    names: list[str] = []
    for cpu in cpus.values():
        names += [n for n in cpu.get("rows", {}) if n not in names]
    order = [n for n in names if n not in (OTHERS, IDLE)] + [
        n for n in (OTHERS, IDLE) if n in names
    ]
    rows = []
    for name in order:
        cells = []
        for cpu in cpus.values():
            row = cpu.get("rows", {}).get(name)
            cells.append("-" if row is None else f"{row['cores']:.2f} ({row['share']:.0%})")
        rows.append((name, *cells))
    lines = _markdown(("CPU share per process: cores (of the machine)", *cpus), rows)
    if lines:
        cores = {int(cpu["cores"]) for cpu in cpus.values() if cpu.get("cores")}
        loads = "; ".join(
            f"{mode} mean {_format(cpu.get('load1_mean'))}, max {_format(cpu.get('load1_max'))}"
            for mode, cpu in cpus.items()
        )
        lines += [
            "",
            f"the machine's cores: {', '.join(str(c) for c in sorted(cores))}; its 1-minute "
            f"load average over the run: {loads}",
        ]
    return lines


def misses_lines(runs: Mapping[str, Mapping[str, Any]], tier: str) -> list[str]:
    """One line per run: why `tier`'s requests missed (report.misses)."""
    lines = []
    for mode, run in runs.items():
        got = (run.get("misses") or {}).get(tier)
        if not got:
            continue
        refused = ", ".join(f"{k}: {v}" for k, v in got["refused"].items()) or "none"
        failed = ", ".join(f"{k}: {v}" for k, v in got["failed"].items()) or "none"
        late = f"served late {got['late']}"
        if got["late"]:
            late += (
                f" (over the objective by p50 {_format(got['late_over_objective_p50_s'])} s, "
                f"max {_format(got['late_over_objective_max_s'])} s; p50 "
                f"{_format(got['late_to_headers_p50_s'])} s to the headers, then "
                f"{_format(got['late_headers_to_first_token_p50_s'])} s to the first token; "
                f"{got['late_left_late']} left late, {got['late_generator_held']} lived "
                f"through a stall of the generator)"
            )
        lines.append(f"{mode}: {tier}'s misses: refused {refused}; failed {failed}; {late}")
    return ["", *lines] if lines else []


def table(result: dict[str, Any]) -> str:
    lines = [
        f"loadtest {result['workload']} at time scale {result['time_scale']} (times in "
        f"workload seconds); arrivals late by p99 {_format(result['lag_p99_s'], '{:.3f}')} s, "
        f"at most {_format(result['lag_max_s'], '{:.3f}')} s (real)",
        "",
        "| who | requests | served | p50 TTFT | p99 TTFT | p99 latency | SLO attainment "
        "| goodput tok/s | statuses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [("all", result["all"])] if "all" in result else []
    rows += [(f"tier {k}", v) for k, v in result["tiers"].items()]
    rows += [(f"tenant {k}", v) for k, v in result["tenants"].items()]
    for name, row in rows:
        statuses = ", ".join(f"{k}: {v}" for k, v in row["statuses"].items())
        lines.append(
            f"| {name} | {row['requests']} | {row['served']} | {_format(row['p50_ttft_s'])} | "
            f"{_format(row['p99_ttft_s'])} | {_format(row['p99_latency_s'])} | "
            f"{_format(row['slo_attainment'], '{:.3f}')} | "
            f"{_format(row.get('goodput_tokens_per_s'), '{:.0f}')} | {statuses} |"
        )
    processes = result.get("processes") or {}
    lines += _markdown(
        ("process", "CPU (share of a core)", "RSS start MiB", "RSS end MiB"),
        [
            (name, f"{r['cpu_share']:.2f}", f"{r['rss_start_mib']:.0f}", f"{r['rss_end_mib']:.0f}")
            for name, r in processes.items()
        ],
    )
    lines += cpu_table({"run": result})
    lines += misses_lines({"run": result}, Tier.CRITICAL.value)
    signals = result.get("signals") or {}
    answered = result.get("pools") or {}
    columns = ("pool", "routed", "served", "5xx", "KV mean", "KV max", "running mean")
    lines += _markdown(
        (*columns, "running max", "waiting max", "preemptions"),
        [
            (
                pool,
                _format(answered.get(pool, {}).get("requests"), "{:.0f}"),
                _format(answered.get(pool, {}).get("served"), "{:.0f}"),
                _format(answered.get(pool, {}).get("server_errors"), "{:.0f}"),
                f"{r['kv_usage_mean']:.2f}",
                f"{r['kv_usage_max']:.2f}",
                f"{r['running_mean']:.1f}",
                f"{r['running_max']:.0f}",
                f"{r['waiting_max']:.0f}",
                _format(r.get("preemptions"), "{:.0f}"),
            )
            for pool, r in (signals.get("pools") or {}).items()
        ],
    )
    if signals.get("breakers"):
        levels = ", ".join(
            f"{name} max L{row['max_level']:.0f} ({row['seconds_at_l1_or_above']:.1f} s at L1+)"
            for name, row in signals["breakers"].items()
        )
        lowest = ", ".join(f"{t} {v:.2f}" for t, v in signals["lowest_multipliers"].items())
        lines += ["", f"breakers: {levels}; lowest quota multipliers: {lowest}"]
    decision = (signals.get("decision") or {}).get("request_body") or {}
    if decision or result.get("burst_handling") is not None:
        lines += [
            "",
            f"burst handling {_format(result.get('burst_handling'), '{:.3f}')}; the sidecar's "
            f"body decision p50 <= {_format(decision.get('p50_ms'), '{:.1f}')} ms, p99 <= "
            f"{_format(decision.get('p99_ms'), '{:.1f}')} ms (its histogram's bucket bounds)",
        ]
    for window in result.get("faults", []):
        lines.append(
            f"fault: {window['fault']} (real {window['from_s']:.1f}-{window['to_s']:.1f} s)"
        )
    for stall in result.get("generator_stalls", []):
        lines.append(
            f"the load generator itself stalled (real {stall['from_s']:.1f}-"
            f"{stall['to_s']:.1f} s): the requests alive then are not judged"
        )
    if result.get("after_drain"):
        left = ", ".join(f"{k} {v}" for k, v in result["after_drain"].items())
        lines += ["", f"after the drain: {left}"]
    return "\n".join(lines)


def compare_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """The same workload and seed through each mode, side by side."""
    modes = list(runs)
    first = runs[modes[0]]
    lines = [
        f"loadtest {first['workload']} at time scale {first['time_scale']}: "
        + " vs ".join(modes)
        + " (times in workload seconds)",
    ]
    metrics = (
        ("requests", "requests", "{:.0f}"),
        ("served", "served", "{:.0f}"),
        ("p99 TTFT s", "p99_ttft_s", "{:.2f}"),
        ("p99 latency s", "p99_latency_s", "{:.2f}"),
        ("SLO attainment (of all)", "slo_attainment_of_all", "{:.3f}"),
        ("goodput tok/s", "goodput_tokens_per_s", "{:.0f}"),
        ("5xx or no answer", "server_errors", "{:.0f}"),
    )
    rows = []
    for who in ("all", *(f"tier {t.value}" for t in Tier)):
        for label, key, pattern in metrics:
            cells = []
            for mode in modes:
                run = runs[mode]
                row = run["all"] if who == "all" else run["tiers"][who.split()[1]]
                value = row.get(key)
                if key == "server_errors":
                    value = sum(
                        n
                        for status, n in row["statuses"].items()
                        if status.split()[0] == "0" or int(status.split()[0]) >= 500
                    )
                cells.append(_format(value, pattern))
            rows.append((who, label, *cells))
    lines += _markdown(("who", "metric", *modes), rows)
    pool_rows = []
    for pool in sorted({p for run in runs.values() for p in run["signals"].get("pools", {})}):
        for label, key, pattern in (
            ("KV usage max", "kv_usage_max", "{:.2f}"),
            ("waiting max", "waiting_max", "{:.0f}"),
            ("preemptions", "preemptions", "{:.0f}"),
        ):
            cells = [
                _format(runs[m]["signals"].get("pools", {}).get(pool, {}).get(key), pattern)
                for m in modes
            ]
            pool_rows.append((pool, label, *cells))
    lines += _markdown(("pool", "metric", *modes), pool_rows)
    extra = []
    for mode in modes:
        run = runs[mode]
        decision = (run["signals"].get("decision") or {}).get("request_body", {})
        extra.append(
            f"{mode}: burst handling {_format(run.get('burst_handling'), '{:.3f}')}, "
            f"decision p99 <= {_format(decision.get('p99_ms'), '{:.1f}')} ms, "
            f"arrivals late by p99 {_format(run['lag_p99_s'], '{:.3f}')} s"
        )
    lines += ["", *extra]
    lines += misses_lines(runs, Tier.CRITICAL.value)
    lines += cpu_table(runs)
    return "\n".join(lines)
