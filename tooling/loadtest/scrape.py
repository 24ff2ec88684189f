"""`slogate loadtest`'s view of the stack over a run: its processes' CPU and RSS, the
engines' and the sidecar's scraped signals (the timeline), and what it holds after the drain."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from tooling.loadtest.cpu_share import cpu_shares
from tooling.stack.processes import MachineReading, process_table, read_machine, tree_usage


class ProcessSampler:
    """CPU seconds and RSS of the stack's processes over the run, read from /proc (Linux):
    on a 2-core machine the generator, Envoy, the sidecar and the pools share the CPU, and
    a reader must be able to tell which one ran short."""

    def __init__(self, pids: Callable[[], Mapping[str, int]]) -> None:
        self.pids = pids  # asked at every sample: a restarted process is a new name
        self.samples: list[tuple[float, dict[str, tuple[float, float]]]] = []
        self.machine: list[MachineReading] = []  # the whole machine, at each sample

    def sample(self) -> None:
        table = process_table()
        roots = self.pids()
        others = set(roots.values())
        now = {name: tree_usage(pid, table, others) for name, pid in roots.items()}
        self.samples.append((time.monotonic(), {k: v for k, v in now.items() if v is not None}))
        machine = read_machine()
        if machine is not None:
            self.machine.append(machine)

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

    def cpu(self) -> dict[str, Any] | None:
        """The CPU share per process over the whole run (tooling.loadtest.cpu_share): each
        process tree's, everyone else's on the machine, and idle; None before two samples."""
        if len(self.samples) < 2:
            return None
        first_at, last_at = self.samples[0][0], self.samples[-1][0]
        spans: dict[str, tuple[float, float]] = {}
        for _, values in self.samples:
            for name, (cpu_s, _) in values.items():
                spans[name] = (spans.get(name, (cpu_s, cpu_s))[0], cpu_s)
        machine = (self.machine[0], self.machine[-1]) if len(self.machine) >= 2 else None
        return cpu_shares(
            spans,
            machine,
            last_at - first_at,
            os.cpu_count() or 1,
            [m.load1 for m in self.machine],
        )


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
                elif sample.name == "slogate_quota_ahead_moves_total":
                    row.setdefault("ahead_moves", {})[sample.labels["reason"]] = sample.value
                elif sample.name == "slogate_quota_ahead_raised_tenants":
                    row["ahead_raised"] = sample.value
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
        # The planner's moves (budget.ahead) by reason: cumulative, the last scrape's; and
        # the seconds (real) a raise held.
        moves: dict[str, float] = next(
            (r["ahead_moves"] for r in reversed(self.timeline) if "ahead_moves" in r), {}
        )
        raised_s = sum(step for r in self.timeline if r.get("ahead_raised", 0.0) > 0)
        decision = {
            phase: {f"p{round(q * 100)}_ms": _bucket_quantile(buckets, q) for q in (0.5, 0.99)}
            for phase, buckets in sorted(self.decisions.items())
        }
        return {
            "pools": pools,
            "breakers": breakers,
            "ahead_moves": {reason: n for reason, n in sorted(moves.items()) if n},
            "ahead_raised_s": raised_s,
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
    from extproc.service import admin_client

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
