"""The `tenants:` section: the tenants an operator manages, read into a `TenantBook`.

What lives here: the reader of `tenants:` — `classes` (named bundles a tenant can name:
gold, silver), `list` (the tenants, each an exception to its class) and `defaults` (the
entry of every tenant `list` does not name) — and the waiting room's weights merged with
the tenants'. Keys inherit from their tenant by `policy.domain.build_caller`.

Most specific wins, field by field: a key's own tier and limits, then its tenant's entry,
then the entry's class (an entry naming no class builds on `defaults`), then the tier's.
Limits merge field by field; `slo.ttft_p99_ms`, `pools` and the rest replace what the class
sets. Without `defaults`, a key must name a listed tenant. Every error names the tenant and
the field (`tenants.list.acme.limits.tokens_per_minute: must be >= 0`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TypeVar

from policy._access import parse_limits, parse_tier
from policy._reader import PolicyError, Section, expect, kind_of, one_of, positive
from policy._spend import check_units, merged_spend, read_prices, read_spend, spend_limits
from policy.domain import (
    BudgetScope,
    Limits,
    Tenant,
    TenantBook,
    TenantWeights,
    Tier,
    tier_objective,
)

T = TypeVar("T")
_LIMIT_NAMES = tuple(f.name for f in fields(Limits))
# An InferenceObjective's name is a Kubernetes object name: a DNS-1123 subdomain.
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class _Entry:
    """What one entry (a class, a listed tenant, the defaults) sets itself; None: unset."""

    tier: Tier | None = None
    limits: Mapping[str, int] = field(default_factory=dict)
    ttft: Mapping[str, float] | None = None
    tpot: float | None = None
    weight: float | None = None
    pools: frozenset[str] | None = None
    suspended: bool | None = None
    tenant_class: str | None = None
    spend: Mapping[str, object] = field(default_factory=dict)  # policy._spend's fields
    shared_limits: bool | None = None
    inference_objective: str | None = None
    scope: BudgetScope | None = None


@dataclass(frozen=True, slots=True)
class _Known:
    """What an entry's fields may name."""

    pools: Collection[str]
    buckets: Collection[str]


def parse_tenants(
    raw: object,
    path: str,
    pools: Collection[str],
    buckets: Collection[str],
    room_weights: Mapping[str, float],
) -> tuple[TenantBook, TenantWeights] | None:
    """The tenants and the waiting room's weights with theirs; None without the section.

    A tenant's weight: its own `weight`, else `waiting_room.tenant_weights` (the older
    place for it), else its class's (or the defaults'), else 1. A listed tenant may not set
    it in both places.
    """
    if raw is None:
        return None
    sec = Section(raw, path)
    known = _Known(pools, buckets)
    classes: dict[str, _Entry] = {}
    for name, item, where in _named(sec.raw("classes"), sec.child("classes")):
        classes[name] = _read_entry(item, where, known, None)
    defaults: _Entry | None = None
    if (default_raw := sec.raw("defaults")) is not None:
        own = _read_entry(_expand(default_raw), sec.child("defaults"), known, classes)
        defaults = _merge(own, _class_of(own, classes, None))
    listed: dict[str, Tenant] = {}
    for name, item, where in _named(sec.raw("list"), sec.child("list")):
        own = _read_entry(_expand(item), where, known, classes)
        if own.weight is not None and name in room_weights:
            raise PolicyError(
                f"{where}.weight: waiting_room.tenant_weights.{name} sets it too; keep one"
            )
        merged = _merge(own, _class_of(own, classes, defaults), room_weights.get(name))
        listed[name] = _tenant(merged)
    prices = read_prices(sec.raw("prices"), sec.child("prices"))
    sec.close()
    default = None if defaults is None else _tenant(defaults)
    named = {f"{path}.list.{name}": tenant for name, tenant in listed.items()}
    check_units({**named, **({f"{path}.defaults": default} if default else {})}, prices, path)
    weights = {**room_weights, **{name: t.weight for name, t in listed.items()}}
    _check_objectives({**named, **({f"{path}.defaults": default} if default else {})})
    book = TenantBook(listed, default, prices)
    return book, TenantWeights(weights, default.weight if default else 1.0)


def _check_objectives(tenants: Mapping[str, Tenant]) -> None:
    """An InferenceObjective has one priority, its tier's: two tenants of different tiers
    may not name the same one, nor a tenant the objective slogate names for another tier."""
    tiers: dict[str, tuple[Tier, str]] = {
        tier_objective(tier): (tier, f"tier {tier.value}") for tier in Tier
    }
    for where, tenant in tenants.items():
        name = tenant.inference_objective
        if name is None:
            continue
        tier, named_by = tiers.setdefault(name, (tenant.tier, where))
        if tier is not tenant.tier:
            raise PolicyError(
                f"{where}.inference_objective: {name!r} is {named_by}'s, of tier {tier.value}; "
                f"an objective has one priority, and this tenant is {tenant.tier.value}"
            )


def _class_of(own: _Entry, classes: Mapping[str, _Entry], defaults: _Entry | None) -> _Entry:
    """What an entry builds on: the class it names, else the defaults, else nothing."""
    if own.tenant_class is not None:
        return classes[own.tenant_class]
    return _Entry() if defaults is None else defaults


def _named(raw: object, path: str) -> Iterator[tuple[str, object, str]]:
    """(name, entry, its path) of a mapping of named entries."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: expected a mapping of name -> entry, got {kind_of(raw)}")
    for name, item in raw.items():
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{path}.{name}: a name must be a non-empty string")
        yield name, item, f"{path}.{name}"


def _expand(item: object) -> object:
    """A tenant's shorthand: `acme: gold` names its class; `acme:` alone sets nothing."""
    if item is None:
        return {}
    return {"class": item} if isinstance(item, str) else item


