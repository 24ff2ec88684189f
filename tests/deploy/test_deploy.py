"""Deployment artefacts against the code: the metrics the alert rules, the docs' catalogue and
the dashboard name are the ones the sidecar exports.

promtool on the rules, the Kubernetes manifests with the real Envoy, and the sidecar's gRPC
health: tests/e2e/deploy/test_deploy.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

from engines.picker import EnginePicker
from engines.state import EngineFleet
from extproc.runtime.key_store import KeyStore
from extproc.runtime.kv_subscriber import KvEventsCollector, KvSubscriber
from extproc.runtime.loop_lag import LoopLag, LoopLagCollector
from extproc.runtime.spend_metrics import SpendMetrics
from extproc.service.candidate_metrics import CandidateMetrics
from extproc.service.decision_log import DECISION_FILES
from extproc.service.engine_metrics import EngineCollector
from extproc.service.forecast_metrics import ForecastMetrics
from extproc.service.metrics import SidecarMetrics
from extproc.service.record_files import dropped_counter
from extproc.service.region_metrics import RegionMetrics
from extproc.service.traffic_record import TRAFFIC_FILES
from policy._keystore import KeyStoreConfig
from policy.loader import parse_policy

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "slogate-rules.yaml"


def exported_metrics() -> set[str]:
    """Every metric name the sidecar exports, as written in PromQL and the catalogue."""
    names = set()
    policy = parse_policy({})
    fleet = EngineFleet(lambda: policy.engines.health, time.monotonic)
    picker = EnginePicker(fleet, lambda: policy, time.monotonic)
    engines = EngineCollector(picker, lambda: policy)
    kv_events = KvEventsCollector(KvSubscriber(picker, lambda: policy), picker)  # registered too
    metrics = SidecarMetrics()
    KeyStore(KeyStoreConfig(file="keys.yaml"), None, metrics.registry)  # its own series
    SpendMetrics(metrics.registry)  # the spend step's
    RegionMetrics(metrics.registry, metrics.tenants)  # the region agent's (with regions:)
    CandidateMetrics(metrics.registry)  # the candidate policy's (shadow mode)
    ForecastMetrics(metrics)  # the forecasts' refits (when they are on)
    dropped_counter(metrics.registry, TRAFFIC_FILES)  # the traffic record's (when it is on)
    dropped_counter(metrics.registry, DECISION_FILES)  # the decision log's (when it is on)
    lag = LoopLagCollector(LoopLag(time.monotonic), time.monotonic)  # the sidecar registers it
    collectors = (metrics.registry, engines, kv_events, lag)
    for family in [f for c in collectors for f in c.collect()]:
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    # prometheus_client's own process_* families are its documentation's, not the catalogue's.
    return {name for name in names if name.startswith("slogate_")}


def _base(name: str) -> str:
    return re.sub(r"_(sum|count|bucket)$", "", name)


def test_alert_rules_only_use_exported_metrics() -> None:
    used = {_base(n) for n in re.findall(r"\bslogate_[a-z0-9_]+", RULES.read_text())}
    assert used and used <= exported_metrics(), used - exported_metrics()


def test_docs_catalogue_lists_exactly_the_exported_metrics() -> None:
    from tests.support.docs import all_docs

    catalogue = set(re.findall(r"^\| `(slogate_[a-z0-9_]+)` \|", all_docs(), flags=re.M))
    assert catalogue == exported_metrics(), (
        f"missing from the docs' catalogue (docs/sre/metrics.md): "
        f"{exported_metrics() - catalogue}; "
        f"not exported: {catalogue - exported_metrics()}"
    )


def test_dashboard_queries_only_use_exported_metrics() -> None:
    import json

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "slogate-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs and all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
    used = {_base(n) for e in exprs for n in re.findall(r"\bslogate_[a-z0-9_]+", e)}
    assert used <= exported_metrics(), used - exported_metrics()
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for topic in (
        "TTFT heatmap per tenant",
        "Context length",
        "by tenant",
        "Breaker level",
        "Redis",
        "Quota multipliers",
        "Safety factor",
        "KV-cache hit rate against KV memory",
        "Waiting room",
    ):
        assert topic in titles
