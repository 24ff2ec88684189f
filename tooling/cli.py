"""`slogate` command line: serve, up, envoy-config, bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from policy import BudgetStoreKind, FailureMode, PolicyError, load_policy
from tooling import keys_cli, offline_commands, policy_cli, replay_cli, tenants_cli, workload_cli

DEFAULT_POLICY = Path("deploy/policy.example.yaml")
DEFAULT_ADMIN = "127.0.0.1:50052"


class Signalled:
    """Set by SIGTERM or SIGINT: a foreground command then stops its children itself
    (Python's default SIGTERM would end it without running its `finally`, orphaning them)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum: int, frame: object) -> None:
        self.stopping = True


def _policy_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help="policy YAML file")


def _pool_port(value: str) -> tuple[str, int]:
    name, _, port = value.partition("=")
    if not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PORT, got {value!r}")
    return name, int(port)


def _pool_cluster(value: str) -> tuple[str, str]:
    name, _, cluster = value.partition("=")
    if not name or not cluster:
        raise argparse.ArgumentTypeError(f"expected POOL=CLUSTER, got {value!r}")
    return name, cluster


def _pool_service(value: str) -> tuple[str, tuple[str, int]]:
    name, _, address = value.partition("=")
    service, _, port = address.rpartition(":")
    if not name or not service or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected POOL=SERVICE:PORT, got {value!r}")
    return name, (service, int(port))


