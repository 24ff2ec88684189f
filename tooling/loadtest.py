"""`slogate loadtest`: a `sim/workloads/` file played as open-loop arrivals against a live
stack, measured the way its users see it.

What lives here: `Shot` (one request as its client saw it), `play` (every arrival sent at
its own time, whatever the stack answers: no coordinated omission), `report` and `table`
(per tier and tenant: statuses by reason, P50/P99 TTFT and latency, SLO attainment, and how
late the arrivals left). Prompts are the simulator's own texts (sim.prompts), so the
sidecar counts what the offline simulator counts; keys are the workload's `sk-<tenant>`.

Time scale: the arrival times are multiplied by it, as the simulated pools' latencies are
(`slogate up --time-scale`), so the load on the pools is the workload's; reported times
are divided by it (workload seconds). Envoy's and the sidecar's own milliseconds are not
scaled, so at 0.1 they weigh ten times more in the reported times than they do live.

On schedule: each arrival is a task started at `start + at_s x scale`; a request never waits
for another's answer. How late each one really left is measured (`lag`) and reported: a
loaded generator shows up there instead of silently thinning the load.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from breaker.objectives import latency_objective_s
from policy import BreakerThresholds, BudgetStoreKind, Policy, Tier, parse_policy
from sim.arrivals import Arrival
from sim.config import PoolConfig
from sim.offline import OfflineFleet
from sim.prompts import library
from sim.scenarios import Workload, summarize, workload_from
from sim.sidecar import refusal_kind
from tooling.processes import process_table, tree_usage
from tooling.stack import LocalStack, StackPorts

CHAT = "/v1/chat/completions"


@dataclass
class Shot:
    """One request as its client saw it (seconds are real ones)."""

    tenant: str
    tier: str
    scheduled_s: float  # after the start, scaled
    lag_s: float = 0.0  # how late it left
    stream: bool = True
    prompt_tokens: int = 0  # the workload's size (the engine reports its own in usage)
    max_tokens: int = 0
    status: int = 0  # 0: no answer (connection refused or reset)
    reason: str = ""  # x-slogate-reason of a refusal
    error_json: bool = True  # a refusal came as an OpenAI JSON error with a message
    error_code: str = ""  # its `code` (or `type`): slogate's reason, or the engine's
    ttft_s: float | None = None  # first content event; a JSON answer: the whole answer
    latency_s: float | None = None
    completion_tokens: int | None = None
    sent_s: float = 0.0  # after the start
    during_fault: bool = False  # alive while a scheduled fault was
    pool: str = ""  # x-slogate-pool of the answer: the pool that served (or failed) it
    nonce: int = 0  # its place in the run: what makes its prompt its own


def messages(arrival: Arrival, nonce: int) -> list[dict[str, str]]:
    """The prompt: a short message of its own first, then the library's texts. The library
    reuses its texts, so without the first message every prompt of a size would be the same
    and an engine's prefix cache would serve them all (a 30k-token prompt's P99 TTFT was
    0.57 s live against the simulator's 2.66 s, which has no prefix cache); real requests
    from different users share no prefix. The sidecar still counts the texts once each."""
    texts = library(arrival.crafted).messages(arrival.prompt_tokens)
    first = {"role": "user", "content": f"Ticket {nonce}:"}
    return [first, *({"role": "user", "content": text} for text in texts)]


async def fire(
    session: aiohttp.ClientSession, url: str, key: str, arrival: Arrival, shot: Shot
) -> None:
    body: dict[str, Any] = {
        "model": "deepseek-v4",
        "messages": messages(arrival, shot.nonce),
        "max_tokens": arrival.max_tokens,
        "stream": arrival.stream,
    }
    if arrival.stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"authorization": f"Bearer {key}"}
    started = time.monotonic()
    try:
        async with session.post(f"{url}{CHAT}", json=body, headers=headers) as reply:
            shot.status = reply.status
            shot.reason = reply.headers.get("x-slogate-reason", "")
            shot.pool = reply.headers.get("x-slogate-pool", "")
            if reply.status != 200:
                try:
                    error = json.loads(await reply.read())["error"]
                    shot.error_json = bool(error.get("message"))
                    shot.error_code = str(error.get("code") or error.get("type") or "")
                except (ValueError, KeyError, TypeError):
                    shot.error_json = False
                return
            if not arrival.stream:
                answer = json.loads(await reply.read())
                shot.ttft_s = time.monotonic() - started
                shot.completion_tokens = (answer.get("usage") or {}).get("completion_tokens")
                return
            async for raw in reply.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                choices = event.get("choices") or []
                if shot.ttft_s is None and any(
                    (c.get("delta") or {}).get("content") for c in choices
                ):
                    shot.ttft_s = time.monotonic() - started
                if event.get("usage"):
                    shot.completion_tokens = event["usage"].get("completion_tokens")
    except (aiohttp.ClientError, TimeoutError, ValueError):
        shot.status = shot.status or 0
    finally:
        shot.latency_s = time.monotonic() - started


async def play(
    arrivals: Sequence[Arrival],
    url: str,
    keys: Mapping[str, str],
    time_scale: float = 1.0,
    timeout_s: float = 600.0,
    sampler: ProcessSampler | None = None,
    alongside: Callable[[float], Coroutine[Any, Any, None]] | None = None,
    watch: Callable[[float], Coroutine[Any, Any, None]] | None = None,
) -> list[Shot]:
    """Every arrival sent at its scaled time; returns when the last one is answered.
    Given the clock's start: `alongside` runs meanwhile and is waited for (a fault
    schedule), `watch` runs until the end (a sampler)."""
    sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
    side: asyncio.Task[None] | None = None
    watching: asyncio.Task[None] | None = None
    for arrival in arrivals:  # build the prompt texts before the clock starts
        library(arrival.crafted)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    shots: list[Shot] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic() + 0.2
        if alongside is not None:
            side = asyncio.create_task(alongside(start))
        if watch is not None:
            watching = asyncio.create_task(watch(start))
        tasks = []
        for index, arrival in enumerate(arrivals):
            shot = Shot(
                arrival.key.tenant,
                arrival.key.tier.value,
                arrival.at_s * time_scale,
                stream=arrival.stream,
                prompt_tokens=arrival.prompt_tokens,
                max_tokens=arrival.max_tokens,
                nonce=index,
            )
            shots.append(shot)
            delay = start + shot.scheduled_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            shot.lag_s = max(0.0, time.monotonic() - start - shot.scheduled_s)
            tasks.append(asyncio.create_task(fire(session, url, keys[shot.tenant], arrival, shot)))
        await asyncio.gather(*tasks)
        for shot in shots:
            shot.sent_s = shot.scheduled_s + shot.lag_s
    if side is not None:
        await side  # its last fault may outlast the last answer
    if watching is not None:
        watching.cancel()
    if sampling is not None:
        sampling.cancel()
        assert sampler is not None
        sampler.sample()
    return shots


class ProcessSampler:
    """CPU seconds and RSS of the stack's processes over the run, read from /proc (Linux):
    on a 2-core machine the generator, Envoy, the sidecar and the pools share the CPU, and
    a reader must be able to tell which one ran short."""

    def __init__(self, pids: Callable[[], Mapping[str, int]]) -> None:
        self.pids = pids  # asked at every sample: a restarted process is a new name
        self.samples: list[tuple[float, dict[str, tuple[float, float]]]] = []

    def sample(self) -> None:
        table = process_table()
        roots = self.pids()
        others = set(roots.values())
        now = {name: tree_usage(pid, table, others) for name, pid in roots.items()}
        self.samples.append((time.monotonic(), {k: v for k, v in now.items() if v is not None}))

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval_s)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per process, over the samples it appears in: CPU share of one core, RSS at its
        first and last sample (MiB) and the slope (MiB per minute)."""
        seen: dict[str, list[tuple[float, tuple[float, float]]]] = {}
        for at, values in self.samples:
            for name, value in values.items():
                seen.setdefault(name, []).append((at, value))
        out = {}
        for name, points in seen.items():
            if len(points) < 2:
                continue
            (t0, first), (t1, last) = points[0], points[-1]
            wall = max(t1 - t0, 1e-9)
            out[name] = {
                "cpu_share": (last[0] - first[0]) / wall,
                "rss_start_mib": first[1],
                "rss_end_mib": last[1],
                "rss_slope_mib_per_min": (last[1] - first[1]) / wall * 60,
            }
        return out


