"""Policy sections about the fleet: context buckets, pools, routing rules, the breaker,
latency models and SLOs. Readers only; `policy.loader` calls them in order."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from policy._reader import PolicyError, Section, expect, one_of, positive
from policy.domain import (
    ChatTemplate,
    ContextBucket,
    EngineKind,
    KvEvents,
    LatencyFit,
    Picker,
    Pool,
    RouteRule,
    Tier,
)
from policy.schema import (
    COUNTING_ENGINES,
    DEFAULT_TPOT_SLOS_MS,
    GLOBAL_BREAKER,
    BreakerConfig,
    BreakerThresholds,
    CountingConfig,
    WaitingRoomConfig,
)

_DEFAULT_BUCKETS: tuple[tuple[str, int | None, float, float], ...] = (
    # Cost weights follow the field's latency slopes: a long request costs more per token;
    # KV weights its memory per token (1x / 1.8x / 4.2x, +15% for long sessions).
    ("0-4k", 4096, 1.0, 1.0),
    ("4-8k", 8192, 1.3, 1.8),
    ("8-32k", 32768, 1.8, 4.2),
    ("32k-128k", 131072, 2.5, 4.83),
    ("128k+", None, 3.0, 4.83),
)
_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


def parse_buckets(raw: object, path: str) -> tuple[ContextBucket, ...]:
    if raw is None:
        raw = [
            {"name": n, "max_tokens": m, "cost_weight": w, "kv_weight": kv}
            for n, m, w, kv in _DEFAULT_BUCKETS
        ]
    if not isinstance(raw, list) or not raw:
        raise PolicyError(f"{path}: expected a non-empty list of buckets")
    buckets: list[ContextBucket] = []
    lower = 0
    for i, item in enumerate(raw):
        sec = Section(item, f"{path}[{i}]")
        name = sec.require("name", str)
        upper_raw = sec.raw("max_tokens")
        upper = None if upper_raw is None else expect(upper_raw, int, sec.child("max_tokens"))
        weight = sec.get("cost_weight", float, 1.0)
        positive(weight, sec.child("cost_weight"))
        kv_weight = sec.get("kv_weight", float, 1.0)
        positive(kv_weight, sec.child("kv_weight"))
        sec.close()
        if upper is not None and upper < lower:
            raise PolicyError(f"{sec.child('max_tokens')}: buckets must be in ascending order")
        if upper is None and i != len(raw) - 1:
            raise PolicyError(f"{sec.child('max_tokens')}: only the last bucket may be unbounded")
        buckets.append(ContextBucket(name, lower, upper, weight, kv_weight))
        lower = (upper or 0) + 1
    if buckets[-1].max_tokens is not None:
        raise PolicyError(f"{path}[{len(raw) - 1}].max_tokens: the last bucket must be unbounded")
    if len({b.name for b in buckets}) != len(buckets):
        raise PolicyError(f"{path}: bucket names must be unique")
    return tuple(buckets)


def parse_pools(raw: object, path: str) -> dict[str, Pool]:
    if raw is None:
        raw = {
            "default": {"endpoints": ["127.0.0.1:18001"]},
            "long": {"endpoints": ["127.0.0.1:18002"]},
            "fallback": {"endpoints": ["127.0.0.1:18003"]},
        }
    if not isinstance(raw, dict) or not raw:
        raise PolicyError(f"{path}: expected a non-empty mapping of pool name -> pool")
    pools: dict[str, Pool] = {}
    for name, item in raw.items():
        pool_path = f"{path}.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
            raise PolicyError(f"{pool_path}: pool names are lowercase [a-z0-9_-], max 32 chars")
        if name == GLOBAL_BREAKER:
            # The global breaker is named so in metrics, drills and the admin API: a pool of
            # that name would silently merge with it.
            raise PolicyError(f"{pool_path}: {GLOBAL_BREAKER!r} is the global breaker's name")
        sec = Section(item, pool_path)
        endpoints_raw = sec.require("endpoints", list)
        capacities: dict[str, int | None] = {}
        for field_name in ("kv_capacity_tokens", "max_num_seqs"):
            value = sec.raw(field_name)
            capacities[field_name] = (
                None if value is None else expect(value, int, sec.child(field_name))
            )
            if value is not None:
                positive(capacities[field_name] or 0, sec.child(field_name))
        priority_scheduling = sec.get("priority_scheduling", bool, False)
        engine_name = one_of(sec, "engine", EngineKind, EngineKind.VLLM)
        picker = one_of(sec, "picker", Picker, Picker.SLOGATE)
        zones_raw = sec.get("zones", dict, {})
        kv_events = _parse_kv_events(sec.raw("kv_events"), sec.child("kv_events"))
        sec.close()
        if not endpoints_raw:
            raise PolicyError(f"{sec.child('endpoints')}: needs at least one endpoint")
        endpoints = []
        for j, ep in enumerate(endpoints_raw):
            ep_path = f"{sec.child('endpoints')}[{j}]"
            match = _ENDPOINT.match(ep) if isinstance(ep, str) else None
            if match is None or not 0 < int(match["port"]) < 65536:
                raise PolicyError(f"{ep_path}: expected 'host:port', got {ep!r}")
            endpoints.append((match["host"].strip("[]"), int(match["port"])))
        pools[name] = Pool(
            name,
            tuple(endpoints),
            priority_scheduling=priority_scheduling,
            engine=EngineKind(engine_name),
            picker=Picker(picker),
            zones=_parse_zones(zones_raw, endpoints_raw, sec.child("zones")),
            kv_events=kv_events,
            **capacities,
        )
    return pools


def _parse_kv_events(raw: object, path: str) -> KvEvents | None:
    """`kv_events:` absent or false: off; true: vLLM's defaults; a mapping: its fields."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return KvEvents()
    sec = Section(raw, path)
    defaults = KvEvents()
    port = sec.get("port", int, defaults.port)
    replay_raw = sec.raw("replay_port")
    replay_port = None if replay_raw is None else expect(replay_raw, int, sec.child("replay_port"))
    relative = sec.get("relative_ports", bool, False)
    topic = sec.get("topic", str, defaults.topic)
    max_blocks = sec.get("max_blocks", int, defaults.max_blocks)
    tokenizer = sec.get("tokenizer", str, "") or None
    template = one_of(sec, "chat_template", ChatTemplate, defaults.chat_template)
    sec.close()
    for name, value in (("port", port), ("replay_port", replay_port)):
        if value is not None and not 0 < value < 65536:
            raise PolicyError(f"{sec.child(name)}: expected a port (1-65535), got {value}")
    if replay_port == port:
        raise PolicyError(f"{sec.child('replay_port')}: must differ from port")
    positive(max_blocks, sec.child("max_blocks"))
    return KvEvents(
        port, replay_port, relative, topic, max_blocks, tokenizer, ChatTemplate(template)
    )


