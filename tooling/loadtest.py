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
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from breaker.objectives import latency_objective_s
from policy import Policy, Tier
from sim.arrivals import Arrival
from sim.prompts import library

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
    ttft_s: float | None = None  # first content event; a JSON answer: the whole answer
    latency_s: float | None = None
    completion_tokens: int | None = None


def messages(arrival: Arrival) -> list[dict[str, str]]:
    texts = library(arrival.crafted).messages(arrival.prompt_tokens)
    return [{"role": "user", "content": text} for text in texts]


async def fire(
    session: aiohttp.ClientSession, url: str, key: str, arrival: Arrival, shot: Shot
) -> None:
    body: dict[str, Any] = {
        "model": "deepseek-v4",
        "messages": messages(arrival),
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
            if reply.status != 200:
                try:
                    error = json.loads(await reply.read())["error"]
                    shot.error_json = bool(error.get("message"))
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
) -> list[Shot]:
    """Every arrival sent at its scaled time; returns when the last one is answered."""
    sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
    for arrival in arrivals:  # build the prompt texts before the clock starts
        library(arrival.crafted)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    shots: list[Shot] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic() + 0.2
        tasks = []
        for arrival in arrivals:
            shot = Shot(
                arrival.key.tenant,
                arrival.key.tier.value,
                arrival.at_s * time_scale,
                stream=arrival.stream,
                prompt_tokens=arrival.prompt_tokens,
                max_tokens=arrival.max_tokens,
            )
            shots.append(shot)
            delay = start + shot.scheduled_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            shot.lag_s = max(0.0, time.monotonic() - start - shot.scheduled_s)
            tasks.append(asyncio.create_task(fire(session, url, keys[shot.tenant], arrival, shot)))
        await asyncio.gather(*tasks)
    if sampling is not None:
        sampling.cancel()
        assert sampler is not None
        sampler.sample()
    return shots


class ProcessSampler:
    """CPU seconds and RSS of the stack's processes over the run, read from /proc (Linux):
    on a 2-core machine the generator, Envoy, the sidecar and the pools share the CPU, and
    a reader must be able to tell which one ran short."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.samples: list[tuple[float, dict[str, tuple[float, float]]]] = []

    @staticmethod
    def read(pid: int) -> tuple[float, float] | None:
        """(CPU seconds, RSS MiB) of one process; None once it is gone."""
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
                pages = int(statm.read().split()[1])
        except (OSError, IndexError, ValueError):
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
        return (int(fields[11]) + int(fields[12])) / ticks, pages * page_mib

    def sample(self) -> None:
        now = {name: self.read(pid) for name, pid in self.pids.items()}
        self.samples.append((time.monotonic(), {k: v for k, v in now.items() if v is not None}))

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval_s)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per process: CPU share of one core over the run, RSS at start and end (MiB) and
        its slope (MiB per minute)."""
        if len(self.samples) < 2:
            return {}
        (t0, first), (t1, last) = self.samples[0], self.samples[-1]
        wall = max(t1 - t0, 1e-9)
        out = {}
        for name in self.pids:
            if name in first and name in last:
                out[name] = {
                    "cpu_share": (last[name][0] - first[name][0]) / wall,
                    "rss_start_mib": first[name][1],
                    "rss_end_mib": last[name][1],
                    "rss_slope_mib_per_min": (last[name][1] - first[name][1]) / wall * 60,
                }
        return out


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


def _quantile(values: Sequence[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _within(policy: Policy, shot: Shot, time_scale: float) -> bool:
    bucket = policy.bucket_for(shot.prompt_tokens + shot.max_tokens).name
    objective = latency_objective_s(
        policy, Tier(shot.tier), bucket, shot.stream, shot.completion_tokens
    )
    if objective is None or shot.ttft_s is None:
        return objective is None
    return shot.ttft_s / time_scale <= objective


def _summary(shots: Sequence[Shot], policy: Policy, time_scale: float) -> dict[str, Any]:
    served = [s for s in shots if s.status == 200 and s.ttft_s is not None]
    statuses: dict[str, int] = {}
    for s in shots:
        name = str(s.status) + (f" {s.reason}" if s.reason else "")
        statuses[name] = statuses.get(name, 0) + 1

    def scaled(values: list[float], q: float) -> float | None:
        value = _quantile(values, q)
        return None if value is None else value / time_scale

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
        "slo_attainment": (
            sum(_within(policy, s, time_scale) for s in served) / len(served) if served else None
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
) -> dict[str, Any]:
    lags = [s.lag_s for s in shots]
    return {
        "processes": dict(processes or {}),
        "after_drain": dict(after_drain or {}),
        "workload": workload,
        "time_scale": time_scale,
        "tiers": {
            tier.value: _summary([s for s in shots if s.tier == tier.value], policy, time_scale)
            for tier in Tier
        },
        "tenants": {
            tenant: _summary([s for s in shots if s.tenant == tenant], policy, time_scale)
            for tenant in sorted({s.tenant for s in shots})
        },
        # Real seconds, unscaled: how late the generator sent.
        "lag_p99_s": _quantile(lags, 0.99),
        "lag_max_s": max(lags, default=None),
        "errors_without_json": sum(1 for s in shots if s.status != 200 and not s.error_json),
        "shots": [asdict(s) for s in shots],
    }


def _format(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"loadtest {result['workload']} at time scale {result['time_scale']} (times in "
        f"workload seconds); arrivals late by p99 {_format(result['lag_p99_s'], '{:.3f}')} s, "
        f"at most {_format(result['lag_max_s'], '{:.3f}')} s (real)",
        "",
        "| who | requests | served | p50 TTFT | p99 TTFT | p99 latency | SLO attainment "
        "| statuses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [(f"tier {k}", v) for k, v in result["tiers"].items()]
    rows += [(f"tenant {k}", v) for k, v in result["tenants"].items()]
    for name, row in rows:
        statuses = ", ".join(f"{k}: {v}" for k, v in row["statuses"].items())
        lines.append(
            f"| {name} | {row['requests']} | {row['served']} | {_format(row['p50_ttft_s'])} | "
            f"{_format(row['p99_ttft_s'])} | {_format(row['p99_latency_s'])} | "
            f"{_format(row['slo_attainment'], '{:.3f}')} | {statuses} |"
        )
    if result.get("processes"):
        lines += ["", "| process | CPU (share of a core) | RSS start MiB | RSS end MiB |"]
        lines.append("| --- | --- | --- | --- |")
        for name, row in result["processes"].items():
            lines.append(
                f"| {name} | {row['cpu_share']:.2f} | {row['rss_start_mib']:.0f} | "
                f"{row['rss_end_mib']:.0f} |"
            )
    if result.get("after_drain"):
        left = ", ".join(f"{k} {v}" for k, v in result["after_drain"].items())
        lines += ["", f"after the drain: {left}"]
    return "\n".join(lines)
