"""`slogate simulate`: the offline fleet (sim/) playing a workload under static quotas and
under the dynamic controller, waiting room, sidecars sharing a ledger, or engine picking.
The simulator is imported inside the handler: `slogate serve` loads none of it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tooling.cli.common import add_workload

DEFAULT_SEED = 7  # the published comparisons' seed: their files carry no seed in the name


def register(sub: argparse._SubParsersAction) -> None:
    simulate = sub.add_parser(
        "simulate", help="offline fleet: best static quota (sweep) vs the dynamic controller"
    )
    add_workload(simulate, "burst-10x")
    simulate.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every tenant's arrival rate (e.g. 2: the quarterly 2x test)",
    )
    simulate.add_argument("--seed", type=int, default=DEFAULT_SEED)
    simulate.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    simulate.add_argument(
        "--latency-from",
        type=Path,
        default=None,
        help="a policy with a latency_model section (slogate calibrate): play its default pool",
    )
    simulate.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="play only the workload's first this many seconds (a quick look)",
    )
    simulate.add_argument(
        "--waiting-room",
        action="store_true",
        help="dynamic control refusing a full pool at once (today), against retrying clients "
        "with and without the waiting room; seeds --seed and --seed + 4",
    )
    simulate.add_argument(
        "--sidecars",
        default=None,
        metavar="SPLIT",
        help="e.g. 0.4,0.3,0.2,0.1: one sidecar against that many sharing one KV ledger "
        "and against them with a ledger each; seeds --seed and --seed + 4",
    )
    simulate.add_argument(
        "--engines",
        action="store_true",
        help="engine picking: Envoy's round robin against slogate's, on chats, RAG and the "
        "field mix at 100/s on 4 engines and 1000/s on 40 (--duration-s, default 60 s), and "
        "an engine killed mid-run (bench/results/simulate-engines.*)",
    )
    simulate.add_argument(
        "--ahead",
        action="store_true",
        help="quotas ahead of ramps: the class-start ramp (5 min and 10 s) and a week of daily "
        "traffic (a day in 6 min), reactive only vs with the forecast vs with the calendar "
        "vs a wrong forecast (bench/results/ahead-*.md/json; --workload is not read)",
    )
    simulate.add_argument(
        "--prefix-state",
        action="store_true",
        help="llm-d's precise-prefix case scaled down: Envoy's round robin, slogate's "
        "approximate prefix index and slogate on the engines' KV events, on the same "
        "arrivals at rising load (--duration-s: each load step, default 60 s; "
        "bench/results/simulate-prefix-state.*)",
    )
    simulate.add_argument(
        "--regions",
        type=int,
        nargs="?",
        const=3,
        default=None,
        metavar="N",
        help="regions (default 3) sharing a global tenant by lease over a delayed link: its "
        "overshoot spending everywhere at 2x, a move to one region, a partition healed, a "
        "region dying, a saturated region's tolerant traffic crossing; link delay "
        "40/80/150 ms x reports every 0.5/1/2 s (bench/results/regions-sim.*; --workload "
        "is not read)",
    )
    simulate.set_defaults(handler=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    from sim.fleet.workload_files import SIMULATION_POLICY, WORKLOADS, load_workload, workload_path
    from sim.studies.scenarios import compare, gains, table

    if args.engines:
        return _engines(args)
    if args.prefix_state:
        return _prefix_state(args)
    if args.ahead:
        return _ahead(args)
    if args.regions is not None:
        return _regions(args)
    path = workload_path(args.workload)
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in WORKLOADS.glob("*.yaml")))
        print(f"slogate: no workload {args.workload!r}; have: {names}", file=sys.stderr)
        return 2
    latency = None
    if args.latency_from is not None:
        from policy.loader import load_policy
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
    if args.seed != DEFAULT_SEED:  # another seed beside the published one, not over it
        args.workload += f"-seed{args.seed}"
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


def _prefix_state(args: argparse.Namespace) -> int:
    import dataclasses

    from sim.studies.prefix_state import (
        PULLS_OFF,
        PrefixShape,
        compare_prefix_state,
        prefix_table,
    )

    shape = PrefixShape(step_s=args.duration_s or 60.0, seed=args.seed)
    report = compare_prefix_state(shape, progress=lambda line: print(line))
    pulls_off = dataclasses.replace(shape, picking=PULLS_OFF)
    report["pulls_off"] = compare_prefix_state(
        pulls_off, progress=lambda line: print(f"{line} (pulls off)")
    )
    settings = ", ".join(f"{name}: {value:g}" for name, value in PULLS_OFF)
    text = (
        f"{prefix_table(report)}\n\nThe same arrivals with the picker's competing pulls off "
        f"(engines.picking {settings}):\n\n{prefix_table(report['pulls_off'])}"
    )
    title = (
        f"slogate simulate --prefix-state --seed {args.seed} ({shape.engines} engines of "
        f"{shape.kv_tokens:,} KV tokens, {shape.customers} customers, each load step "
        f"{shape.step_s:g} s)"
    )
    return _write_report(args, "simulate-prefix-state", title, report, text)


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


def _regions(args: argparse.Namespace) -> int:
    from sim.studies.regions_report import sweep, table
    from sim.studies.regions_setup import RegionsSetup, region_names

    if args.regions < 2:
        print("slogate: --regions needs at least 2 regions", file=sys.stderr)
        return 2
    setup = RegionsSetup(regions=region_names(args.regions), seed=args.seed)
    report = sweep(setup, progress=lambda line: print(line))
    title = (
        f"slogate simulate --regions {args.regions} --seed {args.seed}: a global tenant's "
        "lease over a delayed link (sim.studies.regions)"
    )
    return _write_report(args, "regions-sim", title, report, table(report))


def _ahead(args: argparse.Namespace) -> int:
    from sim.studies.ahead import ramp_arms, run_arms, sharp_arms, table, week_arms

    studies = (
        ("class-start-ramp", "the class-start ramp (8x over 5 min)", ramp_arms()),
        ("class-start-sharp", "the class start in 10 s beside long reports", sharp_arms()),
        ("week-daily", "a week of daily traffic, a day in 6 min", week_arms()),
    )
    for name, what, arms in studies:
        rows = run_arms(arms, seed=args.seed, processes=os.cpu_count() or 1)
        title = f"slogate simulate --ahead --seed {args.seed}: {what}"
        _write_report(args, f"ahead-{name}", title, {"rows": rows}, table(rows))
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