def _label(value: str) -> tuple[str, str]:
    key, _, label = value.partition("=")
    if not key or not label:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, label


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slogate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the sidecar alone (production mode)")
    _policy_arg(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--grpc-port", type=int, default=50051)
    serve.add_argument("--metrics-port", type=int, default=9464)
    serve.add_argument(
        "--metrics-host", default=None, help="address for /metrics (default: --host)"
    )
    serve.add_argument(
        "--admin-address",
        default=DEFAULT_ADMIN,
        help="admin API: host:port or unix:/path; 'none' turns it off",
    )
    serve.add_argument(
        "--no-exact-tokenizer",
        action="store_true",
        help="never load the real tokenizer; decide on the fast estimate alone",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="sidecar processes sharing the gRPC port (SO_REUSEPORT); > 1 needs the Redis "
        "store. One /metrics (merged), one admin API (worker 0's)",
    )
    serve.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # set by --workers

    config = sub.add_parser("envoy-config", help="write the Envoy bootstrap for a policy")
    _policy_arg(config)
    config.add_argument("--out", type=Path, default=Path("envoy/bootstrap.json"))
    config.add_argument("--listen-port", type=int, default=10000)
    config.add_argument("--admin-port", type=int, default=9901)
    config.add_argument("--sidecar-port", type=int, default=50051)
    config.add_argument("--host", default="127.0.0.1")
    config.add_argument(
        "--fragment",
        action="store_true",
        help="only what slogate adds (filters, clusters, access log, pool routes, per-route "
        "and manager settings), for merging into an Envoy configuration of your own",
    )
    config.add_argument(
        "--merge-into",
        type=Path,
        default=None,
        metavar="BOOTSTRAP",
        help="your static bootstrap (YAML or JSON): write it with the fragment merged in",
    )
    config.add_argument("--listener", default=None, help="with --merge-into: only this one")
    config.add_argument(
        "--contract",
        action="store_true",
        help="print what slogate needs from an Envoy (the README's table) and exit",
    )
    config.add_argument(
        "--pool-cluster",
        type=_pool_cluster,
        action="append",
        default=[],
        metavar="POOL=CLUSTER",
        help="with --fragment/--merge-into: the cluster of yours a pool's engines are behind",
    )

    up = sub.add_parser("up", help="start pools, sidecar and Envoy locally until Ctrl-C")
    _policy_arg(up)
    up.add_argument("--listen-port", type=int, default=10000)
    up.add_argument("--admin-port", type=int, default=9901)
    up.add_argument("--grpc-port", type=int, default=50051)
    up.add_argument("--metrics-port", type=int, default=9464)
    up.add_argument("--admin-api-port", type=int, default=50052, help="sidecar admin API")
    up.add_argument(
        "--pool-port", type=_pool_port, action="append", default=[], metavar="NAME=PORT"
    )
    up.add_argument("--time-scale", type=float, default=1.0, help="simulated latency factor")
    up.add_argument("--failure-mode", choices=[m.value for m in FailureMode], default=None)
    up.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="Envoy + sidecar pairs on consecutive ports (10000, 10001, ...)",
    )
    up.add_argument(
        "--budget-store",
        choices=[k.value for k in BudgetStoreKind],
        default=None,
        help="redis: start a local Redis-compatible server shared by every replica",
    )

    up.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        default="sim",
        help="vllm: a real vLLM (pip install -e '.[vllm]') behind the default pool; its KV "
        "capacity and batch slots go into the sidecar's policy",
    )
    up.add_argument(
        "--kv-blocks", type=int, default=80, help="with --engine vllm: KV blocks of 128 tokens"
    )
    up.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="DIR",
        help="record every request's shape into DIR (policy traffic_record:; slogate replay)",
    )

    engine = sub.add_parser("engine", help="start a real inference engine on loopback")
    engine_sub = engine.add_subparsers(dest="engine", required=True)
    vllm = engine_sub.add_parser(
        "vllm", help="vLLM's CPU build serving a tiny model made here (no download)"
    )
    vllm.add_argument("--port", type=int, default=18001)
    vllm.add_argument(
        "--served-model-name", action="append", default=None, help="default: deepseek-v4"
    )
    vllm.add_argument("--max-model-len", type=int, default=8192)
    vllm.add_argument("--kv-blocks", type=int, default=80, help="KV blocks of 128 tokens")
    vllm.add_argument("--max-num-seqs", type=int, default=16)
    vllm.add_argument(
        "--priority", action="store_true", help="--scheduling-policy priority (lower first)"
    )

    k8s = sub.add_parser("k8s", help="write Kubernetes manifests (Envoy + sidecar pod)")
    _policy_arg(k8s)
    k8s.add_argument("--out", type=Path, default=None, help="default deploy/k8s/slogate*.yaml")
    k8s.add_argument(
        "--mesh",
        choices=("istio", "envoy-gateway"),
        default=None,
        help="slogate for a mesh's Envoys (an EnvoyFilter; Envoy Gateway's policies) instead "
        "of a pod with its own Envoy",
    )
    k8s.add_argument("--namespace", default="llm", help="the sidecar's (and the Gateway's)")
    k8s.add_argument(
        "--pool-service",
        type=_pool_service,
        action="append",
        default=[],
        metavar="POOL=SERVICE:PORT",
        help="the Service in front of a pool's engines",
    )
    k8s.add_argument(
        "--inference-pool",
        type=_pool_cluster,
        action="append",
        default=[],
        metavar="POOL=NAME",
        help="envoy-gateway: a pool served by an InferencePool of this name",
    )
    k8s.add_argument("--gateway", default="inference-gateway", help="envoy-gateway: the Gateway")
    k8s.add_argument("--listener", default="http", help="envoy-gateway: its listener")
    k8s.add_argument("--gateway-namespace", default="istio-system", help="istio: the gateway's")
    k8s.add_argument(
        "--gateway-label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="istio: the workload selector (default istio=ingressgateway)",
    )
    k8s.add_argument("--port", type=int, default=8080, help="istio: the listener's port")
    k8s.add_argument(
        "--istio-context",
        choices=("GATEWAY", "SIDECAR_INBOUND"),
        default="GATEWAY",
        help="istio: the ingress gateway, or the engines' own sidecars",
    )
    k8s.add_argument(
        "--before-filter",
        default="envoy.filters.http.router",
        help="istio: the HTTP filter slogate's go before (an endpoint picker's ext_proc)",
    )
    k8s.add_argument(
        "--skip-route",
        action="append",
        default=[],
        metavar="NAME",
        help="istio: a route of yours that serves no policy path (ext_proc off there)",
    )

    def admin_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--admin", default=DEFAULT_ADMIN, help="the sidecar's admin API")
        command.add_argument("--json", action="store_true", help="print JSON, not a table")
        return command

    admin_command("status", "breaker state per pool with its signals, budget store health")
    keys = admin_command("keys", "keys with limits, in-flight reservations and usage")
    keys.add_argument("--tenant", default="")
    keys_cli.add_key_commands(keys)  # keys add / revoke / rotate / list
    admin_command("reload", "re-read the policy file now (a bad policy is refused)")
    drill = admin_command("drill", "force a breaker level on a pool for a while")
    drill.add_argument("--pool", required=True, help="a pool name, or 'global'")
    drill.add_argument("--level", type=int, choices=[0, 1, 2, 3], required=True)
    drill.add_argument("--minutes", type=float, default=10.0, help="0 ends a running drill")
    drain = admin_command("drain", "an engine gets nothing new, its requests finish")
    drain.add_argument("--engine", required=True, help="ip:port, as `slogate status` shows it")
    tenants_cli.add_tenants_command(sub, DEFAULT_ADMIN)  # tenants: class, tier, spend
    policy_cli.add_policy_command(sub, DEFAULT_ADMIN)  # policy diff / promote
    drain.add_argument("--pool", default="", help="only in this pool (default: every pool)")
    drain.add_argument("--undo", action="store_true", help="take new requests again")

    simulate = sub.add_parser(
        "simulate", help="offline fleet: best static quota (sweep) vs the dynamic controller"
    )
    simulate.add_argument(
        "--workload",
        default="burst-10x",
        help="a name in sim/workloads/, or a workload file (e.g. slogate workload fit's)",
    )
    simulate.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every tenant's arrival rate (e.g. 2: the quarterly 2x test)",
    )
    simulate.add_argument("--seed", type=int, default=7)
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

    replay_cli.add_replay_command(sub)  # replay: a traffic record under a policy
    workload_cli.add_workload_command(sub)  # workload fit: a workload from a record

    loadtest = sub.add_parser(
        "loadtest", help="play a workload as open-loop arrivals against a live stack"
    )
    loadtest.add_argument(
        "--workload",
        default="field-mix",
        help="a name in sim/workloads/, or a workload file (e.g. slogate workload fit's)",
    )
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
    loadtest.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default="sim",
        help="vllm: the local stack's default pool is a real vLLM (make vllm; time scale 1)",
    )
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
        "sidecar with admission off (routing only), one stack after the other; side by side",
    )

    calibrate = sub.add_parser(
        "calibrate", help="measure OpenAI-compatible endpoints; write their latency model"
    )
    calibrate.add_argument(
        "--url",
        action="append",
        required=True,
        help="[POOL=]URL of an endpoint (repeat for several pools; default pool name: default)",
    )
    _policy_arg(calibrate)
    calibrate.add_argument("--model", default=None, help="model name (default: the policy's)")
    calibrate.add_argument("--api-key", default=None, help="Bearer key, e.g. through slogate")
    calibrate.add_argument("--requests", type=int, default=100, help="tiny requests per pool")
    calibrate.add_argument("--per-size", type=int, default=20, help="requests per probe size")
    calibrate.add_argument("--max-context", type=int, default=32_768)
    calibrate.add_argument("--out", type=Path, default=None, help="write the YAML here too")

    bench = sub.add_parser("bench", help="benchmarks (results under bench/results/)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    overhead = bench_sub.add_parser("overhead", help="Envoy vs pass-through ext_proc vs slogate")
    overhead.add_argument("--duration-s", type=float, default=10.0)
    overhead.add_argument("--rounds", type=int, default=3)
    overhead.add_argument(
        "--profiles",
        default="small,field_mix,1k,8k,32k,128k,multi_turn,chinese,code,hostile",
        help="request bodies, comma-separated (small: the 4 KB body; others: bench/bodies.py)",
    )
    overhead.add_argument(
        "--levers",
        default="",
        help="slogate variants to run beside it, comma-separated (tooling/benchmarks/overhead.py"
        " LEVERS: no_split, count_on_loop, count_in_threads, no_count_cache, tiktoken)",
    )
    overhead.add_argument("--name", default="overhead", help="results file name")
    overhead.add_argument("--no-spy", action="store_true", help="skip the py-spy profile")
    overhead.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    cost = bench_sub.add_parser("decision-cost", help="body decision p50/p99 per body profile")
    cost.add_argument("--seconds", type=float, default=4.0, help="per profile")
    cost.add_argument("--profiles", default="", help="comma-separated; default: all")
    cost.add_argument("--levers", default="", help="policy variants beside it (as bench overhead)")
    cost.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    tenants = bench_sub.add_parser("tenants", help="1,000 tenants / 10,000 keys vs the demo policy")
    tenants.add_argument("--seconds", type=float, default=20.0, help="per phase")
    tenants.add_argument("--tenants", type=int, default=1000)
    tenants.add_argument("--keys", type=int, default=10_000)
    tenants.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    estimator = bench_sub.add_parser("estimator", help="token estimate accuracy and speed")
    estimator.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    workers = bench_sub.add_parser("workers", help="serve --workers 1 vs 2 throughput")
    workers.add_argument("--duration-s", type=float, default=10.0)
    workers.add_argument("--rounds", type=int, default=3)
    workers.add_argument("--profile", default="field_mix")
    workers.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    live = bench_sub.add_parser("engines-vllm", help="two real vLLMs: picking vs round robin")
    live.add_argument("--chats", type=int, default=24, help="per phase")
    live.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    packing = bench_sub.add_parser("packing-vllm", help="a packing window before one real vLLM")
    packing.add_argument("--window-ms", type=float, default=75.0)
    packing.add_argument("--rate", type=float, default=3.0, help="requests a second")
    packing.add_argument("--seconds", type=float, default=30.0, help="per run")
    packing.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    prefix = bench_sub.add_parser("prefix-index", help="the picker's prefix index under a flood")
    prefix.add_argument("--prompts", type=int, default=40_000)
    prefix.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    decisions = bench_sub.add_parser("decisions", help="budget decision cost per store")
    decisions.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    decisions.add_argument("--calls", type=int, default=5000)
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from extproc.runtime.serve import run_sidecar
    from extproc.runtime.sidecar import PortTaken
    from extproc.runtime.workers import WorkerSlot
    from extproc.service.admin_auth import AdminTokenError

    admin = None if args.admin_address == "none" else args.admin_address
    if args.workers < 1:
        print("slogate serve: --workers must be 1 or more", file=sys.stderr)
        return 2
    if args.workers > 1:
        if load_policy(args.policy).budget.store is BudgetStoreKind.MEMORY:
            print(
                "slogate serve: --workers > 1 needs budget.store: redis — with the in-process "
                "store each worker would keep its own budgets and KV ledger, and the limits "
                "would be multiplied by the workers",
                file=sys.stderr,
            )
            return 2
        from tooling.serve_workers import run_workers

        return run_workers(
            args.workers,
            args.policy,
            args.host,
            args.grpc_port,
            args.metrics_port,
            args.metrics_host,
            admin,
            not args.no_exact_tokenizer,
        )
    slot = None
    if args.worker:
        index, count, base, directory = args.worker.split(",", 3)
        slot = WorkerSlot(int(index), int(count), base, Path(directory))
    try:
        asyncio.run(
            run_sidecar(
                args.policy,
                args.host,
                args.grpc_port,
                args.metrics_port,
                not args.no_exact_tokenizer,
                args.metrics_host,
                admin,
                worker=slot,
            )
        )
    except PortTaken as taken:  # one line naming the port, not a traceback
        print(f"slogate serve: {taken}", file=sys.stderr)
        return 2
    except AdminTokenError as error:  # SLOGATE_ADMIN_TOKEN_FILE unreadable or too short
        print(f"slogate serve: {error}", file=sys.stderr)
        return 2
    return 0


def cmd_envoy_config(args: argparse.Namespace) -> int:
    import yaml

    from tooling.envoy_config import EnvoyPorts, build_bootstrap
    from tooling.envoy_config.fragment import (
        FragmentTarget,
        MergeError,
        build_fragment,
        merge_fragment,
    )

    if args.contract:
        from tooling.envoy_config.fragment import contract_table

        print(contract_table())
        return 0
    policy = load_policy(args.policy)
    ports = EnvoyPorts(args.listen_port, args.admin_port, args.sidecar_port, args.host)
    target = FragmentTarget(args.host, args.sidecar_port, dict(args.pool_cluster))
    notes: list[str] = []
    if args.merge_into is not None:
        theirs = yaml.safe_load(args.merge_into.read_text(encoding="utf-8"))
        try:
            config, notes = merge_fragment(theirs, build_fragment(policy, target), args.listener)
        except MergeError as error:
            where = f"slogate envoy-config: cannot merge into {args.merge_into}"
            print(f"{where}: {error}", file=sys.stderr)
            return 2
    elif args.fragment:
        config = build_fragment(policy, target)
    else:
        config = build_bootstrap(policy, ports)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix in (".yaml", ".yml"):
        args.out.write_text(yaml.safe_dump(config, sort_keys=False))
    else:
        args.out.write_text(json.dumps(config, indent=1) + "\n")
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from tooling.processes import ProcessFailed
    from tooling.stack import LocalStack, StackPorts

    work_dir = Path(tempfile.mkdtemp(prefix="slogate-up-"))
    ports = StackPorts(
        listen=args.listen_port,
        admin=args.admin_port,
        grpc=args.grpc_port,
        metrics=args.metrics_port,
        admin_api=args.admin_api_port,
        pools=dict(args.pool_port),
    )
    failure = FailureMode(args.failure_mode) if args.failure_mode else None
    if args.replicas < 1:
        print("slogate up: --replicas must be 1 or more", file=sys.stderr)
        return 2
    store = BudgetStoreKind(args.budget_store) if args.budget_store else None
    if (
        args.replicas > 1
        and store is None
        and load_policy(args.policy).budget.store is BudgetStoreKind.MEMORY
    ):
        print(
            "slogate up: --replicas > 1 with the in-process budget store gives each replica "
            "its own budgets and KV ledger (each admits against its part of every pool); "
            "add --budget-store redis for the fleet's shared ones",
            file=sys.stderr,
        )
    if args.engine == "vllm" and not _vllm_ready():
        return 2
    from tooling.vllm_engine import VllmSettings

    stack = LocalStack(
        args.policy,
        work_dir,
        ports,
        args.time_scale,
        failure,
        replicas=args.replicas,
        budget_store=store,
        record_dir=args.record,
        engine=args.engine,
        vllm=VllmSettings(kv_blocks=args.kv_blocks),
    )
    signals = Signalled()
    stack.start()
    several = args.replicas > 1 or stack.redis is not None or bool(stack.engines)
    print(
        f"slogate up: {stack.url}  (metrics {stack.metrics_url}, Envoy admin "
        f"http://127.0.0.1:{stack.admin_port}, slogate admin {stack.admin_address}, "
        f"logs {work_dir})\n"
        f"{stack.ready_line() + chr(10) if several else ''}"
        f"  try: curl -s {stack.url}/v1/chat/completions -H 'Authorization: Bearer "
        "sk-demo-standard' -H 'content-type: application/json' -d '{\"model\": "
        '"deepseek-v4", "messages": [{"role": "user", "content": "hello"}], '
        '"max_tokens": 16}\' -i',
        flush=True,
    )
    code = 0
    try:
        while not signals.stopping:
            try:
                for name in stack.supervise():
                    print(f"slogate up: {name} died; restarted on the same ports", flush=True)
            except ProcessFailed as failed:
                print(f"slogate up: a sidecar could not be restarted; stopping. {failed}")
                code = 1
                break
            dead = stack.failed()
            if dead is not None:
                print(
                    f"{dead.name} exited; stopping the stack. Its log:\n{dead.log_text()[-3000:]}"
                )
                code = 1
                break
            time.sleep(0.5)
    finally:
        stack.stop()
        print("slogate up: stopped", flush=True)
    return code


def _vllm_ready() -> bool:
    from tooling.vllm_engine import vllm_available

    if not vllm_available():
        print(
            "slogate: vLLM is not installed here: `make vllm` (pip install -e '.[vllm]' and "
            "python -m tooling.vllm_install)",
            file=sys.stderr,
        )
        return False
    return True


def cmd_engine(args: argparse.Namespace) -> int:
    """A real engine in the foreground until Ctrl-C; its log stays in a temp folder."""
    from tooling.processes import ProcessFailed
    from tooling.vllm_engine import VllmEngine, VllmSettings

    if not _vllm_ready():
        return 2
    settings = VllmSettings(
        port=args.port,
        served_names=tuple(args.served_model_name or ["deepseek-v4"]),
        max_model_len=args.max_model_len,
        kv_blocks=args.kv_blocks,
        max_num_seqs=args.max_num_seqs,
        priority_scheduling=args.priority,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="slogate-engine-"))
    engine = VllmEngine(log_dir, settings)
    signals = Signalled()
    print(f"slogate engine: starting vLLM on {settings.port} (about a minute; log {log_dir})")
    started = time.monotonic()
    try:
        engine.start()
    except ProcessFailed as failed:
        print(f"slogate engine: vLLM did not start: {failed}", file=sys.stderr)
        return 1
    print(
        f"slogate engine: {engine.url} ready after {time.monotonic() - started:.0f} s: "
        f"{engine.facts().summary()}",
        flush=True,
    )
    try:
        while not signals.stopping and engine.process is not None and engine.process.running():
            time.sleep(0.5)
    finally:
        engine.stop()
    return 0


