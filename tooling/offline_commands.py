"""The `slogate` commands that run offline: calibrate, simulate, bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from sim.fleet.workload_files import SIMULATION_POLICY


def cmd_calibrate(args: argparse.Namespace) -> int:
    import aiohttp

    from policy import load_policy
    from tooling.calibrate import CalibrationError, Measurement, measure, report

    if args.requests < 1 or args.per_size < 1 or args.max_context < 512:
        print(
            "slogate calibrate: --requests and --per-size must be >= 1, --max-context >= 512",
            file=sys.stderr,
        )
        return 2
    policy = load_policy(args.policy)
    targets = []
    for index, value in enumerate(args.url):
        name, sep, url = value.partition("=")
        if not sep or "://" in name:
            name, url = ("default" if index == 0 else f"pool{index + 1}"), value
        targets.append((name, url))

    async def run() -> list[Measurement]:
        return [
            await measure(
                name,
                url,
                args.model or policy.model_name,
                policy.buckets,
                tiny_count=args.requests,
                per_size=args.per_size,
                max_context=args.max_context,
                api_key=args.api_key,
            )
            for name, url in targets
        ]

    try:
        measurements = asyncio.run(run())
    except (CalibrationError, OSError, TimeoutError, aiohttp.ClientError, ValueError) as error:
        print(f"slogate calibrate: {error}", file=sys.stderr)
        return 1
    text = report(measurements, policy.buckets)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
        print(f"# wrote {args.out}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from sim.fleet.workload_files import WORKLOADS, load_workload, workload_path
    from sim.studies.scenarios import compare, gains, table

    if args.engines:
        return _engines(args)
    path = workload_path(args.workload)
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in WORKLOADS.glob("*.yaml")))
        print(f"slogate: no workload {args.workload!r}; have: {names}", file=sys.stderr)
        return 2
    latency = None
    if args.latency_from is not None:
        from policy import load_policy
        from sim.server.calibration import latency_config

        measured = load_policy(args.latency_from)
        fit = measured.latency_models.get(measured.default_pool)
        if fit is None:
            print(
                f"slogate: {args.latency_from} has no latency_model for its default pool",
                file=sys.stderr,
            )
            return 2
        latency = latency_config(fit, measured.buckets)
    workload = load_workload(path, SIMULATION_POLICY, scale=args.scale)
    # The name the reports are written under: a file's stem, and the scale when not 1.
    args.workload = path.stem + (f"-x{args.scale:g}" if args.scale != 1.0 else "")
    if args.duration_s is not None:
        workload = workload.first(args.duration_s)
    if args.waiting_room:
        return _waiting_room(args, workload, latency)
    if args.sidecars:
        return _sidecars(args, workload, latency)
    comparison = compare(workload, seed=args.seed, latency=latency, processes=os.cpu_count() or 1)
    comparison["gains"] = gains(comparison)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"simulate-{args.workload}.json"
    out.write_text(json.dumps(comparison, separators=(",", ":")) + "\n")  # raw: see the .md
    text = table(comparison)
    out.with_suffix(".md").write_text(
        f"# slogate simulate --workload {args.workload} --seed {args.seed}\n\n{text}\n"
    )
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    try:
        from sim.studies.plots import draw_comparison

        print(f"wrote {draw_comparison(comparison, out.with_suffix('.png'))}")
    except ImportError:
        print("no plots: matplotlib is not installed (pip install 'slogate[sim]')")
    return 0


def _engines(args: argparse.Namespace) -> int:
    from sim.studies.engine_compare import compare_picking, picking_table

    report = compare_picking(
        duration_s=args.duration_s or 60.0, seed=args.seed, progress=lambda line: print(line)
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "simulate-engines.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    text = picking_table(report)
    out.with_suffix(".md").write_text(
        f"# slogate simulate --engines --seed {args.seed} (each run {report['duration_s']:g} s)"
        f"\n\n{text}\n"
    )
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench == "overhead":
        from tooling.benchmarks.overhead import run as run_overhead

        run_overhead(
            args.out_dir,
            args.duration_s,
            args.rounds,
            args.profiles.split(","),
            spy=not args.no_spy,
            levers=[lever for lever in args.levers.split(",") if lever],
            name=args.name,
            litellm=args.litellm,
        )
    elif args.bench == "tenants":
        from tooling.benchmarks.tenants import run as run_tenants

        run_tenants(args.out_dir, args.seconds, args.tenants, args.keys)
    elif args.bench == "decision-cost":
        from tooling.benchmarks.decision_cost import run as run_decision_cost

        run_decision_cost(
            args.out_dir,
            args.seconds,
            args.profiles.split(",") if args.profiles else None,
            [lever for lever in args.levers.split(",") if lever],
        )
    elif args.bench == "workers":
        from tooling.benchmarks.workers import run as run_workers

        counts = [int(n) for n in args.workers.split(",")]
        run_workers(args.out_dir, args.duration_s, args.rounds, args.profile, counts)
    elif args.bench == "engines-vllm":
        from tooling.benchmarks.engines_live import run as run_engines_live

        run_engines_live(args.out_dir, args.chats)
    elif args.bench == "packing-vllm":
        from tooling.benchmarks.packing import run as run_packing

        run_packing(args.out_dir, args.seconds, args.rate, args.window_ms)
    elif args.bench == "prefix-index":
        from tooling.benchmarks.prefix_index import run as run_prefix_index

        run_prefix_index(args.out_dir, args.prompts)
    elif args.bench == "tenant-series":
        from tooling.benchmarks.tenant_series import run as run_tenant_series

        run_tenant_series(args.out_dir, args.calls, args.rounds)
    elif args.bench == "tracing":
        from tooling.benchmarks.tracing_cost import run as run_tracing

        run_tracing(args.out_dir, args.requests, args.rounds)
    elif args.bench == "decisions":
        from tooling.benchmarks.decisions import run as run_decisions

        run_decisions(args.out_dir, args.calls)
    else:
        from tooling.benchmarks.estimator import run as run_estimator

        run_estimator(args.out_dir)
    return 0


def _write_report(
    args: argparse.Namespace, stem: str, title: str, report: dict[str, Any], text: str
) -> int:
    """A report as JSON (raw) and Markdown (`text` under `title`) in --out-dir; printed."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{stem}.json"
    out.write_text(json.dumps(report, separators=(",", ":")) + "\n")
    out.with_suffix(".md").write_text(f"# {title}\n\n{text}\n")
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def _waiting_room(args: argparse.Namespace, workload: Any, latency: Any) -> int:
    from sim.studies.room_reports import waiting_room_report, waiting_room_table

    seeds = (args.seed, args.seed + 4)
    report = waiting_room_report(workload, seeds, latency)
    seeds_text = " and ".join(str(s) for s in seeds)
    title = f"slogate simulate --workload {args.workload} --waiting-room (seeds {seeds_text})"
    return _write_report(
        args, f"waiting-room-{args.workload}", title, report, waiting_room_table(report)
    )


def _sidecars(args: argparse.Namespace, workload: Any, latency: Any) -> int:
    from sim.studies.room_reports import sidecars_report, sidecars_table

    split = tuple(float(part) for part in args.sidecars.split(","))
    seeds = (args.seed, args.seed + 4)
    report = sidecars_report(workload, split, seeds, latency)
    seeds_text = " and ".join(str(s) for s in seeds)
    title = (
        f"slogate simulate --workload {args.workload} --sidecars {args.sidecars} "
        f"(seeds {seeds_text})"
    )
    return _write_report(args, f"sidecars-{args.workload}", title, report, sidecars_table(report))
