"""The generated bootstrap accepted by the real Envoy binary (a broken one refused). Its
shape: tests/tooling/render/envoy_config/test_bootstrap.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from extproc.request.contract import EXT_PROC_FILTER
from policy.domain import FailureMode
from policy.loader import load_policy
from tests.support.envoy_config import bootstrap_manager, validate
from tests.support.stack import EXAMPLE_POLICY
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.profile import FilterProfile


@pytest.mark.parametrize("profile", list(FilterProfile))
@pytest.mark.parametrize("mode", list(FailureMode))
def test_real_envoy_accepts_generated_bootstrap(
    tmp_path: Path, profile: FilterProfile, mode: FailureMode
) -> None:
    policy = dataclasses.replace(load_policy(EXAMPLE_POLICY), failure_mode=mode)
    result = validate(build_bootstrap(policy, profile=profile), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout + result.stderr


def test_envoy_rejects_a_broken_bootstrap(tmp_path: Path) -> None:
    config = build_bootstrap(load_policy(EXAMPLE_POLICY))
    config["staticResources"]["clusters"][0]["connectTimeout"] = "forever"
    assert validate(config, tmp_path).returncode != 0


@pytest.mark.parametrize("required", [True, False])
def test_tls_and_remote_jwks_bootstrap_is_valid(tmp_path: Path, required: bool) -> None:
    from policy.loader import parse_policy

    policy = parse_policy(
        {
            "tls": {"cert_file": "/etc/slogate/tls.crt", "key_file": "/etc/slogate/tls.key"},
            "jwt": {
                "issuer": "https://auth.example.com/",
                "audiences": ["slogate"],
                "jwks_uri": "https://auth.example.com/.well-known/jwks.json",
                "required": required,
            },
        }
    )
    config = build_bootstrap(policy)
    clusters = {c["name"] for c in config["staticResources"]["clusters"]}
    assert "slogate_jwks" in clusters
    names = [f["name"] for f in bootstrap_manager(config)["httpFilters"]]
    assert names[:2] == ["envoy.filters.http.jwt_authn", EXT_PROC_FILTER]
    # The certificate files do not exist here: validation reads them, so check the rest.
    chain = config["staticResources"]["listeners"][0]["filterChains"][0]
    assert chain["transportSocket"]["name"] == "envoy.transport_sockets.tls"
    del chain["transportSocket"]
    result = validate(config, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
