"""`slogate up`: the local stack (pools, sidecar, Envoy; tooling.stack) in the foreground
until Ctrl-C, with a Prometheus beside it on request. Its sidecars' admin token is the file
`up_token_file` names, which the other commands find by themselves."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from extproc.runtime.serve_command import add_log_arguments, policy_arg
from policy.domain import FailureMode
from policy.loader import load_policy
from policy.schema import BudgetStoreKind
from tooling.cli.common import Signalled, add_engine, vllm_ready

if TYPE_CHECKING:
    from extproc.runtime.processes import ManagedProcess
    from tooling.stack.local import LocalStack, StackPorts
    from tooling.stack.prometheus_server import PrometheusServer


def _pool_port(value: str) -> tuple[str, int]:
    name, _, port = value.partition("=")
    if not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PORT, got {value!r}")
    return name, int(port)


def register(sub: argparse._SubParsersAction) -> None:
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
        "--regions",
        type=int,
        default=0,
        metavar="N",
        help="N regions on 127.0.0.1: a global ledger (Redis) and per region its Redis, pools, "
        "sidecar and Envoy, each with a regions policy and the global tenant sk-demo-global; "
        "region i's ports are the documented ones + 1000 x i",
    )
    up.add_argument(
        "--budget-store",
        choices=[k.value for k in BudgetStoreKind],
        default=None,
        help="redis: start a local Redis-compatible server shared by every replica",
    )

    add_engine(
        up,
        "a real vLLM (pip install -e '.[vllm]') behind the default pool; its KV capacity and "
        "batch slots go into the sidecar's policy",
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
    up.set_defaults(handler=run_up)


def up_token_file(environ: Mapping[str, str] | None = None) -> Path:
    """The admin token every sidecar of `slogate up` gets: the file SLOGATE_ADMIN_TOKEN_FILE
    names, else the one the CLI finds by default (extproc.service.admin_client), so `slogate
    drill` and friends need no --token-file. Kept between runs; made where it is not yet."""
    from extproc.service.admin_auth import TOKEN_FILE_ENV
    from extproc.service.admin_client import default_token_file

    env = environ if environ is not None else os.environ
    named = env.get(TOKEN_FILE_ENV)
    return Path(named) if named else default_token_file(env)


def run_up(args: argparse.Namespace) -> int:
    from tooling.stack.local import LocalStack, StackPorts

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
    if args.regions:
        return _run_regions(args, work_dir, ports)
    if args.engine == "vllm" and not vllm_ready():
        return 2
    from tooling.stack import processes

    if shutil.which(processes.envoy_binary()) is None:
        print(f"slogate up: no envoy binary: {processes.ENVOY_INSTALL_HINT}", file=sys.stderr)
        return 2
    from tooling.stack.prometheus_server import PROMETHEUS_INSTALL_HINT, prometheus_binary
    from tooling.stack.vllm_engine import VllmSettings

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
        admin_token_file=up_token_file(),
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
        f"http://127.0.0.1:{stack.admin_port}, slogate admin {stack.admin_address} "
        f"(token {stack.admin_token_file}), logs {work_dir})\n"
        f"{stack.ready_line() + chr(10) if several else ''}"
        f"{f'  prometheus: {prometheus.url}' + chr(10) if prometheus else ''}"
        f"  try: curl -s {stack.url}/v1/chat/completions -H 'Authorization: Bearer "
        "sk-demo-standard' -H 'content-type: application/json' -d '{\"model\": "
        '"deepseek-v4", "messages": [{"role": "user", "content": "hello"}], '
        '"max_tokens": 16}\' -i',
        flush=True,
    )
    try:
        return _supervise(stack, signals)
    finally:
        if prometheus is not None:
            prometheus.stop()
        stack.stop()
        print("slogate up: stopped", flush=True)


class _Supervised(Protocol):
    def supervise(self) -> Iterable[str]: ...

    def failed(self) -> ManagedProcess | None: ...


def _supervise(stack: _Supervised, signals: Signalled) -> int:
    """Restart what died and can be, until stopped (0) or something cannot be (1)."""
    from extproc.runtime.processes import ProcessFailed

    while not signals.stopping:
        try:
            for name in stack.supervise():
                print(f"slogate up: {name} died; restarted on the same ports", flush=True)
        except ProcessFailed as failed:
            print(f"slogate up: a sidecar could not be restarted; stopping. {failed}")
            return 1
        dead = stack.failed()
        if dead is not None:
            print(f"{dead.name} exited; stopping the stack. Its log:\n{dead.log_text()[-3000:]}")
            return 1
        time.sleep(0.5)
    return 0


def _run_regions(args: argparse.Namespace, work_dir: Path, ports: StackPorts) -> int:
    """`up --regions N`: tooling.stack.regions' RegionsStack until Ctrl-C."""
    from tooling.stack import processes
    from tooling.stack.regions import GLOBAL_KEY, RegionsStack

    refused = [
        flag
        for flag, given in (
            ("--replicas", args.replicas != 1),
            ("--engine vllm", args.engine == "vllm"),
            ("--record", args.record is not None),
            ("--prometheus", args.prometheus is not None),
            ("--pool-port", bool(args.pool_port)),
            ("--failure-mode", args.failure_mode is not None),
        )
        if given
    ]
    if args.regions < 1 or refused:
        print(
            "slogate up --regions: N must be 1 or more, and it runs one replica of simulated "
            f"pools per region (not with {', '.join(refused) or '-'})",
            file=sys.stderr,
        )
        return 2
    if shutil.which(processes.envoy_binary()) is None:
        print(f"slogate up: no envoy binary: {processes.ENVOY_INSTALL_HINT}", file=sys.stderr)
        return 2
    stack = RegionsStack(
        args.policy,
        work_dir,
        args.regions,
        ports,
        args.time_scale,
        sidecar_args=("--log-format", args.log_format, "--log-level", args.log_level),
        admin_token_file=up_token_file(),
    )
    signals = Signalled()
    stack.start()
    first = next(iter(stack.regions.values()))
    print(
        f"slogate up: {args.regions} regions (logs {work_dir})\n{stack.ready_lines()}\n"
        f"  try: curl -s {first.url}/v1/chat/completions -H 'Authorization: Bearer "
        f"{GLOBAL_KEY}' -H 'content-type: application/json' -d '{{\"model\": "
        '"deepseek-v4", "messages": [{"role": "user", "content": "hello"}], '
        '"max_tokens": 16}\' -i',
        flush=True,
    )
    try:
        return _supervise(stack, signals)
    finally:
        stack.stop()
        print("slogate up: stopped", flush=True)


def _start_prometheus(stack: LocalStack, work_dir: Path, port: int) -> PrometheusServer:
    """`up --prometheus`: the shipped rules as they are, every replica's sidecar and Envoy
    scraped each 5 s (the field's checklist asks for 15 s at most)."""
    from tooling.render.alert_rules import SHIPPED_RULES
    from tooling.stack.prometheus_server import PrometheusServer, stack_jobs

    jobs = stack_jobs([r.metrics_port for r in stack.fleet], [r.admin_port for r in stack.fleet])
    server = PrometheusServer(work_dir / "prometheus", jobs, [SHIPPED_RULES], 5.0, port)
    server.start()
    return server