class SignalSampler:
    """What the engines and the sidecar said over the run, scraped every second: each
    pool's KV-cache usage (the mean of its engines') and running / waiting requests (their
    sum, from each engine's /metrics), each breaker's level and each tier's quota
    multiplier (the sidecar's /metrics)."""

    def __init__(self, engines: Mapping[str, Sequence[str]], sidecar_metrics: str | None) -> None:
        self.engines = {pool: list(urls) for pool, urls in engines.items()}  # /metrics URLs
        self.sidecar_metrics = sidecar_metrics
        self.timeline: list[dict[str, Any]] = []
        # phase -> (bucket bound s, cumulative count) of slogate_decision_seconds
        self.decisions: dict[str, list[tuple[float, float]]] = {}

    async def _text(self, session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url) as reply:
                return await reply.text() if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def sample(self, session: aiohttp.ClientSession, at_s: float) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        row: dict[str, Any] = {"at_s": at_s, "pools": {}, "breakers": {}, "multipliers": {}}
        decisions: dict[str, list[tuple[float, float]]] = {}
        for pool, urls in self.engines.items():
            texts = [t for url in urls if (t := await self._text(session, url)) is not None]
            if not texts:
                continue
            values: dict[str, float] = {}
            for engine_text in texts:
                for family in text_string_to_metric_families(engine_text):
                    for sample in family.samples:
                        short = sample.name.removeprefix("vllm:")
                        if short in ("kv_cache_usage_perc", "num_requests_running",
                                     "num_requests_waiting", "num_preemptions_total"):  # fmt: skip
                            values[short] = values.get(short, 0.0) + sample.value
            if "kv_cache_usage_perc" in values:  # equal engines: the mean is the pool's
                values["kv_cache_usage_perc"] /= len(texts)
            row["pools"][pool] = values
        text = await self._text(session, self.sidecar_metrics) if self.sidecar_metrics else None
        for family in text_string_to_metric_families(text or ""):
            for sample in family.samples:
                if sample.name == "slogate_breaker_level":
                    row["breakers"][sample.labels["pool"]] = sample.value
                elif sample.name == "slogate_quota_multiplier":
                    row["multipliers"][sample.labels["tier"]] = sample.value
                elif sample.name == "slogate_decision_seconds_bucket":
                    bound = float(sample.labels["le"])
                    decisions.setdefault(sample.labels["phase"], []).append((bound, sample.value))
        if decisions:
            self.decisions = decisions  # cumulative: the last scrape holds the whole run
        self.timeline.append(row)

    async def run(self, start: float, interval_s: float = 1.0) -> None:
        timeout = aiohttp.ClientTimeout(total=max(0.5, interval_s))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.sample(session, time.monotonic() - start)
                await asyncio.sleep(interval_s)

    def summary(self) -> dict[str, Any]:
        """Per pool: mean and max KV usage, mean and max running, max waiting; per breaker
        its highest level and the seconds at L1 or above; per tier the lowest multiplier."""
        pools: dict[str, Any] = {}
        for pool in self.engines:
            rows = [r["pools"][pool] for r in self.timeline if pool in r["pools"]]
            if not rows:
                continue
            kv = [r.get("kv_cache_usage_perc", 0.0) for r in rows]
            running = [r.get("num_requests_running", 0.0) for r in rows]
            preemptions = [r["num_preemptions_total"] for r in rows if "num_preemptions_total" in r]
            pools[pool] = {
                "preemptions": preemptions[-1] - preemptions[0] if preemptions else None,
                "kv_usage_mean": sum(kv) / len(kv),
                "kv_usage_max": max(kv),
                "running_mean": sum(running) / len(running),
                "running_max": max(running),
                "waiting_max": max(r.get("num_requests_waiting", 0.0) for r in rows),
            }
        breakers: dict[str, Any] = {}
        names = {name for r in self.timeline for name in r["breakers"]}
        step = _interval(self.timeline)
        for name in sorted(names):
            levels = [r["breakers"][name] for r in self.timeline if name in r["breakers"]]
            breakers[name] = {
                "max_level": max(levels),
                "seconds_at_l1_or_above": sum(step for level in levels if level >= 1),
            }
        tiers = {tier for r in self.timeline for tier in r["multipliers"]}
        multipliers = {
            tier: min(r["multipliers"][tier] for r in self.timeline if tier in r["multipliers"])
            for tier in sorted(tiers)
        }
        decision = {
            phase: {f"p{round(q * 100)}_ms": _bucket_quantile(buckets, q) for q in (0.5, 0.99)}
            for phase, buckets in sorted(self.decisions.items())
        }
        return {
            "pools": pools,
            "breakers": breakers,
            "lowest_multipliers": multipliers,
            "decision": decision,
        }