def _add_prediction(result: dict[str, Any], workload: Any, seed: int) -> None:
    from tooling import loadtest

    result["prediction"] = loadtest.predict(workload, seed)
    result["prediction_errors"] = loadtest.prediction_errors(result, result["prediction"])


def _capacity(args: argparse.Namespace, path: Path) -> int:
    from sim.scenarios import SIMULATION_POLICY
    from tooling import loadtest

    try:
        factors = [float(f) for f in args.capacity.split(",")]
    except ValueError:
        print("slogate loadtest --capacity: numbers, e.g. 1,1.25,1.5", file=sys.stderr)
        return 2
    rows = loadtest.capacity(path, SIMULATION_POLICY, factors, args.seed, args.duration_s)
    limit = loadtest.capacity_limit(rows)
    text = loadtest.capacity_table(rows) + (
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


def cmd_loadtest(args: argparse.Namespace) -> int:

    import yaml

    from sim.scenarios import SIMULATION_POLICY, load_workload, workload_path, workload_policy
    from tooling import loadtest

    path = workload_path(args.workload)
    if not path.exists():
        print(f"slogate loadtest: no workload {args.workload!r}", file=sys.stderr)
        return 2
    args.workload = path.stem  # the name the reports are written under
    if args.capacity is not None:
        return _capacity(args, path)
    workload = load_workload(path, SIMULATION_POLICY, seed=args.seed)
    if args.duration_s is not None:
        workload = workload.first(args.duration_s)
    # SIGTERM as Ctrl-C: run_live's `finally` stops the stack it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    keys = {a.key.tenant: f"sk-{a.key.tenant}" for a in workload.arrivals}
    keys.update(dict(item.split("=", 1) for item in args.key))
    try:
        faults = loadtest.load_faults(yaml.safe_load(path.read_text()).get("faults"))
    except (ValueError, KeyError, TypeError) as error:
        print(f"slogate loadtest: {path}: {error}", file=sys.stderr)
        return 2
    if faults and args.url is not None:
        print("slogate loadtest: faults need the local stack (no --url)", file=sys.stderr)
        return 2
    store = BudgetStoreKind(args.budget_store) if args.budget_store else None
    if any(f.restart == "redis" for f in faults) and store is not BudgetStoreKind.REDIS:
        print("slogate loadtest: a Redis restart needs --budget-store redis", file=sys.stderr)
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
        if not _vllm_ready():
            return 2
        base = {**SIMULATION_POLICY, **loadtest.VLLM_POLICY}
        workload = loadtest.under(workload, workload_policy(path, base))
    protected = workload_policy(path, base)
    if args.compare is not None:
        modes = [m.strip() for m in args.compare.split(",")]
        if sorted(modes) != ["protected", "unprotected"] or args.url is not None:
            print(
                "slogate loadtest: --compare protected,unprotected, on the local stack",
                file=sys.stderr,
            )
            return 2
        policies = {"protected": protected, "unprotected": loadtest.unprotected_policy(protected)}
        runs = {
            mode: loadtest.run_live(
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
                _add_prediction(run, loadtest.under(workload, policies[mode]), args.seed)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        out = args.out_dir / f"loadtest-{args.workload}-compare.json"
        _write_result({"modes": runs}, out)
        text = loadtest.compare_table(runs)
        for mode, run in runs.items():
            if "prediction_errors" in run:
                text += f"\n\nsimulator vs live, {mode}:\n"
                text += loadtest.prediction_table(run["prediction_errors"])
        title = f"slogate loadtest --workload {args.workload} --compare {args.compare}"
        out.with_suffix(".md").write_text(f"# {title}\n\n{text}\n")
        print(text)
        print(f"wrote {out} and {out.with_suffix('.md')}{_draw(runs, out)}")
        return 0
    result = loadtest.run_live(
        workload, protected, keys, args.time_scale, faults, store, args.url, args.engine
    )
    if args.predict:
        _add_prediction(result, workload, args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"loadtest-{args.workload}.json"
    _write_result(result, out)
    text = loadtest.table(result)
    if "prediction_errors" in result:
        text += "\n\nsimulator vs live:\n" + loadtest.prediction_table(result["prediction_errors"])
    out.with_suffix(".md").write_text(f"# slogate loadtest --workload {args.workload}\n\n{text}\n")
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}{_draw({'live': result}, out)}")
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
    from sim.plots import draw_live

    try:
        return f" and {draw_live(runs, out.with_suffix('.png'))}"
    except ImportError:  # matplotlib, imported when drawing
        return " (no PNG: matplotlib is not installed)"


def cmd_k8s(args: argparse.Namespace) -> int:
    from tooling.k8s import write_documents, write_manifests
    from tooling.mesh import MeshError, MeshTarget, render_istio
    from tooling.mesh_gateway import render_envoy_gateway

    if args.mesh is None:
        out = args.out or Path("deploy/k8s/slogate.yaml")
        write_manifests(args.policy, out)
        print(f"wrote {out}")
        return 0
    target = MeshTarget(
        namespace=args.namespace,
        pool_services=dict(args.pool_service),
        inference_pools=dict(args.inference_pool),
        gateway=args.gateway,
        listener=args.listener,
        gateway_namespace=args.gateway_namespace,
        gateway_labels=dict(args.gateway_label) or {"istio": "ingressgateway"},
        port=args.port,
        istio_context=args.istio_context,
        skip_routes=tuple(args.skip_route),
        before_filter=args.before_filter,
    )
    render = render_istio if args.mesh == "istio" else render_envoy_gateway
    try:
        documents = render(args.policy, target)
    except MeshError as error:
        print(f"slogate k8s --mesh {args.mesh}: {error}", file=sys.stderr)
        return 2
    out = args.out or Path(f"deploy/k8s/slogate-{args.mesh}.yaml")
    write_documents(documents, out, f"slogate k8s --mesh {args.mesh}")
    print(f"wrote {out}")
    return 0


def cmd_admin(args: argparse.Namespace) -> int:
    """status / keys / reload / drill / drain: one call to the running sidecar's admin API."""
    import grpc

    from extproc.adminpb import admin_pb2 as pb
    from tooling import admin_client as admin

    async def call() -> int:
        channel, stub = admin.stub(args.admin)
        try:
            if args.command == "status":
                status = await stub.Status(pb.StatusRequest(), timeout=5)
                print(admin.as_json(status) if args.json else admin.status_table(status))
            elif args.command == "keys":
                keys = await stub.Keys(pb.KeysRequest(tenant=args.tenant), timeout=10)
                print(admin.as_json(keys) if args.json else admin.keys_table(keys))
            elif args.command == "reload":
                reloaded = await stub.ReloadPolicy(pb.ReloadPolicyRequest(), timeout=10)
                print(
                    admin.as_json(reloaded)
                    if args.json
                    else f"reloaded: {reloaded.keys} keys"
                    + (f"\n{reloaded.error}" if reloaded.error else "")
                    if reloaded.ok
                    else f"refused, the old policy stays: {reloaded.error}"
                )
                return 0 if reloaded.ok else 1
            elif args.command == "drain":
                drained = await stub.Drain(
                    pb.DrainRequest(engine=args.engine, pool=args.pool, undo=args.undo), timeout=5
                )
                print(
                    admin.as_json(drained)
                    if args.json
                    else "\n".join(f"{e.pool} {e.endpoint}: {e.state}" for e in drained.engines)
                )
            else:
                drilled = await stub.Drill(
                    pb.DrillRequest(pool=args.pool, level=args.level, minutes=args.minutes),
                    timeout=5,
                )
                print(
                    admin.as_json(drilled)
                    if args.json
                    else f"drill: {drilled.pool} at least L{drilled.level} for "
                    f"{drilled.remaining_s:.0f} s"
                )
            return 0
        except grpc.aio.AioRpcError as error:
            print(f"slogate: {args.admin}: {error.code().name}: {error.details()}", file=sys.stderr)
            return 2
        finally:
            await channel.close()

    return asyncio.run(call())


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    handlers = {
        "serve": cmd_serve,
        "envoy-config": cmd_envoy_config,
        "up": cmd_up,
        "engine": cmd_engine,
        "loadtest": cmd_loadtest,
        "status": cmd_admin,
        "keys": lambda a: keys_cli.cmd_keys(a) if a.keys_action else cmd_admin(a),
        "reload": cmd_admin,
        "drill": cmd_admin,
        "drain": cmd_admin,
        "tenants": tenants_cli.cmd_tenants,
        "policy": policy_cli.cmd_policy,
        "k8s": cmd_k8s,
        "simulate": offline_commands.cmd_simulate,
        "replay": replay_cli.cmd_replay,
        "workload": workload_cli.cmd_workload,
        "calibrate": offline_commands.cmd_calibrate,
        "bench": offline_commands.cmd_bench,
    }
    try:
        return handlers[args.command](args)
    except PolicyError as error:
        print(f"slogate: bad policy {args.policy}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `slogate status | head`: the reader left. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again, and exit as a piped command does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
