"""LiteLLM's arm of `slogate bench overhead`: the comparison's arithmetic, the arms each
profile runs, and the proxy's config. That the proxy as the bench configures it really
enforces the bench key's limits: tests/e2e/tooling/benchmarks/test_litellm_arm.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from tooling.benchmarks import litellm_arm, vs_litellm
from tooling.benchmarks.levers import BENCH_KEY
from tooling.benchmarks.overhead import litellm_arms, setups_for


def _row(p50: float, rps: float, **cpu: float) -> dict[str, float]:
    return {"p50_ms": p50, "rps_16": rps, **{f"cpu_us_per_request_{k}": v for k, v in cpu.items()}}


def test_both_are_measured_from_the_upstream_alone_and_per_core_from_their_cpu() -> None:
    setups = {
        "upstream_direct": _row(0.2, 20000),
        "slogate": _row(0.7, 9000, sidecar=150.0, envoy=50.0),
        "litellm": _row(4.2, 800, litellm=1000.0),
    }
    v = vs_litellm.verdicts(setups)["litellm"]
    assert v["p50_overhead_ms_slogate"] == 0.5
    assert v["p50_overhead_ms_litellm"] == 4.0
    assert v["rps_per_core_slogate"] == 5000.0  # 1e6 / (150 + 50)
    assert v["rps_per_core_litellm"] == 1000.0
    assert v["met"] is True
    # Behind on either is not met, and the line says which.
    setups["litellm"] = _row(0.6, 800, litellm=100.0)
    v = vs_litellm.verdicts(setups)["litellm"]
    assert (v["ahead_p50"], v["ahead_per_core"], v["met"]) == (False, False, False)
    assert "behind" in vs_litellm.lines({"small": {"litellm": v}})
    # The Redis arms are compared with each other, not with slogate in memory.
    setups["slogate_redis"] = _row(1.2, 7000, sidecar=200.0, envoy=50.0)
    setups["litellm_redis"] = _row(9.2, 600, litellm=1250.0)
    v = vs_litellm.verdicts(setups)["litellm_redis"]
    assert (v["slogate_arm"], v["p50_overhead_ms_slogate"], v["rps_per_core_slogate"]) == (
        "slogate_redis",
        1.0,
        4000.0,
    )
    assert "slogate_redis vs litellm_redis" in vs_litellm.lines({"small": {"litellm_redis": v}})
    # Without the zero there is nothing to compare.
    del setups["upstream_direct"]
    assert vs_litellm.verdicts(setups) == {}


def test_the_litellm_arms_come_after_the_upstream_alone_on_every_profile() -> None:
    assert setups_for("multi_turn", (), ("litellm",)) == (
        "upstream_direct",
        "passthrough",
        "slogate",
        "litellm",
    )
    assert setups_for("small", (), ("litellm",))[:5] == (
        "envoy_alone",
        "upstream_direct",
        "passthrough",
        "slogate",
        "litellm",
    )
    assert "upstream_direct" not in setups_for("small")
    assert litellm_arms("off") == ()


def test_the_config_gives_the_bench_key_its_limits_and_redis_when_asked(tmp_path: Path) -> None:
    config = yaml.safe_load(
        litellm_arm.write_config(tmp_path, 18000, rpm=7, tpm=9, redis_port=6390).read_text()
    )
    params = config["model_list"][0]["litellm_params"]
    assert params["api_base"] == "http://127.0.0.1:18000/v1"
    assert params["model"] == "openai/deepseek-v4"
    assert config["general_settings"]["coordination_redis"] == {
        "host": "127.0.0.1",
        "port": 6390,
    }
    auth = (tmp_path / "bench_auth.py").read_text()
    assert "rpm_limit=7" in auth and "tpm_limit=9" in auth and repr(BENCH_KEY) in auth
    assert "coordination_redis" not in litellm_arm.write_config(tmp_path, 18000).read_text()
