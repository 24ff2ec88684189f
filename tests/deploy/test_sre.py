"""What an SRE sees: the runbook behind every alert, a description on every panel, and the
series the dashboard and the rules read existing at 0 on a quiet stack (no traffic yet)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from extproc.runtime.sidecar import Sidecar
from tests.support.stack import example_policy, write_policy

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "slogate-rules.yaml"
RUNBOOK = PROMETHEUS / "RUNBOOK.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "slogate-dashboard.json"
RUNBOOK_URL = "https://github.com/slogate/slogate/blob/main/deploy/prometheus/RUNBOOK.md#"

# Families whose series come with traffic, so a stack that served nothing has none; every
# other family a dashboard query or a rule reads must be there before the first request.
NEED_TRAFFIC = {
    "slogate_tenant_ttft_seconds",  # per tenant: capped and created by their own module
    "slogate_tenant_tokens_total",
    "slogate_budget_decisions_total",
    "slogate_tenant_demand_tokens_per_minute",
    "slogate_upstream_ttft_seconds",  # pool x bucket x tier x 21 buckets: too many to pre-make
    "slogate_upstream_duration_seconds",
    "slogate_request_context_tokens",
    "slogate_decision_seconds",
    "slogate_decisions_total",
    "slogate_load_score",  # no score until the breaker's window has min_samples
    "slogate_engine_prefix_cache_hits_total",  # only from an engine scraped fresh
    "slogate_engine_prefix_cache_queries_total",
    "slogate_redis_up",  # only with budget.store: redis (the example runs without)
    "slogate_budget_store_decisions_total",
    "slogate_region_ledger_state",  # only with regions: (the example is one region)
}


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")


def _alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _panels() -> list[dict[str, object]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def test_every_alert_links_its_runbook_entry() -> None:
    anchors = {_anchor(h) for h in re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)}
    alerts = _alerts()
    assert len(alerts) >= 10
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]  # type: ignore[index]
        assert url == RUNBOOK_URL + str(rule["alert"]).lower(), url
        assert url.removeprefix(RUNBOOK_URL) in anchors, f"no runbook entry for {rule['alert']}"
    entries = re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)
    assert sorted(entries) == sorted(str(r["alert"]) for r in alerts), "entries without alerts"


def test_every_panel_says_what_it_shows_and_the_runbook_names_real_panels() -> None:
    panels = _panels()
    for panel in panels:
        description = str(panel.get("description", ""))
        assert len(description) > 80, f"panel {panel['title']!r} has no description"
    titles = [str(p["title"]) for p in panels]
    named = set(re.findall(r"(?<![*\w])\*(\S[^*\n]*?)\*(?![*\w])", RUNBOOK.read_text()))
    assert named
    for name in named:
        assert any(t.startswith(name) for t in titles), f"the runbook names no panel {name!r}"


def _dashboard_and_rule_selectors() -> list[tuple[str, dict[str, str]]]:
    """(family, label matchers) of every slogate_ selector in the panels and the rules; a
    template variable matches anything."""
    exprs = [str(t["expr"]) for p in _panels() for t in p["targets"]]  # type: ignore[attr-defined]
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs += [str(rule["expr"]) for group in groups for rule in group["rules"]]
    selectors = []
    for expr in exprs:
        for name, body in re.findall(r"\b(slogate_[a-z0-9_]+)(?:\{([^}]*)\})?", expr):
            matchers = dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', body or ""))
            selectors.append((name, {k: ".*" if "$" in v else v for k, v in matchers.items()}))
    return selectors


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for family in registry.collect() for s in family.samples]


def _family(name: str) -> str:
    return re.sub(r"_(sum|count|bucket)$", "", name)


def _build(tmp_path: Path, policy: dict[str, object]) -> Sidecar:
    path = tmp_path / "policy.yaml"
    write_policy(path, policy)
    return Sidecar(path, grpc_port=0, metrics_port=None, admin_address=None)


async def test_every_query_finds_series_before_the_first_request(tmp_path: Path) -> None:
    """The example policy's sidecar, built and never sent a request: each selector of the
    dashboard and the rules matches a series, but for the families that need traffic."""
    sidecar = _build(tmp_path, example_policy())
    samples = _samples(sidecar.metrics.registry)
    empty = []
    for name, matchers in _dashboard_and_rule_selectors():
        if _family(name) in NEED_TRAFFIC:
            continue
        found = any(
            sample == name and all(re.fullmatch(v, labels.get(k, "")) for k, v in matchers.items())
            for sample, labels in samples
        )
        if not found:
            empty.append((name, matchers))
    assert not empty, f"no series yet for {empty}"


async def test_the_policy_s_pools_tiers_and_reasons_start_at_zero(tmp_path: Path) -> None:
    sidecar = _build(tmp_path, example_policy())
    samples = {
        (n, tuple(sorted(labels.items()))) for n, labels in _samples(sidecar.metrics.registry)
    }

    def has(name: str, **labels: str) -> bool:
        return (name, tuple(sorted(labels.items()))) in samples

    pools = ("default", "long", "fallback")
    tiers = ("critical", "standard", "sheddable")
    for reason in ("kv_cache_full", "sequences_full", "queue_full", "queue_timeout"):
        assert has("slogate_rejections_total", reason=reason, status="503")
    for tier in tiers:
        assert has("slogate_wait_seconds_bucket", tier=tier, le="+Inf")
        for outcome in ("dispatched", "timed_out", "full", "cancelled"):
            assert has("slogate_wait_outcomes_total", tier=tier, outcome=outcome)
        for reason in ("long_context_shed", "tier_shed", "context_capped", "fallback"):
            assert has("slogate_shed_total", tier=tier, reason=reason)
        for pool in pools:
            assert has("slogate_waiting_requests", pool=pool, tier=tier)
    for pool in pools:
        assert has("slogate_kv_in_flight_tokens", pool=pool)
        assert has("slogate_sequences_in_flight", pool=pool)
        assert has("slogate_responses_total", pool=pool, code_class="5xx")
    # No Redis in the example: no Redis gauge reading 0 ("degraded", which paged).
    assert not any(name == "slogate_redis_up" for name, _ in samples)


async def test_a_reloaded_policy_s_new_pool_gets_its_series(tmp_path: Path) -> None:
    policy = example_policy()
    sidecar = _build(tmp_path, policy)
    policy["pools"]["extra"] = {"endpoints": ["127.0.0.1:18009"], "max_num_seqs": 8}  # type: ignore[index]
    write_policy(sidecar.policy.path, policy)
    assert await sidecar.policy.reload()
    samples = _samples(sidecar.metrics.registry)
    for name in (
        "slogate_waiting_requests",
        "slogate_responses_total",
        "slogate_sequences_in_flight",
    ):
        assert any(n == name and labels.get("pool") == "extra" for n, labels in samples), name


async def test_a_shared_store_s_health_and_decisions_start_known(tmp_path: Path) -> None:
    """With Redis (not reached while the sidecar is only built), its health reads up and
    its decisions exist at 0 per store."""
    policy = example_policy()
    policy["budget"] = {**policy["budget"], "store": "redis"}  # type: ignore[dict-item]
    samples = _samples(_build(tmp_path, policy).metrics.registry)
    assert ("slogate_redis_up", {}) in samples
    for store in ("shared", "local"):
        assert ("slogate_budget_store_decisions_total", {"store": store}) in samples


def test_the_commands_the_runbook_and_the_rules_give_exist_with_their_flags() -> None:
    """An SRE pastes these while paged: each `slogate X --flag` must be a command with
    that flag (asked of the real CLI's --help)."""
    import subprocess
    import sys

    quoted = re.findall(r"`(slogate [^`]+)`", RUNBOOK.read_text())
    quoted += re.findall(r"slogate [a-z-]+ --[^.\"]*", RULES.read_text())  # annotations
    commands = {" ".join(c.split()) for c in quoted}
    assert any("drill" in c for c in commands) and any("drain" in c for c in commands)
    for command in sorted(commands):
        name, *rest = command.split()[1:]
        shown = subprocess.run(
            [sys.executable, "-m", "tooling.cli.main", name, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, f"{command}: {shown.stderr}"
        for flag in (w for w in rest if w.startswith("--")):
            assert flag in shown.stdout, f"{command}: {flag} is not a flag of slogate {name}"


def test_workers_merged_a_no_data_gauge_yields_to_a_value() -> None:
    """`serve --workers N`: a worker that has not stepped yet reports NaN; the merged
    /metrics shows the other worker's value whichever answered first."""
    from prometheus_client.parser import text_string_to_metric_families

    from extproc.runtime.workers import merge_expositions

    nan = "# TYPE slogate_safety_factor gauge\nslogate_safety_factor NaN\n"
    stepped = "# TYPE slogate_safety_factor gauge\nslogate_safety_factor 1.3\n"
    for texts in ([nan, stepped], [stepped, nan]):
        merged = text_string_to_metric_families(merge_expositions(texts))
        assert [s.value for f in merged for s in f.samples] == [1.3]


def test_the_recorded_series_panels_read_are_recorded_by_the_rules() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    exprs = " ".join(str(t["expr"]) for p in _panels() for t in p["targets"])  # type: ignore[attr-defined]
    read = set(re.findall(r"\bslogate:[a-z0-9_:]+", exprs))
    assert read, "the KV correlation panel reads the recording rules"
    assert read <= recorded, read - recorded
