"""`slogate bench regions`: two or three regions in network namespaces, a WAN between them.

What lives here: the lab (`RegionLab`: a WAN namespace holding the global ledger's Redis
and the delay relays, one namespace per region running its stack, tooling.stack.region_host;
each region reached from the root namespace over its own edge veth, which a partition does
not cut), the load generator (aiohttp, open loop, in the root namespace) and the scenario:

(a) one global tenant spending from every region at once at `over` x its global tokens per
    minute: global overshoot = tokens admitted fleet-wide per minute / the limit, measured
    after a burst that empties the buckets (a bucket holds a minute of its limit);
(b) the tenant moves to one region: seconds until that region holds >= 90% of the limit
    (its lease share), and its admitted rate over the rest of the phase;
(c) one region's WAN veth down for ~2 x lease_s, then up: what it admitted while cut off,
    its ledger states meanwhile, and the reconciliation (the global ledger's usage against
    the sum of the regions' settled usage, and both against what clients were served);
(d) one region's pool saturated (few batch slots, a small waiting room): the share of its
    sheddable requests that crossed to a peer and their added time to first byte against
    the same requests sent to that peer directly; critical requests stayed local.

The sidecar's region side comes from other work (the lease agent: branches leases and
region-agent; crossing: branch crossing). A measurement whose part this sidecar lacks (no
`slogate_region_*` metric of it) is written "not available (needs <branch>)", never
guessed. The pure summaries (`summarise_*`) are apart from the I/O. Why a relay and not
netem: tooling.stack.delay_link.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.runtime.processes import ManagedProcess, python_module
from tooling.benchmarks.reports import write_report
from tooling.stack.netns import NetLab, Veth, free_subnet, netns_unavailable
from tooling.stack.redis import start_redis
from tooling.stack.regions import (
    GLOBAL_KEY,
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
SHEDDABLE_KEY = "sk-demo-batch"
CRITICAL_KEY = "sk-demo-critical"
# Phase d's region squeezed to this (region_host): few slots, a waiting room that fills
# before its requests time out, so a sheddable request finds it full and may cross.
SQUEEZE_SLOTS = 3
SQUEEZE_WAITING = 2
NEEDS_AGENT = "not available (needs leases, region-agent)"
NEEDS_CROSSING = "not available (needs crossing)"


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


@dataclass(slots=True)
class Shot:
    """One request and what came back."""

    phase: str
    region: str  # where it was sent
    key: str
    sent_s: float  # since the run's start
    status: int = 0  # 0: no answer (a client error)
    latency_s: float = 0.0
    ttft_s: float | None = None  # streamed requests: the first body bytes
    served: str | None = None  # the region whose engine answered (x-sim-pool)
    tokens: int = 0  # prompt + completion of an answered request
    error: str = ""


@dataclass(slots=True)
class Sample:
    """One region's region metrics at one moment."""

    t_s: float
    region: str
    share: float | None
    state: str | None
    usage: float | None
    crossed: float | None


# -- pure summaries ------------------------------------------------------------------------


def admitted_tokens(shots: Sequence[Shot], start_s: float, end_s: float) -> int:
    """Tokens of the global tenant's answered requests sent in [start_s, end_s)."""
    return sum(
        s.tokens
        for s in shots
        if s.key == GLOBAL_KEY and s.status == 200 and start_s <= s.sent_s < end_s
    )


def overshoot(shots: Sequence[Shot], start_s: float, end_s: float, limit_per_min: float) -> float:
    """Tokens admitted fleet-wide per minute over the window / the global limit."""
    minutes = (end_s - start_s) / 60.0
    return admitted_tokens(shots, start_s, end_s) / minutes / limit_per_min


def seconds_to_share(
    samples: Sequence[Sample], region: str, since_s: float, share: float
) -> float | None:
    """Seconds from `since_s` until `region`'s lease share first reached `share`; None: never."""
    for sample in samples:
        if (
            sample.region == region
            and sample.t_s >= since_s
            and sample.share is not None
            and sample.share >= share
        ):
            return sample.t_s - since_s
    return None