def _parse_zones(
    raw: dict[object, object], endpoints: list[str], path: str
) -> tuple[tuple[str, str], ...]:
    """`zones: {"host:port": zone}`: each key one of the pool's endpoints as written (a key
    naming no engine would silently leave that engine zoneless), each zone a non-empty name."""
    zones = []
    for endpoint, zone in raw.items():
        if endpoint not in endpoints:
            raise PolicyError(f"{path}[{endpoint!r}]: not one of the pool's endpoints")
        if not isinstance(zone, str) or not zone:
            raise PolicyError(f"{path}[{endpoint!r}]: expected a zone name, got {zone!r}")
        zones.append((str(endpoint), zone))
    return tuple(sorted(zones))


def parse_rules(raw: object, path: str, pools: Mapping[str, Pool]) -> tuple[RouteRule, ...]:
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected a list of rules")
    rules = []
    for i, item in enumerate(raw):
        sec = Section(item, f"{path}[{i}]")
        pool = sec.require("pool", str)
        if pool not in pools:
            raise PolicyError(f"{sec.child('pool')}: no pool named {pool!r}")
        low = sec.get("min_context_tokens", int, 0)
        high_raw = sec.raw("max_context_tokens")
        high = None if high_raw is None else expect(high_raw, int, sec.child("max_context_tokens"))
        sec.close()
        if low < 0 or (high is not None and high < low):
            raise PolicyError(f"{sec.child('min_context_tokens')}: empty or negative range")
        rules.append(RouteRule(pool, low, high))
    return tuple(rules)


