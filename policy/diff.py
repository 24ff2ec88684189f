"""What changes between two policies, in words: `slogate policy diff OLD NEW`'s schema part.

What lives here: `policy_changes(old, new)`, a pure function from two frozen policies to a
list of sentences (Markdown), most telling first: keys added or removed (by tenant, never
the key: its id, a SHA-256 prefix), tenants added, removed, suspended or restored, what a
tenant's limits, tier, objectives, weight, pools and spend budget became, the tiers'
limits, pools and routing, and then every other setting that differs, by its path. Nothing
here reads a file or knows about traffic (the traffic comparison replays a record).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from policy.domain import ApiKey, Limits, SpendLimits, Tenant
from policy.schema import Policy

# Compared field by field below, or not a setting (where the file was read from).
_SPECIAL = frozenset(
    {"keys", "tenants", "tier_limits", "pools", "route_rules", "default_pool", "fallback_pool"}
)
_NOT_SETTINGS = frozenset({"source", "candidate"})


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, SpendLimits):
        unit = value.unit.value
        return f"per day {_show(value.per_day)}, per month {_show(value.per_month)} ({unit})"
    if isinstance(value, frozenset | set):
        return "{" + ", ".join(sorted(map(str, value))) + "}"
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        # Pairs: a pool's endpoints (host, port) or its zones (endpoint, zone).
        if not value:
            return "none"
        if all(isinstance(port, int) for _, port in value):
            return ", ".join(f"{host}:{port}" for host, port in value)
        return "{" + ", ".join(f"{k}: {v}" for k, v in value) + "}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _limits_changes(old: Limits, new: Limits) -> list[str]:
    return [
        f"{f.name} {_show(getattr(old, f.name))} → {_show(getattr(new, f.name))}"
        for f in dataclasses.fields(Limits)
        if getattr(old, f.name) != getattr(new, f.name)
    ]


def _tenant_changes(old: Tenant, new: Tenant) -> list[str]:
    said: list[str] = []
    if old.suspended != new.suspended:
        said.append("suspended" if new.suspended else "restored (no longer suspended)")
    if old.tier != new.tier:
        said.append(f"tier {old.tier} → {new.tier}")
    for name in sorted({*old.limits, *new.limits}):
        before, after = old.limits.get(name), new.limits.get(name)
        if before != after:
            said.append(f"{name} {_show(before)} → {_show(after)}")
    if old.ttft_p99_ms != new.ttft_p99_ms:
        said.append(f"TTFT objectives {dict(old.ttft_p99_ms)} → {dict(new.ttft_p99_ms)}")
    if old.tpot_p99_ms != new.tpot_p99_ms:
        said.append(f"TPOT objective {_show(old.tpot_p99_ms)} → {_show(new.tpot_p99_ms)} ms")
    if old.weight != new.weight:
        said.append(f"weight {_show(old.weight)} → {_show(new.weight)}")
    if old.pools != new.pools:
        said.append(
            f"pools {_show(old.pools) if old.pools else 'all'} → "
            f"{_show(new.pools) if new.pools else 'all'}"
        )
    if old.spend != new.spend:
        said.append(f"spend budget {_show(old.spend)} → {_show(new.spend)}")
    if old.shared_limits != new.shared_limits:
        said.append("limits shared by its keys" if new.shared_limits else "limits per key")
    if old.inference_objective != new.inference_objective:
        said.append(
            f"inference objective {_show(old.inference_objective)} → "
            f"{_show(new.inference_objective)}"
        )
    if old.tenant_class != new.tenant_class:
        said.append(f"class {_show(old.tenant_class)} → {_show(new.tenant_class)}")
    return said


def _tenants(old: Policy, new: Policy) -> Iterable[str]:
    before, after = old.tenants.listed, new.tenants.listed
    for name in sorted(after.keys() - before.keys()):
        suspended = " (suspended)" if after[name].suspended else ""
        yield f"Tenant `{name}` added{suspended}."
    for name in sorted(before.keys() - after.keys()):
        yield f"Tenant `{name}` removed."
    for name in sorted(before.keys() & after.keys()):
        said = _tenant_changes(before[name], after[name])
        if said:
            yield f"Tenant `{name}`: {'; '.join(said)}."
    if old.tenants.default != new.tenants.default:
        if old.tenants.default is None or new.tenants.default is None:
            yield (
                f"Unlisted tenants: default entry {'added' if new.tenants.default else 'removed'}."
            )
        else:
            said = _tenant_changes(old.tenants.default, new.tenants.default)
            yield f"Unlisted tenants (default): {'; '.join(said)}."
    if old.tenants.prices != new.tenants.prices:
        yield f"Spend prices: {old.tenants.prices} → {new.tenants.prices}."


def _by_tenant(keys: Iterable[ApiKey]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for key in keys:
        grouped.setdefault(key.tenant, []).append(key.key_id)
    return grouped


def _count(ids: list[str], shown: int = 5) -> str:
    ids = sorted(ids)
    listed = ", ".join(f"`{i}`" for i in ids[:shown])
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return f"{len(ids)} key{'s' if len(ids) != 1 else ''} ({listed}{more})"


def _keys(old: Policy, new: Policy) -> Iterable[str]:
    before, after = old.keys, new.keys
    added = _by_tenant(after[k] for k in after.keys() - before.keys())
    removed = _by_tenant(before[k] for k in before.keys() - after.keys())
    for tenant in sorted(added):
        yield f"Tenant `{tenant}`: {_count(added[tenant])} added."
    for tenant in sorted(removed):
        yield f"Tenant `{tenant}`: {_count(removed[tenant])} removed."
    # Keys whose settings changed, grouped by tenant and change: a tier's or tenant's new
    # limit reaches each of its keys, and ten thousand keys make one sentence, not 10,000.
    changed: dict[tuple[str, str], list[str]] = {}
    for sha in before.keys() & after.keys():
        was, now = before[sha], after[sha]
        said = _limits_changes(was.limits, now.limits)
        if was.tenant != now.tenant:
            said.insert(0, f"tenant `{was.tenant}` → `{now.tenant}`")
        if was.tier != now.tier:
            said.insert(0, f"tier {was.tier} → {now.tier}")
        if said:
            changed.setdefault((now.tenant, "; ".join(said)), []).append(was.key_id)
    for (tenant, said_text), ids in sorted(changed.items()):
        yield f"Tenant `{tenant}`: {_count(ids)}: {said_text}."


def _pools_and_routing(old: Policy, new: Policy) -> Iterable[str]:
    for name in sorted(new.pools.keys() - old.pools.keys()):
        yield f"Pool `{name}` added."
    for name in sorted(old.pools.keys() - new.pools.keys()):
        yield f"Pool `{name}` removed."
    for name in sorted(old.pools.keys() & new.pools.keys()):
        said = _fields(old.pools[name], new.pools[name], "")
        if said:
            yield f"Pool `{name}`: {'; '.join(f'{path} {change}' for path, change in said)}."
    for what in ("default_pool", "fallback_pool"):
        before, after = getattr(old, what), getattr(new, what)
        if before != after:
            yield f"Routing: {what.replace('_', ' ')} `{before}` → `{after}`."
    if old.route_rules != new.route_rules:
        yield f"Routing rules: {_rules(old)} → {_rules(new)}."


def _rules(policy: Policy) -> str:
    shown = [
        f"{r.min_context_tokens}{'+' if r.max_context_tokens is None else ''}"
        f"{'' if r.max_context_tokens is None else f' to {r.max_context_tokens}'} tokens "
        f"to `{r.pool}`"
        for r in policy.route_rules
    ]
    return "[" + ", ".join(shown) + "]" if shown else "none"


def _fields(old: object, new: object, prefix: str) -> list[tuple[str, str]]:
    """(path, `a → b`) for every differing leaf of two values of one dataclass type."""
    if old == new:
        return []
    if dataclasses.is_dataclass(old) and type(old) is type(new):
        said: list[tuple[str, str]] = []
        for f in dataclasses.fields(old):
            said += _fields(getattr(old, f.name), getattr(new, f.name), f"{prefix}{f.name}.")
        return said
    path = prefix.rstrip(".")
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return [
            (f"{path}[{_key(k)}]", f"{_show(old.get(k))} → {_show(new.get(k))}")
            for k in sorted({*old, *new}, key=_key)
            if old.get(k) != new.get(k)
        ]
    return [(path, f"{_show(old)} → {_show(new)}")]


def _key(key: object) -> str:
    """A mapping key as the policy writes it: `critical/default` for (tier, "*")."""
    if isinstance(key, tuple):
        return "/".join("default" if part == "*" else str(part) for part in key)
    return str(key)


def policy_changes(old: Policy, new: Policy) -> list[str]:
    """Every difference between two policies as a sentence; empty: the same settings."""
    said = [*_keys(old, new), *_tenants(old, new)]
    for tier in sorted({*old.tier_limits, *new.tier_limits}):
        changes = _limits_changes(
            old.tier_limits.get(tier, Limits()), new.tier_limits.get(tier, Limits())
        )
        if changes:
            said.append(f"Tier `{tier}` limits: {'; '.join(changes)}.")
    said += _pools_and_routing(old, new)
    for f in dataclasses.fields(Policy):
        if f.name in _SPECIAL or f.name in _NOT_SETTINGS:
            continue
        leaves = _fields(getattr(old, f.name), getattr(new, f.name), f"{f.name}.")
        said += [f"`{path}` {change}." for path, change in leaves]
    return said
