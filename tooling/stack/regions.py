"""Several regions on one machine: `slogate up --regions N` and the regions lab's policies.

What lives here: `region_names`, `single_pool`, `region_policy` (a region's policy from
a base policy: the `regions:` section naming this region, every region's ingress, the
global ledger's URL, crossing for sheddable work, and a global demo tenant with its key
`sk-demo-global`; a pure function of the parsed YAML) and `RegionsStack`: one global
Redis-compatible server (the global ledger) and per region a `LocalStack` (its own Redis,
simulated pools, sidecar, Envoy) on 127.0.0.1, without namespaces, so it runs anywhere.
The same regions in network namespaces with delayed links between them:
tooling.benchmarks.regions.

The sidecar's region side (lease agent, shares, crossing) reads the section; before it
exists the section is parsed and each region serves on its own budgets.
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.runtime.processes import ManagedProcess, ProcessFailed
from policy._regions import LedgerConfig
from policy.loader import load_policy
from policy.schema import BudgetStoreKind
from tooling.stack.local import LocalStack, StackPorts
from tooling.stack.processes import free_port
from tooling.stack.redis import start_redis

HOST = "127.0.0.1"
_NAMES = ("eu", "us", "ap", "sa", "af", "me")
GLOBAL_TENANT = "demo-global"
GLOBAL_KEY = "sk-demo-global"
# Region i's documented ports are the single stack's plus i x this (10000, 11000, ...).
PORT_STRIDE = 1000


def region_names(count: int) -> tuple[str, ...]:
    """`count` region names: eu, us, ap, ... then r6, r7, ..."""
    return tuple(_NAMES[i] if i < len(_NAMES) else f"r{i}" for i in range(count))


_LEDGER = LedgerConfig()  # the policy's defaults


@dataclass(frozen=True, slots=True)
class LedgerTiming:
    """The `regions.ledger` settings the stack writes (the rest: the policy's defaults)."""

    report_interval_s: float = _LEDGER.report_interval_s
    lease_s: float = _LEDGER.lease_s
    timeout_ms: float = _LEDGER.timeout_ms
    fallback_for_s: float = _LEDGER.fallback_for_s
    min_share: float = _LEDGER.min_share


def region_policy(
    base: Mapping[str, Any],
    this: str,
    ingress: Mapping[str, str],
    ledger_url: str,
    secret_file: Path,
    ledger: LedgerTiming = LedgerTiming(),
    global_tokens_per_minute: int = 1_000_000,
    max_added_ms: float = 200.0,
) -> dict[str, Any]:
    """`base` (a parsed policy file) as region `this` runs it: `regions:` lists every region
    with the host:port its peers reach its Envoy at (`ingress`, as seen from `this`), the
    global ledger at `ledger_url`, crossing for sheddable requests with the shared secret
    in `secret_file`; and a tenant `demo-global` (scope global, standard tier, its own
    tokens per minute) with the key `sk-demo-global`. Every other tenant keeps its keys'
    tier (a `defaults` entry is added where the base lists no tenants)."""
    raw = copy.deepcopy(dict(base))
    raw["regions"] = {
        "this": this,
        "list": {name: {"ingress": address} for name, address in sorted(ingress.items())},
        "ledger": {"url": ledger_url, **dataclasses.asdict(ledger)},
        "crossing": {
            "enabled": True,
            "tiers": ["sheddable"],
            "max_added_ms": max_added_ms,
            "secret_file": str(secret_file),
        },
    }
    tenants = raw.setdefault("tenants", {}) or {}
    raw["tenants"] = tenants
    if "defaults" not in tenants:
        tenants["defaults"] = {}
    listed = tenants.setdefault("list", {}) or {}
    tenants["list"] = listed
    listed[GLOBAL_TENANT] = {
        "scope": "global",
        "tier": "standard",
        # Requests and concurrency high enough that only the global tokens bind.
        "limits": {
            "tokens_per_minute": global_tokens_per_minute,
            "requests_per_minute": 100_000,
            "concurrent_requests": 256,
        },
    }
    keys = [k for k in raw.get("keys") or [] if k.get("key") != GLOBAL_KEY]
    raw["keys"] = [*keys, {"key": GLOBAL_KEY, "tenant": GLOBAL_TENANT}]
    return raw


def single_pool(base: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with only its default pool, on one engine, and no routing rules: a region of
    the lab (and a test's) in 3 processes instead of 5 (the example's three pools)."""
    raw = copy.deepcopy(dict(base))
    routing = dict(raw.get("routing") or {})
    default = routing.get("default_pool", "default")
    pool = dict((raw.get("pools") or {})[default])
    pool["endpoints"] = list(pool["endpoints"])[:1]
    raw["pools"] = {default: pool}
    raw["routing"] = {"default_pool": default}
    return raw


def write_secret(path: Path) -> Path:
    """The regions' shared crossing secret: 32 random bytes, hex, 0600."""
    path.write_text(secrets.token_hex(32) + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def region_ports(ports: StackPorts, index: int) -> StackPorts:
    """Region `index`'s ports: each documented one + index x PORT_STRIDE (0 stays 0: free)."""

    def at(port: int) -> int:
        return port + index * PORT_STRIDE if port else 0

    return StackPorts(
        listen=at(ports.listen),
        admin=at(ports.admin),
        grpc=at(ports.grpc),
        metrics=at(ports.metrics),
        admin_api=at(ports.admin_api),
        pools=dict(ports.pools),
    )


def ledger_state(metrics_url: str) -> str | None:
    """The region's state with the global ledger from a sidecar's /metrics (`leased`,
    `cut_off`, `fallback`, `closed`, `none`); None: the sidecar has no region agent.
    Unreachable: `none`."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=2.0) as reply:
            text = reply.read().decode("utf-8", errors="replace")
    except OSError:
        return "none"
    if "# TYPE slogate_region_ledger_state " not in text:
        return None
    for line in text.splitlines():
        if line.startswith("slogate_region_ledger_state{") and line.rstrip().endswith(" 1.0"):
            return line.split('state="', 1)[1].split('"', 1)[0]
    return "none"


@dataclass
class RegionsStack:
    """A global Redis and `count` regions, each a LocalStack with its own Redis, on 127.0.0.1."""

    policy_path: Path
    work_dir: Path
    count: int = 2
    ports: StackPorts = field(default_factory=StackPorts)
    time_scale: float = 1.0
    sidecar_args: tuple[str, ...] = ()
    admin_token_file: Path | None = None
    ledger: LedgerTiming = field(default_factory=LedgerTiming)
    global_redis: ManagedProcess | None = None
    global_port: int = 0
    regions: dict[str, LocalStack] = field(default_factory=dict)

    @property
    def ledger_url(self) -> str:
        return f"redis://{HOST}:{self.global_port}/0"

    def start(self) -> RegionsStack:
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            base = yaml.safe_load(self.policy_path.read_text(encoding="utf-8")) or {}
            pools = {name: 0 for name in load_policy(self.policy_path).pools}  # free ports
            self.global_redis, self.global_port = start_redis(self.work_dir, "global-ledger")
            secret = write_secret(self.work_dir / "regions.key")
            names = region_names(self.count)
            ports = {name: region_ports(self.ports, i) for i, name in enumerate(names)}
            for own in ports.values():
                own.listen = own.listen or free_port(HOST)  # the ingress is named up front
                own.pools = pools
            ingress = {name: f"{HOST}:{p.listen}" for name, p in ports.items()}
            for name in names:
                region_dir = self.work_dir / name
                region_dir.mkdir(exist_ok=True)
                policy = region_policy(base, name, ingress, self.ledger_url, secret, self.ledger)
                path = region_dir / "policy.regions.yaml"
                path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
                self.regions[name] = LocalStack(
                    path,
                    region_dir,
                    ports[name],
                    self.time_scale,
                    budget_store=BudgetStoreKind.REDIS,
                    sidecar_log_args=self.sidecar_args,
                    admin_token_file=self.admin_token_file,
                    region=name,
                )
            for stack in self.regions.values():
                stack.start()
            self.wait_leased()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_leased(self, timeout_s: float = 30.0) -> None:
        """Until every region's sidecar holds a lease of the global ledger (a global tenant
        is refused before: its region holds no share yet), as its /metrics says; at once
        where the sidecar has no region agent (no `slogate_region_ledger_state`)."""
        deadline = time.monotonic() + timeout_s
        waiting = dict(self.regions)
        while waiting:
            for name, stack in list(waiting.items()):
                state = ledger_state(stack.metrics_url)
                if state in (None, "leased"):
                    del waiting[name]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ProcessFailed(
                    f"regions {', '.join(waiting)} hold no lease of the global ledger after "
                    f"{timeout_s:g} s (their sidecars' logs: {self.work_dir})"
                )
            time.sleep(0.2)

    def ready_lines(self) -> str:
        lines = [f"  global ledger: {self.ledger_url}"]
        for name, stack in self.regions.items():
            lines.append(
                f"  region {name}: {stack.url}  (metrics {stack.metrics_url}, slogate admin "
                f"{stack.admin_address}, its redis redis://{HOST}:{stack.redis_port}, "
                f"logs {stack.work_dir})"
            )
        return "\n".join(lines)

    def failed(self) -> ManagedProcess | None:
        for stack in self.regions.values():
            dead = stack.failed()
            if dead is not None:
                return dead
        if self.global_redis is not None and not self.global_redis.running():
            return self.global_redis
        return None

    def supervise(self) -> list[str]:
        return [f"{name}: {what}" for name, s in self.regions.items() for what in s.supervise()]

    def stop(self) -> None:
        for stack in reversed(list(self.regions.values())):
            stack.stop()
        if self.global_redis is not None:
            self.global_redis.stop()
