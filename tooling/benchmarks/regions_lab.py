"""The regions lab (`slogate bench regions`): `LabShape` (how many regions, their delays,
the global tenant's limit, the lease settings, the phases' lengths) and `RegionLab`: a WAN
namespace holding the global ledger's Redis and the delay relays, one namespace per region
running its stack (tooling.stack.region_host), each region reached from the root namespace
over its own edge veth, which a partition does not cut. Why a relay and not netem:
tooling.stack.delay_link.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.runtime.processes import ManagedProcess, python_module
from tooling.stack.netns import NetLab, Veth, free_subnet
from tooling.stack.redis import start_redis
from tooling.stack.regions import (
    LedgerTiming,
    region_names,
    region_policy,
    single_pool,
    write_secret,
)

EXAMPLE_POLICY = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"
LISTEN_PORT = 10000  # every region's Envoy, in its own namespace
METRICS_PORT = 9464
LEDGER_PORT = 6379  # the global Redis, in the WAN namespace
RELAY_LEDGER_PORT = 6400  # region i reaches the ledger at its WAN peer address here
RELAY_PEER_BASE = 7000  # ... and region j's Envoy at RELAY_PEER_BASE + j
# Phase d's region squeezed to this (region_host): few slots, a waiting room that fills
# before its requests time out, so a sheddable request finds it full and may cross.
SQUEEZE_SLOTS = 3
SQUEEZE_WAITING = 2


@dataclass(frozen=True, slots=True)
class LabShape:
    regions: int = 3
    delays_ms: tuple[float, ...] = (20.0, 40.0, 75.0)  # one way, region i <-> the WAN hub
    tokens_per_minute: int = 120_000  # the global tenant's limit
    request_tokens: int = 2000  # each request's output (ignore_eos): weighted ~ this + prompt
    over: float = 2.0  # phases a and c: offered / limit
    spread_s: float = 45.0  # phase a, after the draining burst
    move_s: float = 25.0  # phase b
    report_interval_s: float = 0.5
    lease_s: float = 4.0
    fallback_for_s: float = 30.0
    saturate_s: float = 25.0  # phase d
    time_scale: float = 0.05  # the simulated engines' latency factor

    def delay_ms(self, index: int) -> float:
        return self.delays_ms[index % len(self.delays_ms)]


# -- the lab -------------------------------------------------------------------------------


@dataclass
class LabRegion:
    name: str
    index: int
    ns: str
    edge: Veth  # root (a) <-> the region (b)
    wan: Veth  # the region (a) <-> the WAN namespace (b): its end b down is a partition
    host: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://{self.edge.addr_b}:{LISTEN_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.edge.addr_b}:{METRICS_PORT}/metrics"


@dataclass
class RegionLab:
    shape: LabShape
    work_dir: Path
    base_policy: Path = EXAMPLE_POLICY
    net: NetLab = field(default_factory=NetLab)
    regions: list[LabRegion] = field(default_factory=list)
    ledger_edge: Veth | None = None  # root <-> WAN: the bench reads the global ledger here

    @property
    def saturated(self) -> LabRegion:
        """Phase d's region: the last (squeezed then: tooling.stack.region_host)."""
        return self.regions[-1]

    @property
    def ledger_url(self) -> str:
        assert self.ledger_edge is not None
        return f"redis://{self.ledger_edge.addr_b}:{LEDGER_PORT}/0"

    def start(self) -> RegionLab:
        try:
            self._start()
        except BaseException:
            self.net.close()
            raise
        return self

    def _start(self) -> None:
        octet = free_subnet()
        wan = self.net.namespace("wan")
        self.ledger_edge = self.net.veth(None, f"10.{octet}.250.1", wan, f"10.{octet}.250.2")
        names = region_names(self.shape.regions)
        for i, name in enumerate(names):
            ns = self.net.namespace(name)
            edge = self.net.veth(None, f"10.{octet}.{i}.1", ns, f"10.{octet}.{i}.2")
            link = self.net.veth(ns, f"10.{octet}.{100 + i}.2", wan, f"10.{octet}.{100 + i}.1")
            self.regions.append(LabRegion(name, i, ns, edge, link))
        ledger, _ = start_redis(
            self.work_dir,
            "global-ledger",
            LEDGER_PORT,
            bind="0.0.0.0",
            wrap=["ip", "netns", "exec", wan],
        )
        self.net.processes.append(ledger)
        self.net.start(
            wan,
            "delay-links",
            python_module("tooling.stack.delay_link", *self._links()),
            self.work_dir,
        ).wait_for_line("delay links ready")
        secret = write_secret(self.work_dir / "regions.key")
        base = yaml.safe_load(self.base_policy.read_text(encoding="utf-8")) or {}
        for region in self.regions:
            policy = self._policy(base, region, secret)
            region_dir = self.work_dir / region.name
            region_dir.mkdir(parents=True, exist_ok=True)
            path = region_dir / "policy.regions.yaml"
            path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
            argv = python_module(
                "tooling.stack.region_host",
                "--policy", str(path),
                "--work-dir", str(region_dir),
                "--region", region.name,
                "--time-scale", str(self.shape.time_scale),
                "--squeeze-slots", str(SQUEEZE_SLOTS),
                "--squeeze-waiting", str(SQUEEZE_WAITING),
            )  # fmt: skip
            region.host = self.net.start(region.ns, f"region-{region.name}", argv, self.work_dir)
        for region in self.regions:  # started together, waited for together
            assert region.host is not None
            region.host.wait_for_line(r"region ready: ", timeout_s=180.0)

    def _links(self) -> list[str]:
        """The relay's links: each region to the ledger, and to every peer's Envoy (one
        way: the two regions' delays to the hub added)."""
        links = []
        for region in self.regions:
            hub = region.wan.addr_b
            d = self.shape.delay_ms(region.index)
            links += ["--link", f"{hub}:{RELAY_LEDGER_PORT}=127.0.0.1:{LEDGER_PORT}@{d:g}"]
            for peer in self.regions:
                if peer is not region:
                    both = d + self.shape.delay_ms(peer.index)
                    target = f"{peer.wan.addr_a}:{LISTEN_PORT}"
                    links += [
                        "--link",
                        f"{hub}:{RELAY_PEER_BASE + peer.index}={target}@{both:g}",
                    ]
        return links

    def _policy(self, base: Mapping[str, Any], region: LabRegion, secret: Path) -> dict[str, Any]:
        raw = single_pool(base)
        # Three regions' stacks and the load share two cores here: the example's 10 ms
        # regional Redis timeout would time out on the machine's load, not on Redis.
        raw["budget"] = {**(raw.get("budget") or {}), "redis_timeout_ms": 50}
        hub = region.wan.addr_b
        ingress = {
            peer.name: f"{hub}:{RELAY_PEER_BASE + peer.index}"
            if peer is not region
            else f"{region.edge.addr_b}:{LISTEN_PORT}"
            for peer in self.regions
        }
        return region_policy(
            raw,
            region.name,
            ingress,
            f"redis://{hub}:{RELAY_LEDGER_PORT}/0",
            secret,
            LedgerTiming(
                report_interval_s=self.shape.report_interval_s,
                lease_s=self.shape.lease_s,
                timeout_ms=1000.0,
                fallback_for_s=self.shape.fallback_for_s,
                # The moved tenant's region may reach 96% (the others keep their floor).
                min_share=0.02,
            ),
            global_tokens_per_minute=self.shape.tokens_per_minute,
            max_added_ms=400.0,
        )

    def squeeze(self, region: LabRegion) -> None:
        """The region's pool down to SQUEEZE_SLOTS batch slots and a waiting room of
        SQUEEZE_WAITING (region_host)."""
        assert region.host is not None
        region.host.signal(signal.SIGUSR1)
        region.host.wait_for_line("region squeezed", timeout_s=30.0)

    def cut(self, region: LabRegion) -> None:
        self.net.cut(region.wan)

    def heal(self, region: LabRegion) -> None:
        self.net.heal(region.wan)

    def logs(self) -> str:
        return "\n".join(
            f"===== {p.name} =====\n{p.log_text()[-3000:]}" for p in self.net.processes
        )

    def close(self) -> None:
        self.net.close()
