"""`slogate preflight`'s measurements against a running deployment (the verdicts are
tooling.preflight.checks'): what Prometheus scrapes and has loaded, the breaker's
history, the engines and their zones, and each engine's latency on the same small probe.

Nothing here changes the deployment: the drills are tooling.preflight.drills'.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from policy.schema import Policy
from tooling.render.alert_rules import SHIPPED_RULES, duration_s
from tooling.stack.prometheus_api import PrometheusApi, PrometheusError

ZONE_LABEL = "topology.kubernetes.io/zone"
SLOGATE_SERIES = "slogate_breaker_level"  # every sidecar exports it, one per pool and global


def slogate_scrape_intervals(api: PrometheusApi) -> dict[str, float | None]:
    """Each target whose series include slogate's ("job/instance") -> its scrape interval
    in seconds (None: Prometheus before 2.29 does not say). Found by what they export, not
    by a job name the operator chose."""
    exporting = {
        (s.labels.get("job", ""), s.labels.get("instance", ""))
        for s in api.query(f"count by (job, instance) ({SLOGATE_SERIES})")
    }
    intervals: dict[str, float | None] = {}
    for target in api.targets():
        labels = target.get("labels", {})
        key = (labels.get("job", ""), labels.get("instance", ""))
        if key in exporting:
            interval = target.get("scrapeInterval")
            intervals[f"{key[0]}/{key[1]}"] = duration_s(interval) if interval else None
    return intervals


def shipped_alert_names(rules_file: Path = SHIPPED_RULES) -> list[str]:
    """The alert names of the shipped rules file, read now (a rule added there is checked
    without a change here)."""
    document = yaml.safe_load(rules_file.read_text(encoding="utf-8")) or {}
    return [
        rule["alert"]
        for group in document.get("groups", [])
        for rule in group.get("rules", [])
        if "alert" in rule
    ]


def loaded_alert_names(api: PrometheusApi) -> list[str]:
    return [rule["name"] for rule in api.alerting_rules()]


@dataclass(frozen=True)
class BreakerHistory:
    highest_level: dict[str, float]  # pool -> highest level (or drill level) in the window
    history_s: dict[str, float]  # pool -> how far back its series go, within the window


def breaker_history(api: PrometheusApi, window_s: float) -> BreakerHistory:
    """Per pool (the global breaker left out: the monthly test is a pool's), the highest
    level and drill level over the window, and how far back the pool's series reach: the
    earliest minute of the window at which it had a sample (a subquery at 1-minute steps;
    `timestamp()` at each step is the latest sample's time, so a series younger than a
    minute reads as none)."""
    window = f"{window_s:.0f}s"
    highest: dict[str, float] = {}
    for series in (SLOGATE_SERIES, "slogate_breaker_drill_level"):
        for sample in api.query(f"max by (pool) (max_over_time({series}[{window}]))"):
            pool = sample.labels.get("pool", "")
            highest[pool] = max(highest.get(pool, 0.0), sample.value)
    now_s = time.time()
    oldest = api.query(
        f"min by (pool) (min_over_time(timestamp({SLOGATE_SERIES})[{window}:1m]))", now_s
    )
    history = {s.labels.get("pool", ""): max(0.0, now_s - s.value) for s in oldest}
    pools = (set(highest) | set(history)) - {"global", ""}
    return BreakerHistory(
        {p: highest[p] for p in pools if p in highest}, {p: history.get(p, 0.0) for p in pools}
    )


def retention_s(api: PrometheusApi) -> float | None:
    """How long Prometheus keeps its data (its runtime info's "15d", or "31d or 10GB"), or
    None when it says only a size or cannot say."""
    try:
        retention = str(api.runtime_info().get("storageRetention", ""))
    except PrometheusError:
        return None
    try:
        return duration_s(retention.split(" or ")[0].strip())
    except ValueError:
        return None


def zones_from_document(document: Any) -> dict[str, str]:
    """An engine -> zone map from a file: either a plain mapping ("host:port" or "host" ->
    zone), or Kubernetes' `kubectl get pods,nodes -o json` (a List): each pod's IP gets its
    node's `topology.kubernetes.io/zone` label. The label lives on nodes; without a
    cluster to ask, this file is how it reaches preflight."""
    if isinstance(document, dict) and document.get("kind") == "List":
        items = document.get("items", [])
        node_zone = {
            item["metadata"]["name"]: item["metadata"].get("labels", {}).get(ZONE_LABEL, "")
            for item in items
            if item.get("kind") == "Node"
        }
        zones = {}
        for item in items:
            if item.get("kind") != "Pod":
                continue
            ip = item.get("status", {}).get("podIP", "")
            zone = node_zone.get(item.get("spec", {}).get("nodeName", ""), "")
            if ip and zone:
                zones[ip] = zone
        return zones
    if isinstance(document, dict):
        return {str(k): str(v) for k, v in document.items() if v}
    raise ValueError("a zones file is a mapping of engine -> zone, or kubectl's List")


@dataclass(frozen=True)
class Engine:
    pool: str
    endpoint: str  # host:port
    zone: str | None


def engines_with_zones(
    endpoints: Sequence[tuple[str, str]], policy: Policy | None, zones: Mapping[str, str]
) -> list[Engine]:
    """(pool, "host:port") pairs with their zone: the zones file's (by "host:port", then by
    host) over the policy's."""
    engines = []
    for pool, endpoint in endpoints:
        zone = zones.get(endpoint) or zones.get(endpoint.rsplit(":", 1)[0])
        if zone is None and policy is not None and pool in policy.pools:
            zone = policy.pools[pool].zone_of(endpoint)
        engines.append(Engine(pool, endpoint, zone))
    return engines


async def _probe_once(session: aiohttp.ClientSession, endpoint: str, model: str | None) -> float:
    """One probe's milliseconds: a chat completion of one token (the same request to every
    engine), or the engine's /health when it names no model."""
    started = time.perf_counter()
    if model is None:
        async with session.get(f"http://{endpoint}/health") as reply:
            await reply.read()
            reply.raise_for_status()
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        async with session.post(f"http://{endpoint}/v1/chat/completions", json=body) as reply:
            await reply.read()
            reply.raise_for_status()
    return (time.perf_counter() - started) * 1000


async def _model_of(session: aiohttp.ClientSession, endpoint: str) -> str | None:
    try:
        async with session.get(f"http://{endpoint}/v1/models") as reply:
            models = (await reply.json()).get("data", []) if reply.status == 200 else []
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return str(models[0]["id"]) if models else None


async def probe_engines(
    engines: Sequence[Engine], rounds: int, timeout_s: float = 10.0
) -> dict[str, list[float]]:
    """Each engine's probe latencies in ms, `rounds` each. One probe at a time, the engines
    taken in turn each round, so a change of load over the run falls on all of them alike
    and no probe waits behind another. A probe that failed counts no sample."""
    latencies: dict[str, list[float]] = {e.endpoint: [] for e in engines}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        models = {e.endpoint: await _model_of(session, e.endpoint) for e in engines}
        for round_ in range(rounds):
            # Every other round in reverse: no engine is always the one probed first.
            for engine in engines if round_ % 2 == 0 else engines[::-1]:
                try:
                    latency = await _probe_once(session, engine.endpoint, models[engine.endpoint])
                except (aiohttp.ClientError, TimeoutError):
                    continue
                latencies[engine.endpoint].append(latency)
    return latencies


def by_zone(
    engines: Sequence[Engine], latencies: Mapping[str, Sequence[float]]
) -> dict[str, tuple[dict[str, list[float]], int]]:
    """Pool -> (zone -> its engines' samples together, engines without a zone)."""
    pools: dict[str, tuple[dict[str, list[float]], int]] = {}
    for engine in engines:
        zones, unzoned = pools.get(engine.pool, ({}, 0))
        if engine.zone is None:
            unzoned += 1
        else:
            zones.setdefault(engine.zone, []).extend(latencies.get(engine.endpoint, []))
        pools[engine.pool] = (zones, unzoned)
    return pools


def run_probes(engines: Sequence[Engine], rounds: int) -> dict[str, list[float]]:
    return asyncio.run(probe_engines(engines, rounds))
