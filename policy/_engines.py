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
    d = PickingConfig()
    config = PickingConfig(
        prefix_weight=sec.get("prefix_weight", float, d.prefix_weight),
        load_weight=sec.get("load_weight", float, d.load_weight),
        affinity_weight=sec.get("affinity_weight", float, d.affinity_weight),
        length_weight=sec.get("length_weight", float, d.length_weight),
        load_bound=sec.get("load_bound", float, d.load_bound),
        block_tokens=sec.get("block_tokens", int, d.block_tokens),
        index_entries=sec.get("index_entries", int, d.index_entries),
        choices=sec.get("choices", int, d.choices),
    )
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
    d = EngineHealthConfig()
    config = EngineHealthConfig(
        probes=sec.get("probes", bool, d.probes),
        probe_interval_s=sec.get("probe_interval_s", float, d.probe_interval_s),
        probe_timeout_s=sec.get("probe_timeout_s", float, d.probe_timeout_s),
        unhealthy_after=sec.get("unhealthy_after", int, d.unhealthy_after),
        healthy_after=sec.get("healthy_after", int, d.healthy_after),
        eject_after_errors=sec.get("eject_after_errors", int, d.eject_after_errors),
        eject_s=sec.get("eject_s", float, d.eject_s),
    )
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