def _bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The upper bound (ms) of the histogram bucket holding the q-quantile: an upper bound
    on it, as close as the sidecar's buckets allow; None past the last finite bucket."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    for bound, count in ordered:
        if count >= q * total:
            return None if math.isinf(bound) else bound * 1000
    return None


def _interval(timeline: Sequence[Mapping[str, Any]]) -> float:
    if len(timeline) < 2:
        return 0.0
    return (timeline[-1]["at_s"] - timeline[0]["at_s"]) / (len(timeline) - 1)


async def drained(admin_address: str, timeout_s: float = 15.0) -> dict[str, int]:
    """After the run, once nothing is left in flight (or `timeout_s` passed): requests in
    flight, KV tokens and batch slots held, budget reservations outstanding (all should be
    0), from the sidecar's admin API."""
    from extproc.adminpb import admin_pb2 as pb
    from tooling import admin_client

    channel, stub = admin_client.stub(admin_address)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            status = await stub.Status(pb.StatusRequest(), timeout=5)
            keys = await stub.Keys(pb.KeysRequest(), timeout=10)
            left = {
                "inflight_requests": int(status.inflight_requests),
                "kv_tokens_held": sum(int(a.kv_tokens_held) for a in status.admission),
                "batch_slots_held": sum(int(a.requests_held) for a in status.admission),
                "reservations_outstanding": sum(int(k.outstanding) for k in keys.keys),
            }
            if not any(left.values()) or time.monotonic() > deadline:
                return left
            await asyncio.sleep(0.5)
    finally:
        await channel.close()


@dataclass(frozen=True)
class Fault:
    """One entry of a workload's `faults:` (workload seconds): a pool's latency or errors
    for a while (`pool` + `latency_ms` / `error_rate` / `error_status`, `for_s`), a
    SIGKILLed sidecar (`kill: sidecar`, restarted by the stack's supervisor), or Redis
    stopped and started again (`restart: redis`, with the Redis store)."""

    at_s: float
    for_s: float = 0.0
    pool: str | None = None
    settings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    kill: str | None = None
    restart: str | None = None


_POOL_FAULT = {"latency_ms", "error_rate", "error_status"}