_DEFAULT_THRESHOLDS = BreakerThresholds()
_DEFAULT_SLOS_MS = {Tier.CRITICAL: 2000.0, Tier.STANDARD: 4000.0, Tier.SHEDDABLE: 15000.0}


def parse_breaker(sec: Section) -> BreakerConfig:
    t = _DEFAULT_THRESHOLDS
    th = sec.section("thresholds")
    values: dict[str, float] = {}
    for name in (
        "l1_p99_over_slo",
        "l2_p99_over_slo",
        "l3_p99_over_slo",
        "l1_kv_cache",
        "l2_error_rate",
        "l3_error_rate",
        "l2_gpu_memory",
        "l3_gpu_memory",
        "cooldown_s",
        "probe_hold_s",
        "probe_fraction",
    ):
        values[name] = th.get(name, float, getattr(t, name))
        if values[name] < 0:
            raise PolicyError(f"{th.child(name)}: must be >= 0")
    hold_raw = th.raw("enter_hold_s")
    hold = t.enter_hold_s
    if hold_raw is not None:
        if not isinstance(hold_raw, list) or len(hold_raw) != 3:
            raise PolicyError(f"{th.child('enter_hold_s')}: expected [L1, L2, L3] seconds")
        path = th.child("enter_hold_s")
        l1, l2, l3 = (expect(v, float, f"{path}[{i}]") for i, v in enumerate(hold_raw))
        hold = (l1, l2, l3)
    th.close()
    if not 0.0 <= values["probe_fraction"] <= 1.0:
        raise PolicyError(f"{th.child('probe_fraction')}: must be in [0, 1]")
    config = sec.config(
        BreakerConfig,
        thresholds=BreakerThresholds(enter_hold_s=hold, **values),
        kv_shares=parse_kv_shares(sec.section("kv_shares")),
    )
    for name in (
        "window_s",
        "evaluate_interval_s",
        "scrape_interval_s",
        "stale_after_s",
        "controller_interval_s",
    ):
        positive(getattr(config, name), sec.child(name))
    if not 0.0 <= config.kv_lend_up_to <= 1.0:
        raise PolicyError(f"{sec.child('kv_lend_up_to')}: a share of the KV cache, in [0, 1]")
    if config.scrape_interval_s > 15.0:
        raise PolicyError(f"{sec.child('scrape_interval_s')}: at most 15 s")
    sec.close()
    return config


def parse_latency_models(
    raw: object, path: str, pools: Mapping[str, Pool], buckets: Sequence[ContextBucket]
) -> dict[str, LatencyFit]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: expected pool name -> latency model")
    names = {b.name for b in buckets}
    fits: dict[str, LatencyFit] = {}
    for pool, item in raw.items():
        sec = Section(item, f"{path}.{pool}")
        if pool not in pools:
            raise PolicyError(f"{path}.{pool}: no pool named {pool!r}")
        base = sec.require("base_latency_ms", float)
        prefill = sec.require("prefill_ms_per_1k_tokens", float)
        slopes_raw = sec.get("bucket_slopes", dict, {})
        sec.close()
        for name, value in (("base_latency_ms", base), ("prefill_ms_per_1k_tokens", prefill)):
            if value < 0:
                raise PolicyError(f"{sec.child(name)}: must be >= 0")
        slopes: dict[str, float] = {}
        for name, value in slopes_raw.items():
            where = f"{sec.child('bucket_slopes')}.{name}"
            if name not in names:
                raise PolicyError(f"{where}: no bucket named {name!r}")
            slopes[name] = expect(value, float, where)
            positive(slopes[name], where)
        fits[pool] = LatencyFit(base, prefill, slopes)
    return fits


