"""The local stack: simulated pools, the sidecar and Envoy, started and stopped together.

What lives here: `LocalStack`, used by `slogate up`, the end-to-end tests and the
benchmarks. Every part is a real process; the Envoy bootstrap is generated from the policy
with the pools pointed at the simulated fleet that was actually started. With `replicas`
N, N Envoy + sidecar pairs (`Replica`) stand on consecutive ports in front of the same
pools, and with the Redis budget store one Redis-compatible server (valkey, or
redis-server where installed) is started and stopped with them: the fleet on one machine.
With `engine="vllm"` the `default` pool is a real vLLM (tooling.stack.vllm_engine) instead of a
simulated one, and the sidecar's policy takes that pool's KV capacity and batch slots from
what the engine reports. Starting the engines and writing that policy: tooling.stack.pool_engines.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extproc.runtime.processes import ManagedProcess
from extproc.service.admin_auth import ensure_token_file
from policy.domain import FailureMode, Pool
from policy.loader import load_policy
from policy.schema import BudgetStoreKind, Policy
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.profile import EnvoyPorts
from tooling.stack.pool_engines import (
    HOST,
    restart_real_engine,
    restart_sim_engine,
    served_names,
    start_real_engines,
    start_sim_pool,
    write_runtime_policy,
)
from tooling.stack.processes import envoy_binary, free_port, start_sidecar
from tooling.stack.redis import start_redis
from tooling.stack.vllm_engine import EngineFacts, VllmEngine, VllmSettings


@dataclass
class StackPorts:
    """0 means: pick a free port (tests); the defaults are the documented local ports."""

    listen: int = 10000
    admin: int = 9901
    grpc: int = 50051
    metrics: int = 9464
    admin_api: int = 50052
    pools: dict[str, int] = field(default_factory=dict)  # pool name -> port; absent: policy's


def _next(port: int, index: int) -> int:
    """Replica `index`'s port: consecutive from the first, 0 (the OS picks) stays 0."""
    return port + index if port else 0


@dataclass(kw_only=True)
class Pair:
    """An Envoy + sidecar pair's processes and ports (None and 0 until it is started)."""

    sidecar: ManagedProcess | None = None
    envoy: ManagedProcess | None = None
    listen_port: int = 0
    admin_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    admin_address: str = ""

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"


@dataclass
class Replica(Pair):
    """One Envoy + sidecar pair of the stack."""

    index: int
    redis_url: str | None = None  # None: the stack's Redis (a test may pass a proxy's)
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.listen_port}"

    def ports(self) -> str:
        return (
            f"listen {self.listen_port}, Envoy admin {self.admin_port}, grpc {self.grpc_port}, "
            f"metrics {self.metrics_port}, slogate admin {self.admin_address}"
        )