def load_faults(raw: object) -> list[Fault]:
    """A workload's `faults:` list, checked (an unknown field is an error)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("faults: expected a list")
    faults = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"faults[{i}]: expected a mapping")
        unknown = set(item) - {"at_s", "for_s", "pool", "kill", "restart"} - _POOL_FAULT
        if unknown:
            raise ValueError(f"faults[{i}]: unknown field {sorted(unknown)[0]}")
        settings = {k: float(v) for k, v in item.items() if k in _POOL_FAULT}
        fault = Fault(
            float(item["at_s"]),
            float(item.get("for_s", 0.0)),
            item.get("pool"),
            settings,
            item.get("kill"),
            item.get("restart"),
        )
        kinds = [fault.pool is not None, fault.kill is not None, fault.restart is not None]
        if (
            sum(kinds) != 1
            or (fault.kill not in (None, "sidecar"))
            or (fault.restart not in (None, "redis"))
        ):
            raise ValueError(f"faults[{i}]: one of pool, kill: sidecar, restart: redis")
        if fault.pool is not None and (not settings or fault.for_s <= 0):
            raise ValueError(f"faults[{i}]: a pool fault needs for_s and what to inject")
        faults.append(fault)
    return sorted(faults, key=lambda f: f.at_s)


class StackFaults:
    """Applies a fault schedule to a LocalStack, keeping its sidecars supervised; records
    each fault's window (real seconds after the start) for the report."""

    def __init__(self, stack: LocalStack, faults: Sequence[Fault], time_scale: float) -> None:
        self.stack = stack
        self.faults = faults
        self.time_scale = time_scale
        self.windows: list[dict[str, Any]] = []

    async def __call__(self, start: float) -> None:
        supervising = asyncio.create_task(self._supervise())
        try:
            for fault in self.faults:
                delay = start + fault.at_s * self.time_scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                began = time.monotonic() - start
                ended = await self._apply(fault, start)
                self.windows.append(
                    {"fault": _describe(fault), "from_s": began, "to_s": ended - start}
                )
            await asyncio.sleep(0)
        finally:
            supervising.cancel()

    async def _apply(self, fault: Fault, start: float) -> float:
        """Inject; returns when (monotonic) the fault is over."""
        if fault.pool is not None:
            body = {**fault.settings, "duration_s": fault.for_s * self.time_scale}
            if "error_status" in body:
                body["error_status"] = int(body["error_status"])
            async with aiohttp.ClientSession() as session:
                for engine in self.stack.engine_urls(fault.pool):  # a pool's fault: all of it
                    async with session.post(f"{engine}/fault", json=body) as r:
                        r.raise_for_status()
            return time.monotonic() + fault.for_s * self.time_scale
        if fault.kill == "sidecar":
            victim = self.stack.sidecar
            assert victim is not None and victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            for _ in range(600):  # until the supervisor has started the new one (<= 60 s)
                if self.stack.sidecar is not victim and self.stack.sidecar is not None:
                    break
                await asyncio.sleep(0.1)
            return time.monotonic() + 1.0  # and a second for Envoy to reconnect
        await asyncio.to_thread(self.stack.restart_redis)
        return time.monotonic() + 1.0

    async def _supervise(self) -> None:
        while True:
            await asyncio.to_thread(self.stack.supervise)
            await asyncio.sleep(0.2)


def _describe(fault: Fault) -> str:
    if fault.pool is not None:
        what = ", ".join(f"{k} {v:g}" for k, v in fault.settings.items())
        return f"pool {fault.pool}: {what} for {fault.for_s:g} s at {fault.at_s:g} s"
    if fault.kill is not None:
        return f"SIGKILL {fault.kill} at {fault.at_s:g} s"
    return f"restart {fault.restart} at {fault.at_s:g} s"


def mark_faults(shots: Sequence[Shot], windows: Sequence[Mapping[str, Any]]) -> None:
    """A shot alive during a fault's window is `during_fault`."""
    for shot in shots:
        end = shot.sent_s + (shot.latency_s or 0.0)
        shot.during_fault = any(shot.sent_s <= w["to_s"] and end >= w["from_s"] for w in windows)


