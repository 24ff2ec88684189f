"""Which tenants keep a metric label of their own (extproc.service.tenant_series), and the
real sidecar registry under ten thousand JWT tenants."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extproc.request.identity import caller_from_claims
from extproc.runtime.workers import merge_expositions
from extproc.service.candidate_metrics import CandidateMetrics
from extproc.service.metrics import SidecarMetrics
from extproc.service.tenant_series import OTHER, TABLE_FACTOR, TenantSeries, declared_tenants
from policy.loader import load_policy, parse_policy
from policy.schema import Policy
from tests.support.stack import EXAMPLE_POLICY, example_policy, write_policy


def send(series: TenantSeries, tenant: str, times: int = 1) -> str:
    label = OTHER
    for _ in range(times):
        label = series.label(tenant)
    return label


def test_room_first_and_nothing_folded_under_the_cap() -> None:
    series = TenantSeries(cap=5)
    assert [send(series, f"t{i}", 3) for i in range(5)] == ["t0", "t1", "t2", "t3", "t4"]
    assert series.rerank(5) == []
    assert series.kept == {"t0", "t1", "t2", "t3", "t4"}


def test_past_the_cap_newcomers_fold_into_other() -> None:
    series = TenantSeries(cap=100)
    labels = {series.label(f"sub-{i}") for i in range(10_000)}
    assert len(labels) == 101 and OTHER in labels
    assert len(series.kept) == 100


def test_the_busiest_win_the_places_at_the_re_rank() -> None:
    series = TenantSeries(cap=3)
    for quiet in ("q1", "q2", "q3"):
        send(series, quiet)  # first come, one request each
    assert send(series, "heavy", 10) == OTHER  # no room until the re-rank
    evicted = series.rerank(3)
    assert len(evicted) == 1 and evicted[0] in {"q1", "q2", "q3"}
    assert series.label("heavy") == "heavy"
    assert series.label(evicted[0]) == OTHER  # counts into other from now on


def test_an_incumbent_keeps_its_place_against_a_newcomer_not_twice_as_busy() -> None:
    series = TenantSeries(cap=1)
    send(series, "incumbent", 10)
    send(series, "newcomer", 15)
    assert series.rerank(1) == [] and series.kept == {"incumbent"}
    send(series, "incumbent", 10)  # counts now 5 + 10 against 7.5 + 25
    send(series, "newcomer", 25)
    assert series.rerank(1) == ["incumbent"] and series.kept == {"newcomer"}


def test_declared_tenants_keep_their_places_against_busier_ones() -> None:
    series = TenantSeries(cap=2)
    series.rerank(2, declared={"acme"})  # as at start: acme's place held in advance
    send(series, "jwt-a", 100)
    assert send(series, "jwt-b", 100) == OTHER
    assert series.label("acme") == "acme"
    assert series.rerank(2, declared={"acme"}) == []
    assert series.kept == {"acme", "jwt-a"}


def test_more_declared_tenants_than_the_cap_keep_the_busiest_of_them() -> None:
    series = TenantSeries(cap=2)
    send(series, "d1", 1)
    send(series, "d2", 5)
    send(series, "d3", 9)
    series.rerank(2, declared={"d1", "d2", "d3"})
    assert series.kept == {"d2", "d3"}


def test_old_traffic_fades_and_loses_to_traffic_now() -> None:
    series = TenantSeries(cap=1)
    send(series, "was-busy", 100)
    for _ in range(8):  # eight quiet intervals: 100 halves to under 1
        series.rerank(1)
        send(series, "busy-now", 5)
    assert series.kept == {"busy-now"}


def test_a_smaller_cap_evicts_at_once_and_place_counts_nothing() -> None:
    series = TenantSeries(cap=4)
    for tenant in ("a", "b", "c", "d"):
        send(series, tenant, 1 + ord(tenant) - ord("a"))
    assert series.rerank(2) == ["a", "b"]
    assert series.place("a") == OTHER and series.place("d") == "d"
    counted = series.counted
    assert series.place("new") == OTHER and series.counted == counted  # no room, no count
    series.rerank(3)
    counted = series.counted
    assert series.place("new") == "new" and series.counted == counted  # room: a place


def test_a_busy_tenant_amid_a_flood_of_one_off_subjects_is_counted() -> None:
    series = TenantSeries(cap=10)
    for i in range(1000):  # the table holds 40: the flood fills it many times over
        series.label(f"sub-{i}")
        if i >= 10 and i % 10 == 5:  # 10% of the traffic (over 1 / 40), once places are full
            series.label("busy")
    assert series.rerank(10) == ["sub-0"] and "busy" in series.kept


def test_a_flood_of_one_off_subjects_churns_no_places() -> None:
    series = TenantSeries(cap=10)
    for round_ in range(3):
        for i in range(1000):
            series.label(f"r{round_}-sub-{i}")
        assert series.rerank(10) == []  # the first ten keep theirs; the rest are other
    assert series.kept == {f"r0-sub-{i}" for i in range(10)}


def test_the_count_stays_bounded_under_a_flood_of_subjects() -> None:
    series = TenantSeries(cap=50)
    for round_ in range(5):
        for i in range(10_000):
            series.label(f"r{round_}-sub-{i}")
        assert series.counted <= TABLE_FACTOR * 50
        series.rerank(50)
        assert len(series.kept) <= 50


def test_a_re_rank_tells_the_metrics_whom_to_forget() -> None:
    series = TenantSeries(cap=1)
    forgotten: list[list[str]] = []
    series.on_evict.append(lambda tenants: forgotten.append(list(tenants)))
    send(series, "a")
    send(series, "b", 5)
    series.rerank(1)
    assert forgotten == [["a"]]


# --- the real registry ---------------------------------------------------------------


def tenant_values(metrics: SidecarMetrics) -> dict[str, set[str]]:
    """Tenant label values per tenant-labelled family, as Prometheus would scrape them."""
    text = generate_latest(metrics.registry).decode()
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue  # a counter's start time per series: counted with its family's
        for sample in family.samples:
            if "tenant" in sample.labels:
                values.setdefault(family.name, set()).add(sample.labels["tenant"])
    return values


def jwt_policy(cap: int, tmp_path: Path) -> Policy:
    """The example policy with JWT callers (tenant claim `org`) and the cap."""
    raw = example_policy()
    raw["jwt"] = {
        "issuer": "https://issuer.test",
        "audiences": ["slogate"],
        "jwks_file": str(tmp_path / "jwks.json"),
        "tenant_claim": "org",
    }
    raw["telemetry"] = {"tenant_series_max": cap}
    return load_policy(write_policy(tmp_path / "policy.yaml", raw))


def serve(
    policy: Policy, metrics: SidecarMetrics, candidate: CandidateMetrics, orgs: Iterable[str]
) -> None:
    """What the sidecar records of one request per org (budget, tokens, TTFT, shadow
    verdict), under the tenant label the request path gives a JWT caller."""
    for org in orgs:
        label = caller_from_claims(policy, {"org": org, "sub": f"user-of-{org}"}).tenant_label
        metrics.budget_decisions(label, "ok").inc()
        metrics.tenant_tokens(label).inc(100)
        metrics.tenant_ttft_seconds(label).observe(0.2)
        candidate.candidate_verdict(label, "same", "", "default", "default")


TENANT_FAMILIES = {
    "slogate_budget_decisions",
    "slogate_tenant_tokens",
    "slogate_tenant_ttft_seconds",
    "slogate_candidate_decisions",
}


def test_ten_thousand_jwt_tenants_make_at_most_cap_plus_one_label_values(
    tmp_path: Path,
) -> None:
    cap = 1000
    policy = jwt_policy(cap, tmp_path)
    metrics = SidecarMetrics()
    candidate = CandidateMetrics(metrics.registry, metrics.tenants)
    metrics.rerank_tenants(policy)  # as the sidecar does at start
    heavy = [f"org-heavy-{i}" for i in range(20)]
    for round_ in range(3):  # three re-rank intervals, 10,000 new subjects in each
        flood = [f"org-{round_}-{i}" for i in range(10_000)]
        # The 20 busy orgs send 5 requests each, spread through the flood.
        serve(policy, metrics, candidate, flood[:5000] + heavy * 5 + flood[5000:])
        for after_rerank in (False, True):
            per_family = tenant_values(metrics)
            assert per_family.keys() == TENANT_FAMILIES
            for family, values in per_family.items():
                assert len(values) <= cap + 1, (family, round_, after_rerank, len(values))
                assert OTHER in values
                # An evicted tenant's series are gone, not left behind beside "other".
                assert values - {OTHER} <= metrics.tenants.kept
            metrics.rerank_tenants(policy)
    # The busy orgs won places at the first re-rank, from first-come one-off orgs of the
    # first flood; the later floods' one-offs took none; the policy's tenants held theirs
    # in advance.
    serve(policy, metrics, candidate, [*heavy, "demo-batch"])
    for values in tenant_values(metrics).values():
        assert set(heavy) | {"demo-batch", OTHER} <= values
        assert not any(v.startswith(("org-1-", "org-2-")) for v in values)
    assert declared_tenants(policy) <= metrics.tenants.kept


def test_workers_merged_metrics_hold_at_most_workers_times_cap_plus_one(tmp_path: Path) -> None:
    cap, workers = 100, 3
    policy = jwt_policy(cap, tmp_path)
    each = [SidecarMetrics() for _ in range(workers)]
    for index, metrics in enumerate(each):
        metrics.rerank_tenants(policy)
        # The worst case: each worker's first-come places go to different one-off orgs.
        orgs = [f"org-{index}-{i}" for i in range(2_000)]
        serve(policy, metrics, CandidateMetrics(metrics.registry, metrics.tenants), orgs)
    merged = merge_expositions(generate_latest(m.registry).decode() for m in each)
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(merged):
        for sample in family.samples:
            if "tenant" in sample.labels:
                values.setdefault(family.name, set()).add(sample.labels["tenant"])
    assert values.keys() >= {"slogate_budget_decisions", "slogate_tenant_ttft_seconds"}
    for family, seen in values.items():
        assert len(seen) <= workers * cap + 1, (family, len(seen))
        assert len(seen) > cap + 1  # the bound is the workers' union, not one cap


def test_the_example_policy_documents_the_cap_and_its_example_loads() -> None:
    text = EXAMPLE_POLICY.read_text()
    block = text[text.index("# telemetry:") :].split("\n\n")[0]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    raw = example_policy()
    raw["telemetry"] = yaml.safe_load(uncommented)["telemetry"]
    assert raw["telemetry"]["tenant_series_max"] == 1000
    assert parse_policy(raw).telemetry.tenant_series_max == 1000