@dataclass
class LocalStack(Pair):
    """The stack; its own `Pair` fields are its first replica's, for callers that run one."""

    policy_path: Path
    work_dir: Path
    ports: StackPorts = field(default_factory=StackPorts)
    time_scale: float = 1.0
    failure_mode: FailureMode | None = None  # None: as the policy says
    exact_tokenizer: bool = True
    # More of the sidecars' serve flags: `--log-format` / `--log-level` (`slogate up
    # --log-format json`), a test's `--tls-cert` ones.
    sidecar_log_args: tuple[str, ...] = ()
    envoy_concurrency: int = 1
    replicas: int = 1
    budget_store: BudgetStoreKind | None = None  # None: as the policy says
    # `up --record DIR`: the runtime policy gets `traffic_record: {dir: DIR}` (every request).
    record_dir: Path | None = None
    redis_urls: dict[int, str] = field(default_factory=dict)  # replica -> its Redis URL
    # Every sidecar's admin token (SLOGATE_ADMIN_TOKEN_FILE): None, WORK_DIR/admin-token;
    # `slogate up`: the file the CLI finds by default. Made (random, 0600) where it is not.
    admin_token_file: Path | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    fleet: list[Replica] = field(default_factory=list)
    redis: ManagedProcess | None = None
    redis_port: int = 0
    pool_ports: dict[str, int] = field(default_factory=dict)  # pool -> its first engine's
    engine_ports: dict[str, list[int]] = field(default_factory=dict)  # pool -> every engine's
    engine_procs: dict[str, list[ManagedProcess]] = field(default_factory=dict)  # simulated
    sidecar_policy_path: Path | None = None
    tls: bool = False
    # "sim": every pool simulated (sim.server.pool); "vllm": the default pool is a real vLLM.
    engine: str = "sim"
    vllm: VllmSettings = field(default_factory=VllmSettings)
    engines: dict[str, VllmEngine] = field(default_factory=dict)  # pool -> its first real one
    vllm_count: int = 1  # real engines behind the default pool (engine="vllm")
    real_engines: dict[str, list[VllmEngine]] = field(default_factory=dict)
    engine_facts: dict[str, EngineFacts] = field(default_factory=dict)
    # A real engine's KV capacity and batch slots go into the sidecar's policy (KV
    # admission against them); False: not (a loadtest's unprotected run).
    admit_engine_capacity: bool = True
    # The Envoy configuration for the (runtime) policy and ports: slogate's own bootstrap,
    # or, in tests, an operator's with slogate's fragment merged in.
    bootstrap: Callable[[Policy, EnvoyPorts], dict[str, Any]] = build_bootstrap
    # The region this stack is (tooling.stack.regions): its simulated engines are named
    # `<region>-<pool>` (their `x-sim-pool` header says which region served a request).
    region: str | None = None
    # Where Envoy's client listener binds; None: 127.0.0.1 (a region in a network namespace:
    # 0.0.0.0, reached over its veths).
    listen_host: str | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.listen_port}"

    def pool_url(self, pool: str) -> str:
        return f"http://{HOST}:{self.pool_ports[pool]}"

    def start(self) -> LocalStack:
        try:
            policy = load_policy(self.policy_path)
            self.admin_token_file = ensure_token_file(
                self.admin_token_file or self.work_dir / "admin-token"
            )
            self.tls = policy.tls is not None
            real = {policy.default_pool} if self.engine == "vllm" else set()
            # Started together, then waited for: each loads the tokenizer (~1 s). One
            # simulated engine per endpoint the pool lists.
            started = [
                proc
                for pool in policy.pools.values()
                if pool.name not in real
                for proc in self.start_pool(pool, served_names(policy))
            ]
            for name in sorted(real):  # meanwhile (vLLM takes ~45 s to answer /health)
                self.start_engine(policy, policy.pools[name])
            for name, proc in started:
                match = proc.wait_for_line(r"listening on http://[^:]+:(\d+)")
                self.engine_ports.setdefault(name, []).append(int(match.group(1)))
            for name, ports in self.engine_ports.items():
                self.pool_ports[name] = ports[0]
            moved = any(
                pool.endpoints != tuple((HOST, port) for port in self.engine_ports[name])
                for name, pool in policy.pools.items()
            )
            # Asked for the Redis store here: the stack runs its own (a policy that names
            # Redis itself keeps its redis_url: a server the user runs).
            if self.budget_store is BudgetStoreKind.REDIS:
                self.redis, self.redis_port = start_redis(self.work_dir)
                self.processes.append(self.redis)
            # Only when something moved: otherwise the sidecar reads (and reloads) the user's
            # file.
            rewrite = (
                moved
                or self.budget_store is not None
                or self.replicas > 1
                or real
                or self.record_dir is not None
            )
            self.sidecar_policy_path = self.write_runtime_policy() if rewrite else self.policy_path
            self.fleet = [
                Replica(i, redis_url=self.redis_urls.get(i)) for i in range(self.replicas)
            ]
            for replica in self.fleet:
                self.start_sidecar(replica)
            for replica in self.fleet:
                self.start_envoy(policy, replica)
            for item in dataclasses.fields(Pair):
                setattr(self, item.name, getattr(self.fleet[0], item.name))
        except BaseException:
            self.stop()
            raise
        return self

    def start_pool(self, pool: Pool, models: tuple[str, ...]) -> list[tuple[str, ManagedProcess]]:
        """One simulated engine per endpoint of `pool` (tooling.stack.pool_engines)."""
        return start_sim_pool(self, pool, models)

    def restart_engine(self, pool: str, index: int) -> ManagedProcess:
        """Start the pool's `index`th simulated engine again on its port (a new process)."""
        return restart_sim_engine(self, pool, index)

    def engine_urls(self, pool: str) -> list[str]:
        """Every engine of the pool (one for a real vLLM)."""
        return [f"http://{HOST}:{port}" for port in self.engine_ports.get(pool, [])]

    def start_engine(self, policy: Policy, pool: Pool) -> None:
        """`vllm_count` real vLLMs for `pool`; what they report becomes its capacity."""
        start_real_engines(self, policy, pool)

    def restart_real_engine(self, pool: str, index: int) -> VllmEngine:
        """Start the pool's `index`th real engine again on its port (~50 s)."""
        return restart_real_engine(self, pool, index)

    def write_runtime_policy(self) -> Path:
        """The policy file the sidecar reads (tooling.stack.pool_engines)."""
        return write_runtime_policy(self)

    def start_sidecar(self, replica: Replica) -> None:
        """Replica's sidecar; again on the same ports when it was started before (a
        restart: its Envoy stays pointed at them)."""
        assert self.sidecar_policy_path is not None
        i = replica.index
        name = "sidecar" if i == 0 else f"sidecar-{i}"
        if replica.sidecar is not None:  # a restart: the dead one's log stays
            replica.restarts += 1
            name = f"{name}-restart{replica.restarts}"
        env = {"SLOGATE_REDIS_URL": replica.redis_url} if replica.redis_url else None
        proc, ports = start_sidecar(
            self.work_dir,
            self.sidecar_policy_path,
            name=name,
            grpc_port=replica.grpc_port or _next(self.ports.grpc, i),
            metrics_port=replica.metrics_port or _next(self.ports.metrics, i),
            admin_port=int(replica.admin_address.rsplit(":", 1)[1])
            if replica.admin_address
            else _next(self._admin_api_base(), i),
            exact_tokenizer=self.exact_tokenizer,
            extra_args=self.sidecar_log_args,
            env=env,
            admin_token_file=self.admin_token_file,
        )
        if replica.sidecar is not None and replica.sidecar in self.processes:
            self.processes.remove(replica.sidecar)
        self.processes.append(proc)
        replica.sidecar = proc
        replica.grpc_port, replica.metrics_port = ports.grpc, ports.metrics
        replica.admin_address = ports.admin
        if i == 0:
            self.sidecar = proc

    def _admin_api_base(self) -> int:
        """The first admin API port: after the replicas' gRPC ports when they would overlap
        (the documented 50051 and 50052 are neighbours)."""
        base, grpc = self.ports.admin_api, self.ports.grpc
        if base and grpc and grpc <= base < grpc + self.replicas:
            return grpc + self.replicas
        return base

    def runtime_policy(self, policy: Policy) -> Policy:
        """The policy with each pool pointed at the simulated pool started for it."""
        pools = {
            name: dataclasses.replace(
                pool, endpoints=tuple((HOST, port) for port in self.engine_ports[name])
            )
            for name, pool in policy.pools.items()
        }
        if self.failure_mode is not None:
            policy = dataclasses.replace(policy, failure_mode=self.failure_mode)
        return dataclasses.replace(policy, pools=pools)

    def start_envoy(self, policy: Policy, replica: Replica) -> None:
        i = replica.index
        replica.listen_port = _next(self.ports.listen, i) or free_port(HOST)
        replica.admin_port = _next(self.ports.admin, i) or free_port(HOST)
        config = self.bootstrap(
            self.runtime_policy(policy),
            EnvoyPorts(
                replica.listen_port,
                replica.admin_port,
                replica.grpc_port,
                HOST,
                listen_host=self.listen_host,
            ),
        )
        name = "envoy" if i == 0 else f"envoy-{i}"
        config_path = self.work_dir / f"{name}.json"
        config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
        replica.envoy = ManagedProcess(
            name,
            [
                envoy_binary(),
                "-c",
                str(config_path),
                "--use-dynamic-base-id",
                "--concurrency",
                str(self.envoy_concurrency),
                "--log-level",
                "warn",
            ],
            self.work_dir,
        ).start()
        self.processes.append(replica.envoy)
        replica.envoy.wait_for_http(f"http://{HOST}:{replica.admin_port}/ready")

    def stop_sidecar(self) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()

    def restart_redis(self) -> None:
        """Stop the stack's Redis and start it again on its port (empty: no persistence)."""
        assert self.redis is not None
        self.redis.stop()
        self.processes.remove(self.redis)
        self.redis, _ = start_redis(self.work_dir, port=self.redis_port)
        self.processes.append(self.redis)

    def ready_line(self) -> str:
        """Every port a user may want, replica by replica."""
        lines = [f"  replica {r.index}: {r.url}  ({r.ports()})" for r in self.fleet]
        for pool, facts in self.engine_facts.items():
            lines.append(f"  pool {pool}: {self.pool_url(pool)}  {facts.summary()}")
        if self.redis is not None:
            lines.append(f"  redis: redis://{HOST}:{self.redis_port}")
        return "\n".join(lines)

    def failed(self) -> ManagedProcess | None:
        """A child that died while the stack was meant to be up."""
        return next((p for p in self.processes if not p.running()), None)

    def supervise(self) -> list[str]:
        """Start every sidecar that died again, on its ports, while its Envoy stays up (and
        answers by the failure mode meanwhile); what was restarted. Any other child's
        death is left to `failed`."""
        restarted = []
        for replica in self.fleet:
            dead = replica.sidecar
            if dead is not None and not dead.running():
                code = dead.stop()
                self.start_sidecar(replica)
                restarted.append(f"{dead.name} (exit {code})")
        return restarted

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log_text()[-6000:]}" for p in self.processes)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