def _quantile(values: Sequence[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _within(policy: Policy, shot: Shot, time_scale: float) -> bool:
    bucket = policy.bucket_for(shot.prompt_tokens + shot.max_tokens).name
    objective = latency_objective_s(
        policy, Tier(shot.tier), bucket, shot.stream, shot.completion_tokens, shot.tenant
    )
    if objective is None or shot.ttft_s is None:
        return objective is None
    return shot.ttft_s / time_scale <= objective


def _summary(
    shots: Sequence[Shot], policy: Policy, time_scale: float, duration_s: float | None = None
) -> dict[str, Any]:
    served = [s for s in shots if s.status == 200 and s.ttft_s is not None]
    statuses: dict[str, int] = {}
    for s in shots:
        name = str(s.status) + (f" {s.reason}" if s.reason else "")
        statuses[name] = statuses.get(name, 0) + 1

    def scaled(values: list[float], q: float) -> float | None:
        value = _quantile(values, q)
        return None if value is None else value / time_scale

    calm = [s for s in served if not s.during_fault]
    within = [s for s in served if _within(policy, s, time_scale)]
    ttfts = [s.ttft_s for s in served if s.ttft_s is not None]
    latencies = [s.latency_s for s in served if s.latency_s is not None]
    return {
        "requests": len(shots),
        "served": len(served),
        "statuses": dict(sorted(statuses.items())),
        "p50_ttft_s": scaled(ttfts, 0.5),
        "p99_ttft_s": scaled(ttfts, 0.99),
        "p50_latency_s": scaled(latencies, 0.5),
        "p99_latency_s": scaled(latencies, 0.99),
        "slo_attainment": len(within) / len(served) if served else None,
        # As the simulator counts it (sim.scenarios.summarize): a refusal is a miss.
        "slo_attainment_of_all": len(within) / len(shots) if shots else None,
        # Completion tokens of the answers within their SLO, per workload second.
        "goodput_tokens_per_s": (
            sum(s.completion_tokens or 0 for s in within) / duration_s if duration_s else None
        ),
        "slo_attainment_outside_faults": (
            sum(_within(policy, s, time_scale) for s in calm) / len(calm) if calm else None
        ),
        "server_errors_outside_faults": sum(
            1 for s in shots if (s.status >= 500 or s.status == 0) and not s.during_fault
        ),
        "tokens_received": sum(s.completion_tokens or 0 for s in served),
    }


def report(
    shots: Sequence[Shot],
    policy: Policy,
    time_scale: float,
    workload: str,
    processes: Mapping[str, Mapping[str, float]] | None = None,
    after_drain: Mapping[str, int] | None = None,
    faults: Sequence[Mapping[str, Any]] = (),
    signals: Mapping[str, Any] | None = None,
    timeline: Sequence[Mapping[str, Any]] = (),
    duration_s: float | None = None,
    bursts: Sequence[tuple[float, float]] = (),
    burst_tenants: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """`duration_s`: the workload's (for goodput); `bursts` and `burst_tenants`: its burst
    windows in workload seconds and whose requests count there (burst handling, as the
    simulator reports it: the share of those requests served within their SLO)."""
    lags = [s.lag_s for s in shots]
    in_burst = [
        s
        for s in shots
        if (not burst_tenants or s.tenant in burst_tenants)
        and any(a <= s.scheduled_s / time_scale < b for a, b in bursts)
    ]
    handled = [
        s
        for s in in_burst
        if s.status == 200 and s.ttft_s is not None and _within(policy, s, time_scale)
    ]
    return {
        "all": _summary(shots, policy, time_scale, duration_s),
        "burst_handling": len(handled) / len(in_burst) if in_burst else None,
        "faults": list(faults),
        "signals": dict(signals or {}),
        "timeline": list(timeline),
        "processes": dict(processes or {}),
        "after_drain": dict(after_drain or {}),
        "workload": workload,
        "time_scale": time_scale,
        "tiers": {
            tier.value: _summary(
                [s for s in shots if s.tier == tier.value], policy, time_scale, duration_s
            )
            for tier in Tier
        },
        "tenants": {
            tenant: _summary(
                [s for s in shots if s.tenant == tenant], policy, time_scale, duration_s
            )
            for tenant in sorted({s.tenant for s in shots})
        },
        "pools": pool_answers(shots),
        # Real seconds, unscaled: how late the generator sent.
        "lag_p99_s": _quantile(lags, 0.99),
        "lag_max_s": max(lags, default=None),
        "errors_without_json": sum(1 for s in shots if s.status != 200 and not s.error_json),
        "shots": [asdict(s) for s in shots],
    }


def pool_answers(shots: Sequence[Shot]) -> dict[str, dict[str, int]]:
    """Per pool, the requests it answered (x-slogate-pool, which Envoy's pool routes add):
    how many, served, and 5xx (an injected fault, a full engine queue). slogate's own
    refusals (they carry x-slogate-reason) are left out: Envoy names the route it had
    picked before the decision on them, not a pool that saw them."""
    pools: dict[str, dict[str, int]] = {}
    for shot in shots:
        if shot.pool and not shot.reason:
            row = pools.setdefault(shot.pool, {"requests": 0, "served": 0, "server_errors": 0})
            row["requests"] += 1
            row["served"] += shot.status == 200
            row["server_errors"] += shot.status >= 500
    return dict(sorted(pools.items()))


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A table after a blank line; nothing without rows."""
    if not rows:
        return []
    return [
        "",
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _format(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"loadtest {result['workload']} at time scale {result['time_scale']} (times in "
        f"workload seconds); arrivals late by p99 {_format(result['lag_p99_s'], '{:.3f}')} s, "
        f"at most {_format(result['lag_max_s'], '{:.3f}')} s (real)",
        "",
        "| who | requests | served | p50 TTFT | p99 TTFT | p99 latency | SLO attainment "
        "| goodput tok/s | statuses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [("all", result["all"])] if "all" in result else []
    rows += [(f"tier {k}", v) for k, v in result["tiers"].items()]
    rows += [(f"tenant {k}", v) for k, v in result["tenants"].items()]
    for name, row in rows:
        statuses = ", ".join(f"{k}: {v}" for k, v in row["statuses"].items())
        lines.append(
            f"| {name} | {row['requests']} | {row['served']} | {_format(row['p50_ttft_s'])} | "
            f"{_format(row['p99_ttft_s'])} | {_format(row['p99_latency_s'])} | "
            f"{_format(row['slo_attainment'], '{:.3f}')} | "
            f"{_format(row.get('goodput_tokens_per_s'), '{:.0f}')} | {statuses} |"
        )
    processes = result.get("processes") or {}
    lines += _markdown(
        ("process", "CPU (share of a core)", "RSS start MiB", "RSS end MiB"),
        [
            (name, f"{r['cpu_share']:.2f}", f"{r['rss_start_mib']:.0f}", f"{r['rss_end_mib']:.0f}")
            for name, r in processes.items()
        ],
    )
    signals = result.get("signals") or {}
    answered = result.get("pools") or {}
    columns = ("pool", "routed", "served", "5xx", "KV mean", "KV max", "running mean")
    lines += _markdown(
        (*columns, "running max", "waiting max", "preemptions"),
        [
            (
                pool,
                _format(answered.get(pool, {}).get("requests"), "{:.0f}"),
                _format(answered.get(pool, {}).get("served"), "{:.0f}"),
                _format(answered.get(pool, {}).get("server_errors"), "{:.0f}"),
                f"{r['kv_usage_mean']:.2f}",
                f"{r['kv_usage_max']:.2f}",
                f"{r['running_mean']:.1f}",
                f"{r['running_max']:.0f}",
                f"{r['waiting_max']:.0f}",
                _format(r.get("preemptions"), "{:.0f}"),
            )
            for pool, r in (signals.get("pools") or {}).items()
        ],
    )
    if signals.get("breakers"):
        levels = ", ".join(
            f"{name} max L{row['max_level']:.0f} ({row['seconds_at_l1_or_above']:.1f} s at L1+)"
            for name, row in signals["breakers"].items()
        )
        lowest = ", ".join(f"{t} {v:.2f}" for t, v in signals["lowest_multipliers"].items())
        lines += ["", f"breakers: {levels}; lowest quota multipliers: {lowest}"]
    decision = (signals.get("decision") or {}).get("request_body") or {}
    if decision or result.get("burst_handling") is not None:
        lines += [
            "",
            f"burst handling {_format(result.get('burst_handling'), '{:.3f}')}; the sidecar's "
            f"body decision p50 <= {_format(decision.get('p50_ms'), '{:.1f}')} ms, p99 <= "
            f"{_format(decision.get('p99_ms'), '{:.1f}')} ms (its histogram's bucket bounds)",
        ]
    for window in result.get("faults", []):
        lines.append(
            f"fault: {window['fault']} (real {window['from_s']:.1f}-{window['to_s']:.1f} s)"
        )
    if result.get("after_drain"):
        left = ", ".join(f"{k} {v}" for k, v in result["after_drain"].items())
        lines += ["", f"after the drain: {left}"]
    return "\n".join(lines)


def unprotected_policy(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The same policy with slogate's admission off: routing only. The same Envoy and the
    same sidecar still route by context and refuse what no engine could take (a body over
    the limit, a context over the model's), but no key has a budget, the breaker has no
    reachable threshold, the controller and the waiting room are off, and no pool has a KV
    capacity to admit against: what the fleet does without protection."""
    policy = copy.deepcopy(dict(raw))
    policy["tiers"] = {tier.value: {} for tier in Tier}
    for key in policy.get("keys", []):
        key.pop("limits", None)
    breaker = policy.setdefault("breaker", {})
    breaker["controller_enabled"] = False
    thresholds = breaker.setdefault("thresholds", {})
    for name in UNREACHABLE:
        thresholds[name] = 1e9
    policy.setdefault("waiting_room", {})["enabled"] = False
    for pool in (policy.get("pools") or {}).values():
        pool.pop("kv_capacity_tokens", None)
        pool.pop("max_num_seqs", None)
    return policy


# Every level's condition (l1_p99_over_slo, ..., l3_gpu_memory): never reached at 1e9.
UNREACHABLE = tuple(
    f.name for f in dataclasses.fields(BreakerThresholds) if f.name[:3] in ("l1_", "l2_", "l3_")
)


# The workload policy for a stack whose default pool is a real vLLM (`--engine vllm`): a
# transformer's KV per token does not grow with the context, so every bucket weighs 1 (the
# field's weights would refuse anything past ~5.7k tokens of its 10,240-token cache), and the
# engine schedules by the priority slogate writes.
VLLM_POLICY: dict[str, Any] = {
    "buckets": [
        {"name": "0-4k", "max_tokens": 4096, "cost_weight": 1.0, "kv_weight": 1.0},
        {"name": "4-8k", "max_tokens": 8192, "cost_weight": 1.3, "kv_weight": 1.0},
        {"name": "8-32k", "max_tokens": 32768, "cost_weight": 1.8, "kv_weight": 1.0},
        {"name": "32k-128k", "max_tokens": 131072, "cost_weight": 2.5, "kv_weight": 1.0},
        {"name": "128k+", "cost_weight": 3.0, "kv_weight": 1.0},
    ],
    "pools": {
        "default": {"endpoints": ["127.0.0.1:18001"], "priority_scheduling": True},
        "long": {"endpoints": ["127.0.0.1:18002"]},
        "fallback": {"endpoints": ["127.0.0.1:18003"]},
    },
}


def run_live(
    workload: Workload,
    policy_raw: Mapping[str, Any],
    keys: Mapping[str, str],
    time_scale: float,
    faults: Sequence[Fault] = (),
    store: BudgetStoreKind | None = None,
    url: str | None = None,
    engine: str = "sim",
    admission: bool = True,
) -> dict[str, Any]:
    """One loadtest: against `url`, or a local stack started for it under `policy_raw`
    (stopped afterwards: after the drain, what it still holds is read first); `engine`
    "vllm": the stack's default pool is a real vLLM (tooling.vllm_engine); `admission`
    False: the unprotected run (see unprotected_policy)."""
    stack = None
    if url is None:
        work_dir = Path(tempfile.mkdtemp(prefix="slogate-loadtest-"))
        policy_path = work_dir / "workload-policy.yaml"
        policy_path.write_text(yaml.safe_dump(dict(policy_raw)))
        ports = StackPorts(0, 0, 0, 0, 0, {name: 0 for name in workload.policy.pools})
        stack = LocalStack(
            policy_path,
            work_dir,
            ports,
            time_scale,
            budget_store=store,
            engine=engine,
            # Unprotected: a real engine's capacity does not become KV admission either.
            admit_engine_capacity=admission,
        ).start()
        url = stack.url
        print(f"slogate loadtest: stack up at {url} (logs {work_dir})", flush=True)
    sampler = injector = None
    if stack is not None:
        running = stack
        # The load generator too: it shares the machine's cores with what it measures.
        sampler = ProcessSampler(
            lambda: {
                "loadgen": os.getpid(),
                **{p.name: p.pid for p in running.processes if p.pid is not None},
            }
        )
        injector = StackFaults(stack, faults, time_scale) if faults else None
    engines = (
        {p: [f"{url}/metrics" for url in stack.engine_urls(p)] for p in stack.pool_ports}
        if stack
        else {}
    )
    signals = SignalSampler(engines, stack.metrics_url if stack else None)
    left = None
    try:
        shots = asyncio.run(
            play(
                workload.arrivals,
                url,
                keys,
                time_scale,
                sampler=sampler,
                alongside=injector,
                watch=signals.run if stack else None,
            )
        )
        if stack is not None:
            left = asyncio.run(drained(stack.admin_address))
    finally:
        if stack is not None:
            stack.stop()
    windows = injector.windows if injector is not None else []
    mark_faults(shots, windows)
    return report(
        shots,
        workload.policy,
        time_scale,
        workload.name,
        processes=sampler.summary() if sampler is not None else None,
        after_drain=left,
        faults=windows,
        signals=signals.summary(),
        timeline=signals.timeline,
        duration_s=workload.duration_s,
        bursts=workload.bursts,
        burst_tenants=workload.burst_tenants,
    )


def compare_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """The same workload and seed through each mode, side by side."""
    modes = list(runs)
    first = runs[modes[0]]
    lines = [
        f"loadtest {first['workload']} at time scale {first['time_scale']}: "
        + " vs ".join(modes)
        + " (times in workload seconds)",
    ]
    metrics = (
        ("requests", "requests", "{:.0f}"),
        ("served", "served", "{:.0f}"),
        ("p99 TTFT s", "p99_ttft_s", "{:.2f}"),
        ("p99 latency s", "p99_latency_s", "{:.2f}"),
        ("SLO attainment (of all)", "slo_attainment_of_all", "{:.3f}"),
        ("goodput tok/s", "goodput_tokens_per_s", "{:.0f}"),
        ("5xx or no answer", "server_errors", "{:.0f}"),
    )
    rows = []
    for who in ("all", *(f"tier {t.value}" for t in Tier)):
        for label, key, pattern in metrics:
            cells = []
            for mode in modes:
                run = runs[mode]
                row = run["all"] if who == "all" else run["tiers"][who.split()[1]]
                value = row.get(key)
                if key == "server_errors":
                    value = sum(
                        n
                        for status, n in row["statuses"].items()
                        if status.split()[0] == "0" or int(status.split()[0]) >= 500
                    )
                cells.append(_format(value, pattern))
            rows.append((who, label, *cells))
    lines += _markdown(("who", "metric", *modes), rows)
    pool_rows = []
    for pool in sorted({p for run in runs.values() for p in run["signals"].get("pools", {})}):
        for label, key, pattern in (
            ("KV usage max", "kv_usage_max", "{:.2f}"),
            ("waiting max", "waiting_max", "{:.0f}"),
            ("preemptions", "preemptions", "{:.0f}"),
        ):
            cells = [
                _format(runs[m]["signals"].get("pools", {}).get(pool, {}).get(key), pattern)
                for m in modes
            ]
            pool_rows.append((pool, label, *cells))
    lines += _markdown(("pool", "metric", *modes), pool_rows)
    extra = []
    for mode in modes:
        run = runs[mode]
        decision = (run["signals"].get("decision") or {}).get("request_body", {})
        extra.append(
            f"{mode}: burst handling {_format(run.get('burst_handling'), '{:.3f}')}, "
            f"decision p99 <= {_format(decision.get('p99_ms'), '{:.1f}')} ms, "
            f"arrivals late by p99 {_format(run['lag_p99_s'], '{:.3f}')} s"
        )
    lines += ["", *extra]
    return "\n".join(lines)


# The live stack's simulated pools as `slogate up` starts them (sim.config.PoolConfig).
LIVE_POOL = PoolConfig()


def under(workload: Workload, policy_raw: Mapping[str, Any]) -> Workload:
    """The same arrivals under another policy (each key as that policy defines it)."""
    policy = parse_policy(dict(policy_raw))
    arrivals = []
    for arrival in workload.arrivals:
        key = policy.key_for(f"sk-{arrival.key.tenant}")
        assert key is not None, arrival.key.tenant
        arrivals.append(dataclasses.replace(arrival, key=key))
    return dataclasses.replace(workload, policy=policy, arrivals=arrivals)


def predict(workload: Workload, seed: int = 0) -> dict[str, Any]:
    """What the offline simulator says a live run of `workload` will measure: the same
    arrivals through the sidecar's own code (sim.offline) in front of engines shaped as the
    live stack's simulated pools (KV capacity, batch slots), on a virtual clock."""
    policy = workload.policy
    fleet = OfflineFleet(
        policy,
        seed=seed,
        controller=policy.breaker.controller_enabled,
        kv_capacity_tokens=LIVE_POOL.kv_capacity_tokens,
        max_running=LIVE_POOL.max_running_requests,
        max_queue=LIVE_POOL.max_queue,
        waiting_room=policy.waiting_room.enabled,
    )
    results = fleet.run(workload.arrivals, until_s=workload.duration_s + 60)
    summary = summarize(fleet, results, workload)
    refusals: dict[str, int] = {}
    for served in results.values():
        if served.outcome != "served":
            refusals[served.outcome] = refusals.get(served.outcome, 0) + 1
    return {
        "utilisation_by_pool": summary["utilisation_by_pool"],
        "goodput_tokens_per_s": summary["goodput_tokens_per_s"],
        "burst_handling": summary["burst_handling"],
        "tiers": {
            tier.value: {
                # Streams only, like with like: a JSON answer's first byte is its whole
                # answer live, while the simulator's ttft_s is its first token.
                "p99_stream_ttft_s": _quantile(
                    [
                        r.ttft_s
                        for r in results.values()
                        if r.arrival.key.tier is tier
                        and r.arrival.stream
                        and r.outcome == "served"
                        and r.ttft_s is not None
                    ],
                    0.99,
                ),
                "slo_attainment_of_all": summary["tiers"][tier.value]["slo_attainment"],
            }
            for tier in Tier
        },
        "refusals": dict(sorted(refusals.items())),
    }


def live_utilisation(
    timeline: Sequence[Mapping[str, Any]], max_running: int = LIVE_POOL.max_running_requests
) -> dict[str, float]:
    """Per pool, as the offline fleet measures it (OfflineFleet.utilisation): the fuller of
    the KV cache and the batch slots, averaged over the run, from the engines' scrapes."""
    pools: dict[str, list[float]] = {}
    for row in timeline:
        for pool, values in row["pools"].items():
            occupancy = max(
                values.get("kv_cache_usage_perc", 0.0),
                values.get("num_requests_running", 0.0) / max_running,
            )
            pools.setdefault(pool, []).append(occupancy)
    return {pool: sum(v) / len(v) for pool, v in sorted(pools.items()) if v}


def live_refusals(shots: Sequence[Shot]) -> dict[str, int]:
    """The live run's refusals by the offline fleet's kinds; an answer without slogate's
    reason came from the engine: a 503 is its full queue (`engine_full`), anything else
    its failure (`oom`), as the offline fleet names them."""
    counts: dict[str, int] = {}
    for shot in shots:
        if shot.status == 200:
            continue
        if shot.reason:
            kind = refusal_kind(shot.reason)
        else:
            kind = "engine_full" if shot.status == 503 else "oom"
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def prediction_errors(live: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, Any]:
    """Per metric: live, predicted, and the error (live / predicted - 1; None where the
    prediction is 0 or missing)."""

    def row(live_value: float | None, predicted_value: float | None) -> dict[str, Any]:
        error = None
        if live_value is not None and predicted_value:
            error = round(live_value / predicted_value - 1.0, 4)
        return {"live": live_value, "predicted": predicted_value, "error": error}

    errors: dict[str, Any] = {}
    used = live_utilisation(live.get("timeline") or [])
    for pool, predicted_use in predicted["utilisation_by_pool"].items():
        if predicted_use >= 0.01 or used.get(pool, 0.0) >= 0.01:  # idle pools say nothing
            errors[f"utilisation {pool}"] = row(used.get(pool), predicted_use)
    errors |= {
        "goodput_tokens_per_s": row(
            live["all"]["goodput_tokens_per_s"], predicted["goodput_tokens_per_s"]
        ),
        "burst_handling": row(live.get("burst_handling"), predicted["burst_handling"]),
    }
    shots = [Shot(**s) for s in live["shots"]]
    for tier, values in predicted["tiers"].items():
        streams = [
            s.ttft_s / live["time_scale"]
            for s in shots
            if s.tier == tier and s.stream and s.status == 200 and s.ttft_s is not None
        ]
        errors[f"{tier} p99_stream_ttft_s"] = row(
            _quantile(streams, 0.99), values["p99_stream_ttft_s"]
        )
        errors[f"{tier} slo_attainment_of_all"] = row(
            live["tiers"][tier]["slo_attainment_of_all"], values["slo_attainment_of_all"]
        )
    refused = live_refusals(shots)
    for kind in sorted(set(refused) | set(predicted["refusals"])):
        errors[f"refused {kind}"] = row(refused.get(kind, 0), predicted["refusals"].get(kind, 0))
    return errors


def prediction_table(errors: Mapping[str, Mapping[str, Any]]) -> str:
    return "\n".join(
        _markdown(
            ("metric", "live", "simulated", "error"),
            [
                (
                    name,
                    _format(r["live"], "{:.3f}"),
                    _format(r["predicted"], "{:.3f}"),
                    _format(None if r["error"] is None else 100 * r["error"], "{:+.1f}%"),
                )
                for name, r in errors.items()
            ],
        )
    )


def capacity(
    path: Path,
    base_policy: Mapping[str, Any],
    factors: Sequence[float],
    seed: int = 7,
    duration_s: float | None = None,
) -> list[dict[str, Any]]:
    """What the live stack can take of a workload: the offline fleet in the live pools'
    shape (`predict`) playing the workload at each multiple of its rates. No live run; at
    time scale 1 the simulator is within 10% of the live stack on utilisation and goodput
    (bench/results/loadtest-soak), which is what this is read for."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    rows = []
    for factor in factors:
        scaled = copy.deepcopy(raw)
        for tenant in scaled["tenants"]:
            for stream in tenant["streams"]:
                stream["rate_per_s"] = float(stream["rate_per_s"]) * factor
        workload = workload_from(scaled, dict(base_policy), seed, source=f"{path} x{factor:g}")
        if duration_s is not None:
            workload = workload.first(duration_s)
        predicted = predict(workload, seed)
        rows.append({"factor": factor, "requests": len(workload.arrivals), **predicted})
    return rows


def capacity_limit(rows: Sequence[Mapping[str, Any]], attainment: float = 0.99) -> float | None:
    """The highest multiple at which every tier's attainment (of all its requests, refusals
    counted as misses) is at least `attainment`, with every lower multiple meeting it too."""
    best = None
    for row in sorted(rows, key=lambda r: r["factor"]):
        tiers = row["tiers"].values()
        if any((t["slo_attainment_of_all"] or 0.0) < attainment for t in tiers):
            break
        best = row["factor"]
    return best


def capacity_table(rows: Sequence[Mapping[str, Any]]) -> str:
    tiers = [t.value for t in Tier]
    head = ["rates x", "requests", "utilisation (busiest pool)", "goodput tok/s"]
    head += [f"{t} attainment" for t in tiers] + [f"{t} P99 TTFT s (streams)" for t in tiers]
    lines = _markdown(
        (*head, "refused"),
        [
            (
                f"{r['factor']:g}",
                f"{r['requests']}",
                f"{max(r['utilisation_by_pool'].values(), default=0.0):.3f}",
                f"{r['goodput_tokens_per_s']:.0f}",
                *(f"{r['tiers'][t]['slo_attainment_of_all']:.3f}" for t in tiers),
                *(_format(r["tiers"][t]["p99_stream_ttft_s"]) for t in tiers),
                ", ".join(f"{k} {v}" for k, v in r["refusals"].items()) or "-",
            )
            for r in rows
        ],
    )
    return "\n".join(lines).strip()
