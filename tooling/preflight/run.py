"""`slogate preflight`: the field's checklists against a running deployment, one line per
check (pass / fail / cannot-check, with the value measured), exit 1 on a failure so it can
gate a rollout.

What lives here: the order of the checks and where each one's inputs come from (the
sidecar's admin API, the policy, a zones file, Prometheus). Measuring is
tooling.preflight.probes' and tooling.preflight.drills', judging tooling.preflight.checks'.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import grpc
import yaml

from extproc.adminpb import admin_pb2 as pb
from extproc.service import admin_client
from extproc.service.admin_auth import AdminTokenError
from policy.domain import Tier
from policy.loader import load_policy
from policy.schema import Policy
from tooling.preflight import checks, probes
from tooling.preflight.checks import CheckResult, Verdict
from tooling.render.alert_rules import SHIPPED_RULES
from tooling.stack.prometheus_api import PrometheusApi, PrometheusError


@dataclass
class PreflightOptions:
    url: str  # the gateway (Envoy's listener)
    prometheus: str
    admin: str
    token_file: Path | None = None  # the admin token the drills send (None: as found)
    policy_path: Path | None = None
    zones_path: Path | None = None
    rules_path: Path = SHIPPED_RULES
    probe_rounds: int = 10
    drills: bool = False
    drill_pool: str | None = None
    model: str | None = None
    keys: dict[Tier, str] = field(default_factory=dict)
    drill_streams: int = 4  # streamed requests held through the drill
    drill_stream_tokens: int = 1024  # each one's max_tokens: long enough to outlive it


def clear_keys(policy_path: Path) -> dict[Tier, str]:
    """The first key in clear per tier in a policy file (the demo's): what the drills send
    with when no --key names one. A production policy holds digests only."""
    raw = yaml.safe_load(policy_path.read_text(encoding="utf-8")) or {}
    keys: dict[Tier, str] = {}
    for entry in raw.get("keys") or []:
        if isinstance(entry, dict) and "key" in entry and "limits" not in entry:
            keys.setdefault(Tier(entry.get("tier", "standard")), str(entry["key"]))
    return keys


def _status(admin: str) -> pb.StatusReply:
    async def call() -> pb.StatusReply:
        channel, stub = admin_client.stub(admin)
        try:
            reply: pb.StatusReply = await stub.Status(pb.StatusRequest(), timeout=5)
            return reply
        finally:
            await channel.close()

    return asyncio.run(call())


def _prometheus_checks(
    api: PrometheusApi, o: PreflightOptions
) -> tuple[list[CheckResult], dict[str, float]]:
    """The scrape interval and alert rules checks, and the intervals found."""
    results, intervals = [], {}
    try:
        found = probes.slogate_scrape_intervals(api)
        results.append(checks.scrape_interval(found))
        intervals = {target: s for target, s in found.items() if s is not None}
    except PrometheusError as error:
        results.append(CheckResult("scrape_interval", "prometheus", Verdict.CANNOT, str(error)))
    try:
        shipped = probes.shipped_alert_names(o.rules_path)
        results.append(checks.alert_rules(shipped, probes.loaded_alert_names(api)))
    except PrometheusError as error:
        results.append(CheckResult("alert_rules", "prometheus", Verdict.CANNOT, str(error)))
    return results, intervals


def _zone_checks(
    endpoints: list[tuple[str, str]], policy: Policy | None, zones: Mapping[str, str], rounds: int
) -> list[CheckResult]:
    if not endpoints:
        return [
            CheckResult(
                "zone_latency", "-", Verdict.CANNOT, "no engines known", "--admin or --policy"
            )
        ]
    engines = probes.engines_with_zones(endpoints, policy, zones)
    latencies = probes.run_probes(engines, rounds)
    return [
        checks.zone_latency(pool, samples, unzoned)
        for pool, (samples, unzoned) in sorted(probes.by_zone(engines, latencies).items())
    ]


def _last_l3_checks(api: PrometheusApi, pools: set[str]) -> list[CheckResult]:
    try:
        history = probes.breaker_history(api, checks.L3_WINDOW_S)
    except PrometheusError as error:
        return [CheckResult("last_l3", "-", Verdict.CANNOT, str(error))]
    retention = probes.retention_s(api)
    return [
        checks.last_l3(
            pool, history.highest_level.get(pool), history.history_s.get(pool, 0.0), retention
        )
        for pool in sorted(pools | set(history.history_s))
    ]


def _drill_checks(
    o: PreflightOptions, policy: Policy | None, scrape_interval_s: float
) -> list[CheckResult]:
    from tooling.preflight.drills import DrillSettings, drill

    model = o.model or (policy.model_name if policy else None)
    missing = [t.value for t in (Tier.CRITICAL, Tier.STANDARD) if t not in o.keys]
    if model is None or missing:
        why = (
            "name the model: --model or --policy"
            if model is None
            else (f"no key for {', '.join(missing)}: --key TIER=KEY")
        )
        return [CheckResult("drill", o.drill_pool or "-", Verdict.CANNOT, "not run", why)]
    settings = DrillSettings(
        url=o.url.rstrip("/"),
        admin=o.admin,
        token_file=o.token_file,
        pool=o.drill_pool or (policy.default_pool if policy else "default"),
        fallback_pool=policy.fallback_pool if policy else "fallback",
        model=model,
        keys=o.keys,
        streams=o.drill_streams,
        stream_tokens=o.drill_stream_tokens,
        l3_hold_s=min(30.0, 1.5 * scrape_interval_s),
    )
    try:
        return asyncio.run(drill(settings))
    except AdminTokenError as error:
        why = f"the admin token: {error}"
        return [CheckResult("drill", settings.pool, Verdict.FAIL, "drill broke off", why)]
    except grpc.aio.AioRpcError as error:
        why = f"admin API {o.admin}: {error.code().name}: {error.details()}"
        return [CheckResult("drill", settings.pool, Verdict.FAIL, "drill broke off", why)]
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        why = f"gateway {o.url}: {error or type(error).__name__}"
        return [CheckResult("drill", settings.pool, Verdict.FAIL, "drill broke off", why)]


def run(o: PreflightOptions) -> list[CheckResult]:
    policy = load_policy(o.policy_path) if o.policy_path else None
    zones: dict[str, str] = {}
    if o.zones_path is not None:
        zones = probes.zones_from_document(yaml.safe_load(o.zones_path.read_text("utf-8")))
    api = PrometheusApi(o.prometheus)
    results, intervals = _prometheus_checks(api, o)
    # The engines as the sidecar sees them (a DNS name resolved to every engine); the
    # policy's when its admin API cannot be reached.
    try:
        endpoints = [(e.pool, e.endpoint) for e in _status(o.admin).engines]
    except grpc.aio.AioRpcError:
        endpoints = []
    if not endpoints and policy is not None:
        endpoints = [
            (pool.name, f"{host}:{port}")
            for pool in policy.pools.values()
            for host, port in pool.endpoints
        ]
    results += _zone_checks(endpoints, policy, zones, o.probe_rounds)
    # Before any drill of this run: the history as the deployment had it.
    pools = {pool for pool, _ in endpoints} or set(policy.pools if policy else ())
    results += _last_l3_checks(api, pools)
    if o.drills:
        results += _drill_checks(o, policy, max(intervals.values(), default=15.0))
    return results


def report(results: list[CheckResult], as_json: bool) -> str:
    if as_json:
        rows = [{**asdict(r), "verdict": r.verdict.value} for r in results]
        return json.dumps(rows, indent=2)
    return "\n".join(r.line() for r in results)