def _read_entry(
    raw: object, path: str, known: _Known, classes: Mapping[str, _Entry] | None
) -> _Entry:
    """One entry; `classes` None: a class, which names no class itself."""
    sec = Section({} if raw is None else raw, path)
    tenant_class = None
    if classes is not None:
        tenant_class = sec.get("class", str, "") or None
        if tenant_class is not None and tenant_class not in classes:
            raise PolicyError(f"{sec.child('class')}: no class named {tenant_class!r}")
    tier_raw = sec.raw("tier")
    limits = parse_limits(sec.section("limits"), Limits())
    ttft, tpot = _read_slo(sec.raw("slo"), sec.child("slo"), known.buckets)
    weight = _optional(sec, "weight", float)
    if weight is not None:
        positive(weight, sec.child("weight"))
    entry = _Entry(
        tier=None if tier_raw is None else parse_tier(tier_raw, sec.child("tier")),
        limits={n: v for n in _LIMIT_NAMES if (v := getattr(limits, n)) is not None},
        ttft=ttft,
        tpot=tpot,
        weight=weight,
        pools=_read_pools(sec.raw("pools"), sec.child("pools"), known.pools),
        suspended=_optional(sec, "suspended", bool),
        tenant_class=tenant_class,
        spend=read_spend(sec.raw("spend"), sec.child("spend")),
        shared_limits=_optional(sec, "shared_limits", bool),
        inference_objective=_objective(sec),
        scope=None
        if sec.raw("scope") is None
        else BudgetScope(one_of(sec, "scope", BudgetScope, BudgetScope.REGION)),
    )
    sec.close()
    return entry


def _objective(sec: Section) -> str | None:
    name = _optional(sec, "inference_objective", str)
    if name is not None and (len(name) > 253 or not _DNS_1123.fullmatch(name)):
        raise PolicyError(
            f"{sec.child('inference_objective')}: {name!r} is not a Kubernetes object name "
            "(lower-case letters, digits, '-' and '.', starting and ending with a letter or "
            "digit, at most 253)"
        )
    return name


def _optional(sec: Section, name: str, kind: type[T]) -> T | None:
    value = sec.raw(name)
    return None if value is None else expect(value, kind, sec.child(name))


def _read_slo(
    raw: object, path: str, buckets: Collection[str]
) -> tuple[Mapping[str, float] | None, float | None]:
    """`slo: {ttft_p99_ms: 800, tpot_p99_ms: 60}`; ttft_p99_ms may be per bucket, like the
    `slos:` section's (`{default: 800, "32k-128k": 4000}`)."""
    if raw is None:
        return None, None
    sec = Section(raw, path)
    ttft_raw = sec.raw("ttft_p99_ms")
    where = sec.child("ttft_p99_ms")
    ttft: dict[str, float] | None = None
    if isinstance(ttft_raw, dict):
        ttft = {}
        for name, value in ttft_raw.items():
            if name != "default" and name not in buckets:
                raise PolicyError(f"{where}.{name}: no bucket named {name!r}")
            ms = expect(value, float, f"{where}.{name}")
            positive(ms, f"{where}.{name}")
            ttft["*" if name == "default" else name] = ms
    elif ttft_raw is not None:
        ttft = {"*": expect(ttft_raw, float, where)}
        positive(ttft["*"], where)
    tpot = _optional(sec, "tpot_p99_ms", float)
    if tpot is not None:
        positive(tpot, sec.child("tpot_p99_ms"))
    sec.close()
    return ttft, tpot


def _read_pools(raw: object, path: str, pools: Collection[str]) -> frozenset[str] | None:
    if raw is None:
        return None
    names = expect(raw, list, path)
    if not names:
        raise PolicyError(f"{path}: name at least one pool (to refuse everything: suspended)")
    for i, name in enumerate(names):
        if expect(name, str, f"{path}[{i}]") not in pools:
            raise PolicyError(f"{path}[{i}]: no pool named {name!r}")
    return frozenset(names)


def _pick(*values: T | None) -> T | None:
    return next((v for v in values if v is not None), None)


def _merge(own: _Entry, base: _Entry, named_weight: float | None = None) -> _Entry:
    """What `own` sets, else `base` (its class, or the defaults); `named_weight`: its
    weight in `waiting_room.tenant_weights`, between the two."""
    return _Entry(
        tier=_pick(own.tier, base.tier),
        limits={**base.limits, **own.limits},
        ttft=_pick(own.ttft, base.ttft),
        tpot=_pick(own.tpot, base.tpot),
        weight=_pick(own.weight, named_weight, base.weight),
        pools=_pick(own.pools, base.pools),
        suspended=_pick(own.suspended, base.suspended),
        tenant_class=_pick(own.tenant_class, base.tenant_class),
        spend=merged_spend(own.spend, base.spend),
        shared_limits=_pick(own.shared_limits, base.shared_limits),
        inference_objective=_pick(own.inference_objective, base.inference_objective),
        scope=_pick(own.scope, base.scope),
    )


def _tenant(entry: _Entry) -> Tenant:
    return Tenant(
        tier=entry.tier or Tier.STANDARD,
        limits=entry.limits,
        ttft_p99_ms=entry.ttft or {},
        tpot_p99_ms=entry.tpot,
        weight=entry.weight or 1.0,
        pools=entry.pools,
        suspended=bool(entry.suspended),
        tenant_class=entry.tenant_class,
        spend=spend_limits(entry.spend),
        shared_limits=bool(entry.shared_limits),
        inference_objective=entry.inference_objective,
        scope=entry.scope or BudgetScope.REGION,
    )
