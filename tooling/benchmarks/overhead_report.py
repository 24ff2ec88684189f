"""The report of `slogate bench overhead` (tooling.benchmarks.overhead): its JSON, its
table and its Markdown; `write` also re-renders a finished run's JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tooling.benchmarks import vs_litellm
from tooling.benchmarks.profile import table as profile_table
from tooling.benchmarks.reports import write_report

LITELLM_NOTE = (
    "litellm: LiteLLM's proxy ({}, one worker process, no Envoy in front: what a user runs "
    "instead), the same upstream and bodies, the bench key given RPM and TPM limits (and "
    "parallel requests) too large to reach, checked and charged on every request by its "
    "parallel-request limiter (custom_auth, no database; tooling/benchmarks/litellm_arm.py); "
    "its CPU: its whole process tree, in the processor column. upstream_direct: wrk straight "
    "to the upstream Envoy. slogate_redis / litellm_redis: each with its limits in a real "
    "Redis (the Redis server's CPU is counted for neither). "
)
VS_LITELLM_NOTE = (
    "p50 overhead: p50 at 1 connection minus upstream_direct's (the zero for both; LiteLLM "
    "has no Envoy hop). Throughput per core: 1e6 / the gateway's CPU µs per request at 16 "
    "connections (slogate: sidecar + its Envoy; LiteLLM: its tree). Target: slogate ahead "
    "on both."
)


def _table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| body | setup | p50 ms (1 conn) | p99 ms (1 conn) | req/s (16 conn) | p50 ms (16 conn) "
        "| p99 ms (16 conn) | throughput vs pass-through | p50 vs pass-through "
        "| processor CPU µs/req | Envoy CPU µs/req | req/s per core | non-2xx |",
        "| --- | --- |" + " ---: |" * 11,
    ]

    def cell(value: float | None, form: str = ".0f") -> str:
        return "-" if value is None else format(value, form)

    for profile, setups in summary.items():
        base = setups["passthrough"]
        for setup, row in setups.items():
            # The processor: the pass-through, the sidecar, or LiteLLM's proxy (no Envoy).
            processor = row.get("cpu_us_per_request_sidecar", row.get("cpu_us_per_request_litellm"))
            label = f"{setup} (no Envoy)" if setup.startswith("litellm") else setup
            lines.append(
                f"| {profile} | {label} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} "
                f"| {row['rps_16']:.0f} | {cell(row.get('p50_ms_16'), '.2f')} "
                f"| {row['p99_ms_16']:.2f} | {row['rps_16'] / base['rps_16']:.2f}x "
                f"| {row['p50_ms'] - base['p50_ms']:+.3f} ms | {cell(processor)} "
                f"| {cell(row.get('cpu_us_per_request_envoy'))} "
                f"| {cell(vs_litellm.per_core(row))} | {row['non_2xx']:.0f} |"
            )
    return "\n".join(lines)


def write(report: Mapping[str, Any], out_dir: Path, name: str = "overhead") -> None:
    """The report's JSON and its table (also to re-render a finished run's JSON)."""
    summary, verdicts = report["summary_median"], report["verdicts"]
    targets = report["targets"]
    table = _table(summary)
    verdict_lines = "\n".join(
        f"- {profile}: {v['throughput_ratio_vs_passthrough']:.2f}x throughput, "
        f"{v['p50_delta_ms_vs_passthrough']:+.3f} ms p50"
        + (
            f", sidecar CPU {v['cpu_ratio_vs_passthrough']:.2f}x, p50 "
            f"{v['p50_ratio_vs_passthrough']:.2f}x"
            if "cpu_ratio_vs_passthrough" in v
            else ""
        )
        + f": {'met' if v['met'] else 'not met'}"
        for profile, v in verdicts.items()
    )
    litellm_lines = vs_litellm.lines(report.get("vs_litellm") or {})
    seen = report.get("sidecar_profile") or {}
    litellm_seen = report.get("litellm_profile") or {}
    levers = report.get("levers") or {}
    write_report(
        out_dir,
        name,
        report,
        f"# Overhead benchmark ({report['when']})\n\n{report['machine']['cpus']} CPUs, "
        f"{report['rounds']} interleaved rounds of {report['duration_s']:g} s per setup and "
        "load, medians.\n"
        "Bodies: small = the 4 KB chat body; the others from tooling/benchmarks/bodies.py, "
        "every request's last message new. Upstream: Envoy direct_response. "
        "slogate_uncounted: the same sidecar with every prompt at its byte bound (no "
        "tokenizer): what the path costs without counting (its non-2xx are prompts the bound "
        "puts over the model's window, refused 400). passthrough_one_message: the "
        "pass-through with ext_proc getting the body alone (data_path.messages: one, "
        "tooling/render/envoy_config/one_message.py)"
        ". CPU µs per request: the processor's (pass-through or sidecar, all its threads and "
        "children) and the front Envoy's CPU over the 16-connection run, divided by its "
        "requests.\n\n"
        + (LITELLM_NOTE.format(report["litellm"]) if report.get("litellm") else "")
        + "".join(f"slogate+{k}: slogate with {json.dumps(v)}. " for k, v in levers.items())
        + f"\n\n{table}\n\nTargets: >= {targets['throughput_ratio']}x the pass-through's "
        f"throughput and <= +{targets['p50_delta_ms']} ms p50 over it"
        + (
            f"; sidecar CPU per request <= {targets['cpu_ratio']}x the pass-through's and p50 "
            f"<= {targets['p50_ratio']}x its"
            if "cpu_ratio" in targets
            else ""
        )
        + ". "
        f"All responses 2xx: {report['all_responses_2xx']}.\n\n{verdict_lines}\n"
        + (f"\n### vs LiteLLM\n\n{VS_LITELLM_NOTE}\n\n{litellm_lines}\n" if litellm_lines else "")
        + (
            "\n## Where the sidecar's time goes (py-spy, 16 connections, last round)\n\n"
            + profile_table(seen)
            if seen
            else ""
        )
        + (
            "\n## Where LiteLLM's time goes (py-spy, 16 connections, last round)\n\n"
            + profile_table(litellm_seen)
            if litellm_seen
            else ""
        ),
        indent=2,
    )
    print(table)
    print(verdict_lines)
    if litellm_lines:
        print(litellm_lines)
