"""`slogate serve`, `slogate up` and `slogate engine`: the sidecar alone, the local stack
(pools, sidecar, Envoy) and a real inference engine, each in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from policy import BudgetStoreKind, FailureMode, load_policy
from tooling.cli_common import DEFAULT_ADMIN, Signalled, policy_arg, vllm_ready

if TYPE_CHECKING:
    from tooling.prometheus_server import PrometheusServer
    from tooling.stack import LocalStack


def _pool_port(value: str) -> tuple[str, int]:
    name, _, port = value.partition("=")
    if not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PORT, got {value!r}")
    return name, int(port)


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the sidecar alone (production mode)")
    policy_arg(serve)
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
    add_log_arguments(serve)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    from extproc.service.log_records import LOG_FORMATS

    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="json: one JSON object a line (ts, level, logger, message, request_id), for "
        "log pipelines",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="debug adds a line per decision (routed or refused, with its request id)",
    )


def add_up_command(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start pools, sidecar and Envoy locally until Ctrl-C")
    policy_arg(up)
    add_log_arguments(up)  # the sidecars'
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
    up.add_argument(
        "--prometheus",
        type=int,
        nargs="?",
        const=9090,
        default=None,
        metavar="PORT",
        help="also a Prometheus (Debian's package) on PORT (default 9090; 0: a free one) "
        "scraping every sidecar and Envoy each 5 s, with slogate's alert rules loaded",
    )


def add_engine_command(sub: argparse._SubParsersAction) -> None:
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


def cmd_serve(args: argparse.Namespace) -> int:
    from extproc.runtime.serve import run_sidecar
    from extproc.runtime.sidecar import PortTaken
    from extproc.runtime.workers import WorkerSlot
    from extproc.service.admin_auth import AdminTokenError
    from extproc.service.log_records import configure_logs
    from extproc.service.tracing import TracingUnavailable

    configure_logs(args.log_format, args.log_level)
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
            log_options=("--log-format", args.log_format, "--log-level", args.log_level),
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
    except (AdminTokenError, TracingUnavailable) as error:  # a token file, OpenTelemetry
        print(f"slogate serve: {error}", file=sys.stderr)
        return 2
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
    if args.engine == "vllm" and not vllm_ready():
        return 2
    from tooling import processes

    if shutil.which(processes.envoy_binary()) is None:
        print(f"slogate up: no envoy binary: {processes.ENVOY_INSTALL_HINT}", file=sys.stderr)
        return 2
    from tooling.prometheus_server import PROMETHEUS_INSTALL_HINT, prometheus_binary
    from tooling.vllm_engine import VllmSettings

    if args.prometheus is not None and prometheus_binary() is None:
        print(f"slogate up --prometheus: no prometheus on PATH: {PROMETHEUS_INSTALL_HINT}")
        return 2

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
        sidecar_log_args=("--log-format", args.log_format, "--log-level", args.log_level),
    )
    signals = Signalled()
    stack.start()
    prometheus = None
    if args.prometheus is not None:
        try:
            prometheus = _start_prometheus(stack, work_dir, args.prometheus)
        except BaseException:
            stack.stop()
            raise
    several = args.replicas > 1 or stack.redis is not None or bool(stack.engines)
    print(
        f"slogate up: {stack.url}  (metrics {stack.metrics_url}, Envoy admin "
        f"http://127.0.0.1:{stack.admin_port}, slogate admin {stack.admin_address}, "
        f"logs {work_dir})\n"
        f"{stack.ready_line() + chr(10) if several else ''}"
        f"{f'  prometheus: {prometheus.url}' + chr(10) if prometheus else ''}"
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
        if prometheus is not None:
            prometheus.stop()
        stack.stop()
        print("slogate up: stopped", flush=True)
    return code


def _start_prometheus(stack: LocalStack, work_dir: Path, port: int) -> PrometheusServer:
    """`up --prometheus`: the shipped rules as they are, every replica's sidecar and Envoy
    scraped each 5 s (the field's checklist asks for 15 s at most)."""
    from tooling.alert_rules import SHIPPED_RULES
    from tooling.prometheus_server import PrometheusServer, stack_jobs

    jobs = stack_jobs([r.metrics_port for r in stack.fleet], [r.admin_port for r in stack.fleet])
    server = PrometheusServer(work_dir / "prometheus", jobs, [SHIPPED_RULES], 5.0, port)
    server.start()
    return server


def cmd_engine(args: argparse.Namespace) -> int:
    """A real engine in the foreground until Ctrl-C; its log stays in a temp folder."""
    from tooling.processes import ProcessFailed
    from tooling.vllm_engine import VllmEngine, VllmSettings

    if not vllm_ready():
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
