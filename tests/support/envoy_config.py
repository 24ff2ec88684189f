"""Envoy configurations as the render tests build and check them: the real Envoy's
`--mode validate`, the bootstrap's HTTP connection manager, the one-message bootstrap, and the
fragment merged into a foreign Envoy's file (tests/data/foreign-envoy.yaml)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from policy._data_path import ExtProcMessages
from policy.loader import load_policy, parse_policy
from tests.support.messages import with_messages
from tests.support.stack import EXAMPLE_POLICY, example_policy
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.fragment import FragmentTarget, build_fragment
from tooling.stack.processes import envoy_binary

FOREIGN = Path(__file__).resolve().parents[1] / "data" / "foreign-envoy.yaml"
POOLS = {"default": "vllm_main", "long": "vllm_long_context", "fallback": "vllm_spare"}


def theirs() -> dict[str, Any]:
    text = FOREIGN.read_text()
    for name in ("ADMIN_PORT", "LISTEN_PORT", "DEFAULT_POOL_PORT", "LONG_POOL_PORT"):
        text = text.replace("${" + name + "}", "18000")
    loaded: dict[str, Any] = yaml.safe_load(text.replace("${FALLBACK_POOL_PORT}", "18003"))
    return loaded


def fragment(**target: Any) -> dict[str, Any]:
    options = {"pool_clusters": POOLS, **target}
    return build_fragment(load_policy(EXAMPLE_POLICY), FragmentTarget(**options))


def validate(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps(config))
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def bootstrap_manager(config: dict[str, Any]) -> dict[str, Any]:
    """The HTTP connection manager of a generated bootstrap's listener."""
    chain = config["staticResources"]["listeners"][0]["filterChains"][0]
    manager: dict[str, Any] = chain["filters"][0]["typedConfig"]
    return manager


def one_message_bootstrap(raw: dict[str, Any] | None = None) -> dict[str, Any]:
    policy = parse_policy(with_messages(raw or example_policy(), ExtProcMessages.ONE))
    return build_bootstrap(policy)
