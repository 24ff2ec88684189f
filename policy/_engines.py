"""Policy section `engines`: how the engine inside a pool is picked, when an engine counts
as dead, and how often DNS names are resolved again. A reader only; `policy.loader` calls
it."""

from __future__ import annotations

from policy._reader import PolicyError, Section, positive
from policy.schema import EngineHealthConfig, EnginesConfig, PickingConfig


def parse_engines(sec: Section) -> EnginesConfig:
    config = EnginesConfig(
        picking=_picking(sec.section("picking")),
        health=_health(sec.section("health")),
        discovery_interval_s=sec.get(
            "discovery_interval_s", float, EnginesConfig().discovery_interval_s
        ),
    )
    positive(config.discovery_interval_s, sec.child("discovery_interval_s"))
    sec.close()
    return config


def _picking(sec: Section) -> PickingConfig:
    config = sec.config(PickingConfig)
    sec.close()
    for name in ("prefix_weight", "load_weight", "affinity_weight", "length_weight"):
        if getattr(config, name) < 0:
            raise PolicyError(f"{sec.child(name)}: must be >= 0")
    if config.load_bound < 1.0:
        raise PolicyError(f"{sec.child('load_bound')}: at least 1.0 (the mean load itself)")
    for name in ("block_tokens", "index_entries", "choices"):
        positive(getattr(config, name), sec.child(name))
    return config


def _health(sec: Section) -> EngineHealthConfig:
    config = sec.config(EngineHealthConfig)
    sec.close()
    for name in (
        "probe_interval_s",
        "probe_timeout_s",
        "unhealthy_after",
        "healthy_after",
        "eject_after_errors",
        "eject_s",
    ):
        positive(getattr(config, name), sec.child(name))
    return config
