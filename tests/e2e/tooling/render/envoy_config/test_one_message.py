"""The one-message bootstrap (policy `data_path.messages: one`) accepted by the real Envoy,
with JWT claims forwarded beside the headers. What it holds:
tests/tooling/render/envoy_config/test_one_message.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from extproc.request.contract import (
    EXT_PROC_FILTER,
    FORWARDED_NAMESPACE,
    JWT_FILTER,
)
from policy._data_path import ExtProcMessages
from policy.loader import parse_policy
from tests.support.envoy_config import bootstrap_manager, one_message_bootstrap, validate
from tests.support.messages import with_messages
from tests.support.stack import example_policy
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.one_message import FORWARD_FILTER
from tooling.render.envoy_config.profile import FilterProfile


@pytest.mark.parametrize("profile", [FilterProfile.SLOGATE, FilterProfile.EXT_PROC_ONLY])
def test_real_envoy_accepts_the_one_message_bootstrap(
    tmp_path: Path, profile: FilterProfile
) -> None:
    policy = parse_policy(with_messages(example_policy(), ExtProcMessages.ONE))
    result = validate(build_bootstrap(policy, profile=profile), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_jwt_claims_are_forwarded_beside_the_headers(tmp_path: Path) -> None:
    raw = {"jwt": {"issuer": "https://auth.example.com/", "jwks_file": "/dev/null"}}
    config = one_message_bootstrap(raw)
    names = [f["name"] for f in bootstrap_manager(config)["httpFilters"]]
    assert names[:3] == [JWT_FILTER, FORWARD_FILTER, EXT_PROC_FILTER]
    processor = bootstrap_manager(config)["httpFilters"][2]["typedConfig"]
    forwarded = processor["metadataOptions"]["forwardingNamespaces"]["untyped"]
    assert forwarded == [JWT_FILTER, FORWARDED_NAMESPACE]