def states_seen(samples: Sequence[Sample], region: str, start_s: float, end_s: float) -> list[str]:
    """The ledger states `region` went through in the window, in order (a state repeated
    in a row once)."""
    seen: list[str] = []
    for sample in samples:
        inside = sample.region == region and start_s <= sample.t_s < end_s
        if inside and sample.state and (not seen or seen[-1] != sample.state):
            seen.append(sample.state)
    return seen


def mean_share_sum(samples: Sequence[Sample], start_s: float, end_s: float) -> float | None:
    """The regions' lease shares over the window, each region's mean, summed: how much of
    the global limit the regions held between them (1.0: all of it)."""
    by_region: dict[str, list[float]] = {}
    for sample in samples:
        if start_s <= sample.t_s < end_s and sample.share is not None:
            by_region.setdefault(sample.region, []).append(sample.share)
    if not by_region:
        return None
    return sum(statistics.fmean(shares) for shares in by_region.values())


def median_ms(values: Sequence[float]) -> float | None:
    return round(statistics.median(values) * 1000, 1) if values else None


# -- reading a sidecar ---------------------------------------------------------------------


def read_sample(text: str, t_s: float, region: str, tenant: str) -> Sample:
    """The region metrics of one /metrics page (None where this sidecar has no such metric)."""
    from prometheus_client.parser import text_string_to_metric_families

    share = usage = crossed = None
    state = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "slogate_region_lease_share" and s.labels.get("tenant") == tenant:
                share = s.value
            elif s.name == "slogate_region_usage_tokens_total" and s.labels.get("tenant") == tenant:
                usage = s.value
            elif s.name == "slogate_region_ledger_state" and s.value == 1:
                state = s.labels.get("state")
            elif s.name == "slogate_region_crossed_total":
                crossed = (crossed or 0.0) + s.value
    return Sample(t_s, region, share, state, usage, crossed)


def has_metric(text: str, name: str) -> bool:
    """Whether the page declares the metric (a counter's as `<name>_total`, as
    prometheus_client writes it)."""
    return f"# TYPE {name} " in text or f"# TYPE {name}_total " in text