def parse_kv_shares(sec: Section) -> dict[Tier, float]:
    shares = dict(BreakerConfig().kv_shares)
    for tier in Tier:
        value = sec.get(tier.value, float, shares[tier])
        if not 0.0 < value <= 1.0:
            raise PolicyError(f"{sec.child(tier.value)}: a share of the KV cache, in (0, 1]")
        shares[tier] = value
    sec.close()
    if not shares[Tier.SHEDDABLE] <= shares[Tier.STANDARD] <= shares[Tier.CRITICAL]:
        raise PolicyError(f"{sec.child('sheddable')}: shares must not grow from critical down")
    return shares


def parse_slos(sec: Section, bucket_names: set[str]) -> dict[tuple[Tier, str], float]:
    slos: dict[tuple[Tier, str], float] = {(t, "*"): ms for t, ms in _DEFAULT_SLOS_MS.items()}
    for tier in Tier:
        tier_sec = sec.section(tier.value)
        for name in list(tier_sec._raw):
            if name != "default" and name not in bucket_names:
                raise PolicyError(f"{tier_sec.child(name)}: no bucket named {name!r}")
            value = tier_sec.get(name, float, 0.0)
            positive(value, tier_sec.child(name))
            slos[(tier, "*" if name == "default" else name)] = value
        tier_sec.close()
    sec.close()
    return slos


def parse_counting(sec: Section) -> CountingConfig:
    config = sec.config(CountingConfig)
    sec.close()
    if config.per_message_overhead_tokens < 0:
        raise PolicyError(f"{sec.child('per_message_overhead_tokens')}: must be >= 0")
    if config.engine not in COUNTING_ENGINES:
        raise PolicyError(f"{sec.child('engine')}: must be one of {', '.join(COUNTING_ENGINES)}")
    for name in ("inline_max_bytes", "inline_unicode_max_bytes", "split_min_bytes"):
        if getattr(config, name) < 0:
            raise PolicyError(f"{sec.child(name)}: must be >= 0")
    for name in ("workers", "max_bytes", "queue_max_bytes", "cache_entries"):
        positive(getattr(config, name), sec.child(name))
    return config


def parse_tpot_slos(sec: Section) -> dict[Tier, float]:
    """P99 ms per output token per tier, for requests that are not streamed."""
    slos: dict[Tier, float] = dict(DEFAULT_TPOT_SLOS_MS)
    for tier in Tier:
        slos[tier] = sec.get(tier.value, float, slos[tier])
        positive(slos[tier], sec.child(tier.value))
    sec.close()
    return slos


def parse_waiting_room(sec: Section) -> WaitingRoomConfig:
    defaults = WaitingRoomConfig()
    waits_sec = sec.section("max_wait_s")
    waits: dict[Tier, float | None] = dict(defaults.max_wait_s)
    for tier in Tier:
        raw = waits_sec.raw(tier.value)
        if raw is None:
            continue
        waits[tier] = expect(raw, float, waits_sec.child(tier.value))
        if waits[tier] is not None and (waits[tier] or 0.0) < 0:
            raise PolicyError(f"{waits_sec.child(tier.value)}: must be >= 0")
    waits_sec.close()
    shares_sec = sec.section("slo_share")
    slo_share: dict[Tier, float] = dict(defaults.slo_share)
    for tier in Tier:
        slo_share[tier] = shares_sec.get(tier.value, float, slo_share[tier])
        if not 0.0 < slo_share[tier] <= 1.0:
            raise PolicyError(f"{shares_sec.child(tier.value)}: a share of the SLO, in (0, 1]")
    shares_sec.close()
    weights_raw = sec.get("tenant_weights", dict, {})
    weights: dict[str, float] = {}
    for tenant, value in weights_raw.items():
        where = f"{sec.child('tenant_weights')}.{tenant}"
        weights[str(tenant)] = expect(value, float, where)
        positive(weights[str(tenant)], where)
    config = sec.config(
        WaitingRoomConfig, max_wait_s=waits, slo_share=slo_share, tenant_weights=weights
    )
    sec.close()
    for name in ("max_waiting", "max_waiting_bytes", "half_life_s", "alert_critical_p99_wait_s"):
        positive(getattr(config, name), sec.child(name))
    for name in ("min_wait_s", "backfill_s", "hold_s", "output_weight"):
        if getattr(config, name) < 0:
            raise PolicyError(f"{sec.child(name)}: must be >= 0")
    return config
