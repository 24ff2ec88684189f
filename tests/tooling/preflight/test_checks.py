"""`slogate preflight`'s verdicts from measured values, its zones and keys, and the policy's
per-engine zones. No process: the live runs are tests/e2e/test_preflight.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from policy._reader import PolicyError
from policy.domain import Tier
from policy.loader import load_policy
from tests.support.stack import EXAMPLE_POLICY, example_policy, write_policy
from tooling.preflight import checks
from tooling.preflight.checks import CheckResult, HeldStream, PresetProbe, Verdict
from tooling.preflight.drills import PRESET_PROBES, expected_action
from tooling.preflight.probes import (
    Engine,
    by_zone,
    engines_with_zones,
    shipped_alert_names,
    zones_from_document,
)
from tooling.preflight.run import clear_keys
from tooling.render.alert_rules import duration_s

DAY_S = 86400.0


# --- scrape interval


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15.0), ("1m", 60.0), ("1m30s", 90.0), ("500ms", 0.5)]
)
def test_prometheus_durations_are_read_in_seconds(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["15", "s", "1x"])
def test_a_malformed_duration_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        duration_s(text)


def test_scrape_interval_passes_at_15_s_and_fails_above_naming_the_target() -> None:
    assert checks.scrape_interval({"slogate/a:9464": 15.0}).verdict is Verdict.PASS
    result = checks.scrape_interval({"slogate/a:9464": 10.0, "slogate/b:9464": 30.0})
    assert result.verdict is Verdict.FAIL
    assert "slogate/b:9464 over 15 s" in result.detail
    assert "slogate/b:9464 30 s" in result.measured


def test_a_target_whose_interval_prometheus_does_not_report_cannot_be_checked() -> None:
    result = checks.scrape_interval({"slogate/a:9464": 5.0, "slogate/b:9464": None})
    assert result.verdict is Verdict.CANNOT
    assert result.measured == "no interval for slogate/b:9464"


def test_no_target_exporting_slogate_is_a_failure_not_a_pass() -> None:
    result = checks.scrape_interval({})
    assert result.verdict is Verdict.FAIL
    assert "no target" in result.measured


# --- zones' latency


def test_zone_medians_within_15_percent_pass_and_an_outlier_does_not_move_a_median() -> None:
    samples = {"zone-a": [100.0, 100.0, 100.0, 900.0, 100.0], "zone-b": [115.0, 114.0, 116.0]}
    result = checks.zone_latency("default", samples)
    assert result.verdict is Verdict.PASS
    assert result.measured == "zone-a 100.0 ms, zone-b 115.0 ms; spread 15.0%"


def test_zone_medians_more_than_15_percent_apart_fail() -> None:
    result = checks.zone_latency("default", {"zone-a": [100.0] * 3, "zone-b": [115.5] * 3})
    assert result.verdict is Verdict.FAIL
    assert "spread 15.5%" in result.measured
    assert checks.zone_spread({"a": 100.0, "b": 130.0, "c": 110.0}) == pytest.approx(0.30)


def test_one_zone_or_a_silent_zone_cannot_be_checked() -> None:
    one = checks.zone_latency("long", {"zone-a": [100.0]}, unzoned=1)
    assert one.verdict is Verdict.CANNOT
    assert "1 engine(s) without a zone" in one.detail
    silent = checks.zone_latency("default", {"zone-a": [100.0], "zone-b": []})
    assert silent.verdict is Verdict.CANNOT
    assert "zone-b" in silent.measured


def test_engines_are_grouped_by_pool_and_zone() -> None:
    engines = [
        Engine("default", "10.0.0.1:8000", "a"),
        Engine("default", "10.0.0.2:8000", "a"),
        Engine("default", "10.0.0.3:8000", "b"),
        Engine("long", "10.0.0.4:8000", None),
    ]
    latencies = {"10.0.0.1:8000": [1.0], "10.0.0.2:8000": [2.0], "10.0.0.3:8000": [3.0]}
    grouped = by_zone(engines, latencies)
    assert grouped["default"] == ({"a": [1.0, 2.0], "b": [3.0]}, 0)
    assert grouped["long"] == ({}, 1)


# --- zones: the policy's, a file's, Kubernetes' labels


def _zoned_policy(tmp_path: Path, zones: object) -> Path:
    raw = example_policy()
    raw["pools"]["default"]["zones"] = zones
    return write_policy(tmp_path / "policy.yaml", raw)


def test_a_pool_names_each_engines_zone(tmp_path: Path) -> None:
    zones = {"127.0.0.1:18001": "zone-a", "127.0.0.1:18004": "zone-b"}
    policy = load_policy(_zoned_policy(tmp_path, zones))
    assert policy.pools["default"].zone_of("127.0.0.1:18004") == "zone-b"
    assert policy.pools["long"].zones == ()  # optional: policies without zones load as before
    assert load_policy(EXAMPLE_POLICY).pools["default"].zone_of("127.0.0.1:18001") is None


@pytest.mark.parametrize(
    ("zones", "message"),
    [
        ({"127.0.0.1:9": "zone-a"}, "pools.default.zones['127.0.0.1:9']: not one of the pool's"),
        ({"127.0.0.1:18001": ""}, "pools.default.zones['127.0.0.1:18001']: expected a zone"),
        (["zone-a"], "pools.default.zones"),
    ],
)
def test_a_bad_zone_is_refused_with_its_path(tmp_path: Path, zones: object, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("[", r"\[")):
        load_policy(_zoned_policy(tmp_path, zones))


def test_a_zones_file_wins_over_the_policy_by_address_then_by_host(tmp_path: Path) -> None:
    zones = {"127.0.0.1:18001": "zone-a", "127.0.0.1:18004": "zone-b"}
    policy = load_policy(_zoned_policy(tmp_path, zones))
    endpoints = [
        ("default", "127.0.0.1:18001"),
        ("default", "127.0.0.1:18004"),
        ("long", "10.1.2.3:8000"),
        ("long", "10.9.9.9:8000"),
    ]
    from_file = {"127.0.0.1:18004": "zone-c", "10.1.2.3": "zone-d"}
    assert [e.zone for e in engines_with_zones(endpoints, policy, from_file)] == [
        "zone-a",
        "zone-c",
        "zone-d",
        None,
    ]


def test_kubernetes_zones_come_from_the_pods_nodes_labels() -> None:
    listing = {
        "kind": "List",
        "items": [
            {
                "kind": "Node",
                "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "eu-1a"}},
            },
            {"kind": "Node", "metadata": {"name": "n2", "labels": {}}},
            {"kind": "Pod", "spec": {"nodeName": "n1"}, "status": {"podIP": "10.0.0.5"}},
            {"kind": "Pod", "spec": {"nodeName": "n2"}, "status": {"podIP": "10.0.0.6"}},
        ],
    }
    assert zones_from_document(listing) == {"10.0.0.5": "eu-1a"}
    assert zones_from_document({"10.0.0.7:8000": "eu-1b"}) == {"10.0.0.7:8000": "eu-1b"}
    with pytest.raises(ValueError):
        zones_from_document(["eu-1a"])


# --- alert rules


def test_every_shipped_alert_must_be_loaded() -> None:
    shipped = shipped_alert_names()
    assert "SlogateBreakerHighLevel" in shipped  # read from the shipped file now
    assert checks.alert_rules(shipped, [*shipped, "Other"]).verdict is Verdict.PASS
    result = checks.alert_rules(shipped, shipped[1:])
    assert result.verdict is Verdict.FAIL
    assert result.detail == f"missing {shipped[0]}"
    assert result.measured == f"{len(shipped) - 1} of {len(shipped)} loaded"


def test_shipped_alert_names_are_read_from_the_file_given(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "g", "rules": [{"alert": "A"}, {"record": "r"}]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    assert shipped_alert_names(path) == ["A"]


# --- the monthly L3


def test_an_l3_within_31_days_passes_even_with_short_history() -> None:
    result = checks.last_l3("default", 3.0, 3600.0)
    assert result.verdict is Verdict.PASS
    assert "1.00 d of history" not in result.measured and "0.04 d" in result.measured


def test_no_l3_with_less_than_31_days_of_history_cannot_be_checked_and_says_how_much() -> None:
    result = checks.last_l3("default", 2.0, 30 * DAY_S)
    assert result.verdict is Verdict.CANNOT
    assert result.measured == "highest L2; 30.00 d of history"
    assert checks.last_l3("default", 0.0, 120.0).measured == "highest L0; 2 min of history"


def test_a_prometheus_keeping_less_than_31_days_can_never_check_the_month() -> None:
    result = checks.last_l3("default", 0.0, 15 * DAY_S, retention_s=15 * DAY_S)
    assert result.verdict is Verdict.CANNOT
    assert result.detail == "Prometheus keeps 15 d, less than 31 d"
    assert checks.last_l3("default", 3.0, 60.0, retention_s=15 * DAY_S).verdict is Verdict.PASS
    assert checks.last_l3("default", 0.0, 40 * DAY_S, 90 * DAY_S).verdict is Verdict.FAIL


def test_no_l3_over_a_whole_31_days_fails() -> None:
    assert checks.last_l3("default", 2.0, 31 * DAY_S).verdict is Verdict.FAIL
    assert checks.last_l3("long", None, 40 * DAY_S).measured == "no series in 31 d"


# --- drills


def _stream(status: int = 200, done: bool = True, finish: str | None = "length") -> HeldStream:
    return HeldStream(status, 8, finish, done)


def test_held_streams_pass_only_when_every_one_ended_whole() -> None:
    good = checks.held_requests("default", [_stream(), _stream()], 2, 1, 2)
    assert good.verdict is Verdict.PASS
    assert good.measured == (
        "2 of 2 streams whole; at the drill 2 running, 1 waiting; 2 still streaming when it ended"
    )
    cut = checks.held_requests("default", [_stream(), _stream(done=False, finish=None)], 2, 0, 1)
    assert cut.verdict is Verdict.FAIL
    assert checks.held_requests("default", [], 0, 0, 0).verdict is Verdict.CANNOT


def test_recovery_fails_when_nothing_was_served_again() -> None:
    assert checks.recovered("default", 0.4, 30.0).verdict is Verdict.PASS
    assert checks.recovered("default", None, 30.0).measured == "not served within 30 s"


def test_the_expected_answers_are_the_shedding_tables() -> None:
    assert expected_action(1, Tier.SHEDDABLE, True) == "refuse:long_context_shed"
    assert expected_action(1, Tier.SHEDDABLE, False) == "admit"
    assert expected_action(2, Tier.STANDARD, True) == "refuse:context_capped"
    assert expected_action(2, Tier.SHEDDABLE, False) == "refuse:tier_shed"
    assert expected_action(3, Tier.CRITICAL, False) == "reroute"
    # Each preset's probes include one request the level changes.
    for level, probes in PRESET_PROBES.items():
        assert any(expected_action(level, t, long) != "admit" for t, long in probes)


def test_a_preset_that_did_not_take_effect_fails() -> None:
    rerouted = PresetProbe("critical", False, 200, "", "fallback")
    shed = PresetProbe("standard", False, 503, "shed_tier_shed", "")
    passed = checks.preset(
        3, "default", [(rerouted, "reroute"), (shed, "refuse:tier_shed")], "fallback"
    )
    assert passed.verdict is Verdict.PASS
    admitted = PresetProbe("standard", False, 200, "", "default")
    failed = checks.preset(3, "default", [(admitted, "refuse:tier_shed")], "fallback")
    assert failed.verdict is Verdict.FAIL
    assert failed.detail == "standard/short: expected 503 shed_tier_shed, got 200"
    # The sheddable tier's refusals are 429s (the endpoint picker protocol's drop).
    dropped = PresetProbe("sheddable", False, 429, "shed_tier_shed", "")
    assert checks.preset(2, "default", [(dropped, "refuse:tier_shed")], "fallback").verdict is (
        Verdict.PASS
    )
    stayed = PresetProbe("critical", False, 200, "", "default")
    assert checks.preset(3, "default", [(stayed, "reroute")], "fallback").verdict is Verdict.FAIL


# --- the exit status and the keys


def test_a_failure_exits_1_and_cannot_check_only_when_strict() -> None:
    cannot = CheckResult("last_l3", "default", Verdict.CANNOT, "")
    passed = CheckResult("alert_rules", "prometheus", Verdict.PASS, "")
    failed = CheckResult("scrape_interval", "prometheus", Verdict.FAIL, "")
    assert checks.exit_code([passed, cannot]) == 0
    assert checks.exit_code([passed, cannot], strict=True) == 1
    assert checks.exit_code([passed, failed]) == 1


def test_the_demo_policys_clear_keys_give_one_unlimited_key_per_tier() -> None:
    assert clear_keys(EXAMPLE_POLICY) == {
        Tier.CRITICAL: "sk-demo-critical",
        Tier.STANDARD: "sk-demo-standard",
        Tier.SHEDDABLE: "sk-demo-batch",
    }