def labelled(text: str, name: str, label: str) -> dict[str, float]:
    """`name`'s samples on the page by the value of `label` (summed over the others)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and label in s.labels:
                found[s.labels[label]] = found.get(s.labels[label], 0.0) + s.value
    return found


def read_global_usage(redis_url: str, tenant: str) -> dict[str, float] | None:
    """Each region's usage of `tenant` as the global ledger stores it (its last report's
    cumulative usage; the leases' global_usage is their sum); None where this checkout has
    no global ledger (branch leases). Read from the ledger's own records
    (budget.global_ledger: `<PREFIX>:tenant:<tenant>`, region -> a MessagePack record)."""
    try:
        from budget import global_ledger
    except ImportError:
        return None
    import msgspec
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5.0)
    try:
        stored: dict[bytes, bytes] = client.hgetall(f"{global_ledger.PREFIX}:tenant:{tenant}")  # type: ignore[assignment]
    finally:
        client.close()
    return {
        region.decode(): float(msgspec.msgpack.decode(record)["usage"])
        for region, record in stored.items()
    }


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


# -- the load ------------------------------------------------------------------------------


def _body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": "a question from the regions lab"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # exactly max_tokens out: every request weighs the same
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


class Load:
    """The load generator: open loop, every answer recorded as a `Shot`."""

    def __init__(self, lab: RegionLab, started: float) -> None:
        import aiohttp

        self.lab = lab
        self.started = started
        self.shots: list[Shot] = []
        self.samples: list[Sample] = []
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return time.monotonic() - self.started

    async def close(self) -> None:
        await self.settle()
        await self._session.close()

    async def settle(self, timeout_s: float = 90.0) -> None:
        """Until every request sent has its answer."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)

    async def one(
        self, phase: str, region: LabRegion, key: str, max_tokens: int, stream: bool = False
    ) -> None:
        shot = Shot(phase, region.name, key, self.now())
        self.shots.append(shot)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        began = time.monotonic()
        try:
            async with self._session.post(
                f"{region.url}/v1/chat/completions",
                data=json.dumps(_body(max_tokens, stream)),
                headers=headers,
            ) as reply:
                shot.status = reply.status
                pool = reply.headers.get("x-sim-pool") or ""
                shot.served = next(
                    (r.name for r in self.lab.regions if pool.startswith(f"{r.name}-")), None
                )
                if reply.status != 200:
                    raw = await reply.read()
                    shot.error = reply.headers.get("x-slogate-reason", "")  # the sidecar's why
                    if not shot.error:
                        with contextlib.suppress(ValueError, AttributeError, KeyError):
                            shot.error = str(json.loads(raw)["error"].get("code", ""))
                elif stream:
                    first = await reply.content.readany()
                    shot.ttft_s = time.monotonic() - began
                    shot.tokens = _stream_tokens(first + await reply.read())
                else:
                    usage = json.loads(await reply.read()).get("usage") or {}
                    shot.tokens = int(usage.get("total_tokens") or 0)
        except Exception as err:  # a client-side failure is a result, not a crash
            shot.error = type(err).__name__
        shot.latency_s = time.monotonic() - began

    def fire(self, *args: Any, **kwargs: Any) -> None:
        task = asyncio.create_task(self.one(*args, **kwargs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def offer(
        self,
        phase: str,
        rate_per_s: float,
        duration_s: float,
        pick: Callable[[int], tuple[LabRegion, str]],
        max_tokens: int,
        stream: bool = False,
    ) -> None:
        """Open loop: request k at start + k / rate, to `pick(k)`'s region with its key."""
        start = time.monotonic()
        count = round(rate_per_s * duration_s)
        for k in range(count):
            wait = start + k / rate_per_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            region, key = pick(k)
            self.fire(phase, region, key, max_tokens, stream)
        # The phase lasts its duration: a rate over it counts every request sent in it.
        await asyncio.sleep(max(0.0, start + duration_s - time.monotonic()))

    async def sample(self, region: LabRegion) -> Sample | None:
        try:
            async with self._session.get(region.metrics_url) as reply:
                text = await reply.text()
        except Exception:
            return None
        got = read_sample(text, self.now(), region.name, "demo-global")
        self.samples.append(got)
        return got

    async def watch(self, stop: asyncio.Event, every_s: float = 0.25) -> None:
        while not stop.is_set():
            await asyncio.gather(*(self.sample(r) for r in self.lab.regions))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)

    async def metrics_text(self, region: LabRegion) -> str:
        async with self._session.get(region.metrics_url) as reply:
            return await reply.text()


def _stream_tokens(raw: bytes) -> int:
    """prompt + completion from a stream's usage event (0 without one)."""
    for line in reversed(raw.decode("utf-8", errors="replace").splitlines()):
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage") or {}
            if usage:
                return int(usage.get("total_tokens") or 0)
    return 0


# -- the scenario --------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    phase: str
    measurement: str
    value: str
    note: str = ""


def _why_not(skipped: Mapping[str, float], rtts: Mapping[str, float]) -> str:
    """The saturated region's reasons not to cross and its measured round trips."""
    said = ""
    counted = {k: v for k, v in sorted(skipped.items()) if v}
    if counted:
        said += "; not crossed: " + ", ".join(f"{k} {v:g}" for k, v in counted.items())
    if rtts:
        said += "; round trips: " + ", ".join(
            f"{k} {v * 1000:.0f} ms" for k, v in sorted(rtts.items())
        )
    return said


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


async def scenario(lab: RegionLab) -> tuple[list[Row], dict[str, Any]]:
    shape = lab.shape
    load = Load(lab, time.monotonic())
    rows: list[Row] = []
    facts: dict[str, Any] = {}
    stop = asyncio.Event()
    watcher = asyncio.create_task(load.watch(stop))
    try:
        texts = [await load.metrics_text(r) for r in lab.regions]
        agent = all(has_metric(t, "slogate_region_ledger_state") for t in texts)
        crossing = all(has_metric(t, "slogate_region_crossed") for t in texts)
        facts.update(region_agent=agent, crossing=crossing)
        if agent:  # every region leased before the clock starts (at most 20 s)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                last = {s.region: s.state for s in load.samples[-len(lab.regions) :]}
                if all(last.get(r.name) == "leased" for r in lab.regions):
                    break
                await asyncio.sleep(0.25)
        for region in lab.regions:  # the path answers before it is measured
            # A global tenant's first request in a region is refused until the region's
            # next report gets it a share (budget_region_share, Retry-After): retried.
            for _ in range(40):
                await load.one("warm", region, GLOBAL_KEY, 16)
                if load.shots[-1].status != 429:
                    break
                await asyncio.sleep(0.5)
        facts["warm"] = {s.region: s.status for s in load.shots if s.phase == "warm"}

        limit = shape.tokens_per_minute
        weight = shape.request_tokens + 20  # the prompt's ~20 tokens (chat template included)
        rate = shape.over * limit / 60.0 / weight  # fleet-wide requests a second
        regions = lab.regions

        def spread(k: int) -> tuple[LabRegion, str]:
            return regions[k % len(regions)], GLOBAL_KEY

        # (a) every region at once. A burst first: buckets hold a minute of their limit,
        # which a burst empties, so the window after it measures the refill.
        burst = math.ceil(1.2 * limit / weight)
        await load.offer("a-burst", burst / 2.0, 2.0, spread, shape.request_tokens)
        await asyncio.sleep(1.0)
        a_start = load.now()
        await load.offer("a", rate, shape.spread_s, spread, shape.request_tokens)
        a_end = load.now()
        # (b) the tenant moves to one region.
        target = regions[0]
        b_start = load.now()
        await load.offer(
            "b", rate, shape.move_s, lambda k: (target, GLOBAL_KEY), shape.request_tokens
        )
        b_end = load.now()
        # (c) one region cut off from the WAN for ~2 x lease_s, then healed.
        cut = regions[1]
        cut_s = 2 * shape.lease_s
        heal_s = max(3.0, 6 * shape.report_interval_s)
        c_start = load.now()
        lab.cut(cut)
        await load.offer("c-cut", rate, cut_s, spread, shape.request_tokens)
        lab.heal(cut)
        c_heal = load.now()
        await load.offer("c-healed", rate, heal_s, spread, shape.request_tokens)
        await load.settle()
        await asyncio.sleep(2 * shape.report_interval_s + 2.0)  # settled, then reported
        sent_cut = [s for s in load.shots if s.phase == "c-cut" and s.region == cut.name]
        while_cut = sum(s.tokens for s in sent_cut if s.status == 200)
        rows.append(
            Row(
                "c",
                f"tokens {cut.name} admitted while cut off ({cut_s:g} s)",
                str(while_cut),
                f"{sum(s.status == 200 for s in sent_cut)} of {len(sent_cut)} requests; "
                f"{while_cut / (cut_s / 60) / limit:.2f} of the global limit per minute; "
                f"lease_s {shape.lease_s:g}, then its fallback (the share it last held)",
            )
        )
        states = states_seen(load.samples, cut.name, c_start, c_heal + heal_s)
        rows.append(
            Row(
                "c",
                f"{cut.name}'s ledger states, cut to healed",
                " -> ".join(states) if agent else NEEDS_AGENT,
            )
        )
        latest: dict[str, Sample] = {}
        for region in regions:
            got = await load.sample(region)
            if got is not None:
                latest[region.name] = got
        served = sum(s.tokens for s in load.shots if s.key == GLOBAL_KEY and s.status == 200)
        usages = [latest[r.name].usage for r in regions if r.name in latest]
        regions_usage = sum(u for u in usages if u is not None) if agent and usages else None
        by_region = read_global_usage(lab.ledger_url, "demo-global") if agent else None
        global_usage = None if by_region is None else sum(by_region.values())
        rows.append(
            Row("c", "tokens clients were served (the global tenant, whole run)", str(served))
        )
        rows.append(
            Row(
                "c",
                "sum of the regions' settled usage (slogate_region_usage_tokens_total)",
                _fmt(regions_usage, 0) if regions_usage is not None else NEEDS_AGENT,
            )
        )
        rows.append(
            Row(
                "c",
                "the global ledger's usage after the heal",
                _fmt(global_usage, 0) if global_usage is not None else NEEDS_AGENT,
                "equal to the regions' sum: nothing double-counted",
            )
        )
        facts["reconciliation"] = {
            "served": served,
            "regions_usage": regions_usage,
            "global_usage": global_usage,
            "global_by_region": by_region,
            "regions_by_region": {n: latest[n].usage for n in latest},
        }

        # (d) one region's pool saturated: sheddable may cross, critical stays.
        sat, peer = lab.saturated, regions[0]
        long_tokens = 3000
        lab.squeeze(sat)
        d_start = load.now()
        await asyncio.gather(
            load.offer(
                "d-sheddable",
                1.8,
                shape.saturate_s,
                lambda k: (sat, SHEDDABLE_KEY),
                long_tokens,
                True,
            ),
            load.offer(
                "d-critical",
                0.3,
                shape.saturate_s,
                lambda k: (sat, CRITICAL_KEY),
                long_tokens,
                True,
            ),
            load.offer(
                "d-control",
                0.3,
                shape.saturate_s,
                lambda k: (peer, SHEDDABLE_KEY),
                long_tokens,
                True,
            ),
        )
        await load.settle()
        sat_page = await load.metrics_text(sat)
        skipped = labelled(sat_page, "slogate_region_crossing_skipped_total", "reason")
        rtts = labelled(sat_page, "slogate_region_link_rtt_seconds", "peer")
        facts["crossing_seen"] = {"skipped": skipped, "link_rtt_s": rtts}
        shed = [s for s in load.shots if s.phase == "d-sheddable"]
        crossed = [s for s in shed if s.status == 200 and s.served not in (None, sat.name)]
        local = [s for s in shed if s.status == 200 and s.served == sat.name]
        refused = [s for s in shed if s.status != 200]
        control = [s for s in load.shots if s.phase == "d-control" and s.status == 200]
        crit = [s for s in load.shots if s.phase == "d-critical"]
        crit_ok = [s for s in crit if s.status == 200]
        crit_local = [s for s in crit_ok if s.served == sat.name]
        crossed_ttft = median_ms([s.ttft_s for s in crossed if s.ttft_s is not None])
        control_ttft = median_ms([s.ttft_s for s in control if s.ttft_s is not None])
        rows.append(
            Row(
                "d",
                f"sheddable requests at {sat.name} that crossed",
                f"{len(crossed)}/{len(shed)}" if crossing else NEEDS_CROSSING,
                f"served at {sat.name}: {len(local)}, refused: {len(refused)} "
                f"({', '.join(sorted({s.error or str(s.status) for s in refused})) or '-'}); "
                f"{sat.name}'s pool: {SQUEEZE_SLOTS} batch slots, waiting room {SQUEEZE_WAITING}"
                f"{_why_not(skipped, rtts)}",
            )
        )
        added = (
            None if crossed_ttft is None or control_ttft is None else crossed_ttft - control_ttft
        )
        rows.append(
            Row(
                "d",
                "added time to first byte of a crossed request (median, vs sent to the peer)",
                _fmt(added, 1, " ms")
                if crossing and added is not None
                else (NEEDS_CROSSING if not crossing else "no crossed request"),
                f"control: {len(control)} sheddable requests sent to {peer.name} directly, "
                f"median {_fmt(control_ttft, 1, ' ms')}",
            )
        )
        rows.append(
            Row(
                "d",
                f"critical requests at {sat.name} served there",
                f"{len(crit_local)}/{len(crit_ok)}",
                f"{len(crit) - len(crit_ok)} of {len(crit)} refused",
            )
        )
        # (a) and (b), read once every answer is in (a request counts when it is answered).
        ratio = overshoot(load.shots, a_start, a_end, limit)
        held = mean_share_sum(load.samples, a_start, a_end)
        offered = shape.over
        rows.append(
            Row(
                "a",
                "global overshoot (admitted fleet-wide per minute / limit)",
                _fmt(ratio) if agent else NEEDS_AGENT,
                f"offered {offered:g}x over {shape.spread_s:g} s from {len(regions)} regions"
                + (f"; the regions' shares summed to {held:.2f} on average" if held else "")
                + (
                    ""
                    if agent
                    else f"; measured without leases: {ratio:.2f}x (each region "
                    "enforces the whole limit)"
                ),
            )
        )

        took = seconds_to_share(load.samples, target.name, b_start, 0.9)
        second_half = overshoot(load.shots, (b_start + b_end) / 2, b_end, limit)
        rows.append(
            Row(
                "b",
                f"seconds until {target.name} holds >= 90% of the limit",
                (_fmt(took, 1, " s") if took is not None else "never in the phase")
                if agent
                else NEEDS_AGENT,
                f"all traffic moved to {target.name} at {offered:g}x the limit",
            )
        )
        rows.append(
            Row(
                "b",
                f"{target.name}'s admitted rate / limit, second half of the phase",
                _fmt(second_half) if agent else NEEDS_AGENT,
                "" if agent else f"measured without leases: {second_half:.2f}",
            )
        )

        facts["phases_s"] = {
            "a": [round(a_start, 1), round(a_end, 1)],
            "b": [round(b_start, 1), round(b_end, 1)],
            "c": [round(c_start, 1), round(c_heal, 1)],
            "d": [round(d_start, 1), round(load.now(), 1)],
        }
    finally:
        stop.set()
        await watcher
        await load.close()
    rows.sort(key=lambda row: row.phase)  # (a) and (b) were read last
    facts["shots"] = [asdict(s) for s in load.shots]
    facts["samples"] = [asdict(s) for s in load.samples]
    return rows, facts


def markdown(shape: LabShape, rows: Sequence[Row], facts: Mapping[str, Any], setup_s: float) -> str:
    delays = ", ".join(
        f"{name} {shape.delay_ms(i):g} ms" for i, name in enumerate(region_names(shape.regions))
    )
    lines = [
        "# Regions lab (`slogate bench regions`)",
        "",
        f"{shape.regions} regions, each in its own network namespace with its stack (Redis, "
        "one simulated engine, sidecar, Envoy); a WAN namespace holds the global ledger's "
        "Redis and a user-space delay relay (no tc netem in this kernel: "
        f"tooling/stack/delay_link.py). One-way delay to the hub: {delays}; between two "
        "regions the sum. The load generator runs in the root namespace, over each region's "
        "edge veth (a partition cuts the region's WAN veth only).",
        "",
        f"Global tenant `demo-global`: {shape.tokens_per_minute} weighted tokens a minute, "
        f"requests of ~{shape.request_tokens + 20} tokens; leases: report every "
        f"{shape.report_interval_s:g} s, lease_s {shape.lease_s:g}, fallback for "
        f"{shape.fallback_for_s:g} s. Sidecar: region agent "
        f"{'present' if facts.get('region_agent') else 'absent'}, crossing "
        f"{'present' if facts.get('crossing') else 'absent'}. Lab started in {setup_s:.0f} s.",
        "",
        "| phase | measurement | value | note |",
        "| --- | --- | --- | --- |",
        *(f"| {r.phase} | {r.measurement} | {r.value} | {r.note} |" for r in rows),
        "",
    ]
    return "\n".join(lines)


def run(out_dir: Path, shape: LabShape, name: str = "regions") -> int:
    why = netns_unavailable()
    if why is not None:
        print(f"slogate bench regions: needs network namespaces: {why}", file=sys.stderr)
        return 2
    import tempfile

    work_dir = Path(tempfile.mkdtemp(prefix="slogate-regions-"))
    began = time.monotonic()
    lab = RegionLab(shape, work_dir)
    try:
        lab.start()
        setup_s = time.monotonic() - began
        print(f"regions lab up in {setup_s:.0f} s (logs {work_dir})", flush=True)
        rows, facts = asyncio.run(scenario(lab))
    except BaseException:
        print(lab.logs()[-8000:], file=sys.stderr)
        raise
    finally:
        lab.close()
    report = {"shape": asdict(shape), "rows": [asdict(r) for r in rows], **facts}
    page = markdown(shape, rows, facts, setup_s)
    write_report(out_dir, name, report, page)
    print(page)
    print(f"total {time.monotonic() - began:.0f} s; results in {out_dir / name}.md", flush=True)
    return 0
