"""`slogate loadtest`: a workload played as open-loop arrivals against a live stack (or,
with --capacity, through the simulator in the live pools' shape), and its reports."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from policy.schema import BudgetStoreKind
from tooling.cli.common import add_engine, add_workload, vllm_ready


def register(sub: argparse._SubParsersAction) -> None:
    loadtest = sub.add_parser(
        "loadtest", help="play a workload as open-loop arrivals against a live stack"
    )
    add_workload(loadtest, "field-mix")
    loadtest.add_argument("--seed", type=int, default=1)
    loadtest.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="arrival times and the simulated pools' latencies times this (default 0.1; "
        "1 with --engine vllm, whose engine keeps real time)",
    )
    loadtest.add_argument("--duration-s", type=float, default=None, help="the first S seconds")
    loadtest.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="every stream's arrival rate times this (reports named <workload>-xN)",
    )
    loadtest.add_argument(
        "--url", default=None, help="a running stack (default: start a local one)"
    )
    loadtest.add_argument(
        "--key", action="append", default=[], metavar="TENANT=KEY", help="default: sk-<tenant>"
    )
    loadtest.add_argument(
        "--budget-store",
        choices=[k.value for k in BudgetStoreKind],
        default=None,
        help="redis: the local stack runs its own Redis (a fault may restart it)",
    )
    loadtest.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    add_engine(loadtest, "the local stack's default pool is a real vLLM (make vllm; time scale 1)")
    loadtest.add_argument(
        "--predict",
        action="store_true",
        help="also play the workload through the offline simulator (the sidecar's code, the "
        "simulated engines, a virtual clock) and report its error per metric",
    )
    loadtest.add_argument(
        "--capacity",
        default=None,
        metavar="1,1.25,1.5",
        help="no live run: the simulator in the live pools' shape at these multiples of the "
        "workload's rates, and the highest at which every tier keeps 0.99 attainment",
    )
    loadtest.add_argument(
        "--compare",
        default=None,
        metavar="protected,unprotected",
        help="the same workload and seed through slogate and through the same Envoy and "
        "sidecar with admission off (routing only), one stack after the other; side by side. "
        "Or quotas ahead of the workload's first burst, any of reactive,calendar,"
        "reactive-never,wrong-calendar: without an ahead: calendar, with a one-off event "
        "declared at the burst's wall time, and both on the same traffic whose ramp never "
        "comes (loadtest-<workload>-ahead; lead, grace and controller interval x the time scale)",
    )
    loadtest.set_defaults(handler=run_loadtest)


def _add_prediction(result: dict[str, Any], workload: Any, seed: int) -> None:
    from tooling.loadtest.predict import predict, prediction_errors

    result["prediction"] = predict(workload, seed)
    result["prediction_errors"] = prediction_errors(result, result["prediction"])


def _capacity(args: argparse.Namespace, path: Path) -> int:
    from sim.fleet.workload_files import SIMULATION_POLICY
    from tooling.loadtest.predict import capacity, capacity_limit, capacity_table

    try:
        factors = [float(f) for f in args.capacity.split(",")]
    except ValueError:
        print("slogate loadtest --capacity: numbers, e.g. 1,1.25,1.5", file=sys.stderr)
        return 2
    rows = capacity(path, SIMULATION_POLICY, factors, args.seed, args.duration_s)
    limit = capacity_limit(rows)
    text = capacity_table(rows) + (
        f"\n\nEvery tier at >= 0.99 attainment up to {limit:g}x the workload's rates."
        if limit is not None
        else "\n\nNo multiple keeps every tier at >= 0.99 attainment."
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"capacity-{args.workload}.json"
    out.write_text(json.dumps({"rows": rows, "limit": limit}, indent=1) + "\n")
    title = f"slogate loadtest --workload {args.workload} --capacity {args.capacity}"
    seconds = f", its first {args.duration_s:g} s" if args.duration_s is not None else ""
    out.with_suffix(".md").write_text(
        f"# {title}\n\nThe offline simulator (the sidecar's code) in front of engines shaped as "
        f"the live stack's simulated pools, seed {args.seed}{seconds}; no live run.\n\n{text}\n"
    )
    print(text)
    return 0


def run_loadtest(args: argparse.Namespace) -> int:

    import yaml

    from sim.fleet.workload_files import (
        SIMULATION_POLICY,
        load_workload,
        workload_path,
        workload_policy,
    )
    from tooling.loadtest.ahead_arms import AHEAD_ARMS
    from tooling.loadtest.faults import load_faults
    from tooling.loadtest.predict import prediction_table, under
    from tooling.loadtest.report import compare_table, table
    from tooling.loadtest.run import VLLM_POLICY, run_live, unprotected_policy

    path = workload_path(args.workload)
    if not path.exists():
        print(f"slogate loadtest: no workload {args.workload!r}", file=sys.stderr)
        return 2
    if args.capacity is not None:
        args.workload = path.stem  # the name the reports are written under
        return _capacity(args, path)
    if args.scale <= 0:
        print("slogate loadtest: --scale must be above 0", file=sys.stderr)
        return 2
    # The name the reports are written under: a file's stem, and the scale when not 1.
    args.workload = path.stem + (f"-x{args.scale:g}" if args.scale != 1.0 else "")
    workload = load_workload(path, SIMULATION_POLICY, seed=args.seed, scale=args.scale)
    if args.duration_s is not None:
        workload = workload.first(args.duration_s)
    # SIGTERM as Ctrl-C: run_live's `finally` stops the stack it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    keys = {a.key.tenant: f"sk-{a.key.tenant}" for a in workload.arrivals}
    keys.update(dict(item.split("=", 1) for item in args.key))
    try:
        faults = load_faults(yaml.safe_load(path.read_text()).get("faults"))
    except (ValueError, KeyError, TypeError) as error:
        print(f"slogate loadtest: {path}: {error}", file=sys.stderr)
        return 2
    if faults and args.url is not None:
        print("slogate loadtest: faults need the local stack (no --url)", file=sys.stderr)
        return 2
    store = BudgetStoreKind(args.budget_store) if args.budget_store else None
    if (
        any("redis" in (f.restart, f.stop, f.pause) for f in faults)
        and store is not BudgetStoreKind.REDIS
    ):
        print("slogate loadtest: a Redis fault needs --budget-store redis", file=sys.stderr)
        return 2
    if args.time_scale is None:
        args.time_scale = 1.0 if args.engine == "vllm" else 0.1
    base = SIMULATION_POLICY
    if args.engine == "vllm":
        if args.url is not None or args.time_scale != 1.0 or args.predict:
            print(
                "slogate loadtest --engine vllm: the local stack at time scale 1 (a real "
                "engine keeps real time), without --predict (its latency is not the "
                "simulator's: calibrate it first)",
                file=sys.stderr,
            )
            return 2
        if not vllm_ready():
            return 2
        base = {**SIMULATION_POLICY, **VLLM_POLICY}
        workload = under(workload, workload_policy(path, base))
    protected = workload_policy(path, base)
    if args.compare is not None:
        modes = [m.strip() for m in args.compare.split(",")]
        if any(m in AHEAD_ARMS for m in modes):
            return _ahead(args, modes, path, protected, keys, store)
        if sorted(modes) != ["protected", "unprotected"] or args.url is not None:
            print(
                "slogate loadtest: --compare protected,unprotected, on the local stack",
                file=sys.stderr,
            )
            return 2
        policies = {"protected": protected, "unprotected": unprotected_policy(protected)}
        runs = {
            mode: run_live(
                workload,
                policies[mode],
                keys,
                args.time_scale,
                faults,
                store,
                engine=args.engine,
                admission=mode == "protected",
            )
            for mode in modes
        }
        if args.predict:
            for mode, run in runs.items():
                _add_prediction(run, under(workload, policies[mode]), args.seed)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        out = args.out_dir / f"loadtest-{args.workload}-compare.json"
        _write_result({"modes": runs}, out)
        text = compare_table(runs)
        for mode, run in runs.items():
            if "prediction_errors" in run:
                text += f"\n\nsimulator vs live, {mode}:\n"
                text += prediction_table(run["prediction_errors"])
        title = f"slogate loadtest --workload {args.workload} --compare {args.compare}"
        out.with_suffix(".md").write_text(f"# {title}\n\n{text}\n")
        print(text)
        print(f"wrote {out} and {out.with_suffix('.md')}{_draw(runs, out)}")
        return 0
    result = run_live(
        workload, protected, keys, args.time_scale, faults, store, args.url, args.engine
    )
    if args.predict:
        _add_prediction(result, workload, args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"loadtest-{args.workload}.json"
    _write_result(result, out)
    text = table(result)
    if "prediction_errors" in result:
        text += "\n\nsimulator vs live:\n" + prediction_table(result["prediction_errors"])
    out.with_suffix(".md").write_text(f"# slogate loadtest --workload {args.workload}\n\n{text}\n")
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}{_draw({'live': result}, out)}")
    return 0


# The seconds a run's stack is given to start and its prompts to be built before its first
# arrival is due (the calendar arms' event is declared against that time).
LEAD_IN_S = 45.0


def _ahead(
    args: argparse.Namespace,
    arms: list[str],
    path: Path,
    protected: dict[str, Any],
    keys: dict[str, str],
    store: BudgetStoreKind | None,
) -> int:
    import time

    import yaml

    from sim.fleet.workload_files import SIMULATION_POLICY, workload_from
    from tooling.loadtest.ahead_arms import AHEAD_ARMS, ahead_document, ahead_policy, ahead_table
    from tooling.loadtest.predict import live_utilisation
    from tooling.loadtest.run import run_live

    document = yaml.safe_load(path.read_text())
    unknown = [a for a in arms if a not in AHEAD_ARMS]
    if unknown or args.url is not None or args.engine != "sim" or not document.get("bursts"):
        print(
            f"slogate loadtest: --compare {','.join(AHEAD_ARMS)} (any of them), on the local "
            "stack's simulated pools, for a workload with bursts",
            file=sys.stderr,
        )
        return 2
    runs: dict[str, Any] = {}
    for arm in arms:
        raw = ahead_document(document, arm)
        workload = workload_from(raw, SIMULATION_POLICY, args.seed, source=str(path))
        if args.duration_s is not None:
            workload = workload.first(args.duration_s)
        start_unix = time.time() + LEAD_IN_S
        policy = ahead_policy(protected, raw, arm, start_unix, args.time_scale)
        print(f"slogate loadtest: arm {arm}, ahead: {policy.get('ahead')}", flush=True)
        run = run_live(workload, policy, keys, args.time_scale, (), store, start_unix=start_unix)
        run["ahead"] = policy.get("ahead")
        run["controller_interval_s"] = policy["breaker"]["controller_interval_s"]
        runs[arm] = run
    used = {arm: live_utilisation(run["timeline"]).get("default", 0.0) for arm, run in runs.items()}
    for arm, run in runs.items():
        run["utilisation_default"] = used[arm]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"loadtest-{args.workload}-ahead.json"
    _write_result({"modes": runs}, out)
    from tooling.loadtest.report import compare_table

    text = ahead_table(runs, used) + "\n\n" + compare_table(runs)
    title = f"slogate loadtest --workload {args.workload} --compare {args.compare}"
    out.with_suffix(".md").write_text(f"# {title}\n\n{text}\n")
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}{_draw(runs, out)}")
    return 0


def _write_result(document: dict[str, Any], out: Path) -> None:
    """The report as JSON, and each request as its client saw it beside it (gzipped, not
    committed: tens of thousands of rows). The written report keeps every second of its
    timeline up to 600 rows, evenly thinned past that."""
    import gzip

    shots = {}
    written = json.loads(json.dumps(document))
    for mode, run in written.get("modes", {"": written}).items():
        shots[mode] = run.pop("shots")
        step = max(1, -(-len(run["timeline"]) // 600))
        run["timeline"] = run["timeline"][::step]
    out.write_text(json.dumps(written, separators=(",", ":")) + "\n")
    shots_path = out.with_suffix(".shots.json.gz")
    with gzip.open(shots_path, "wt", encoding="utf-8") as handle:
        json.dump(shots if "modes" in written else shots[""], handle, separators=(",", ":"))


def _draw(runs: dict[str, Any], out: Path) -> str:
    """The runs' PNG beside their JSON; matplotlib is optional (`slogate[sim]`)."""
    from sim.studies.plots import draw_live

    try:
        return f" and {draw_live(runs, out.with_suffix('.png'))}"
    except ImportError:  # matplotlib, imported when drawing
        return " (no PNG: matplotlib is not installed)"
