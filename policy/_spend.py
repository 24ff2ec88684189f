"""The spend parts of the `tenants:` section: a tenant's `spend:` and the `prices:`.

What lives here: the reader of an entry's `spend: {unit, per_day, per_month}` (merged
field by field like `limits`: a tenant's own fields, then its class's, then the
defaults'; an entry that changes the unit replaces what it builds on), the reader of
`tenants.prices` (what each token kind costs) and the check that every budget in usd has
prices in usd. Every error names the tenant and the field
(`tenants.list.acme.spend.per_month: must be > 0, got 0`).

```yaml
tenants:
  prices:
    tokens: {prompt: 1.0, cached_prompt: 0.1, completion: 4.0, reasoning: 4.0}
    usd_per_million: {prompt: 0.15, cached_prompt: 0.075, completion: 0.60, reasoning: 0.60}
  list:
    acme: {spend: {per_day: 5000000, per_month: 100000000}}    # token-equivalents
    globex: {spend: {unit: usd, per_month: 2500.00}}
```
"""

from __future__ import annotations

from collections.abc import Mapping

from policy._reader import PolicyError, Section, expect, one_of, positive
from policy.domain import TOKEN_KINDS, SpendLimits, SpendPrices, SpendUnit, Tenant

# A kind a price list leaves out costs what its plain sibling costs.
_FALLBACK = {"cached_prompt": "prompt", "reasoning": "completion"}


def read_spend(raw: object, path: str) -> Mapping[str, object]:
    """The fields an entry's `spend:` sets (unit: a SpendUnit; per_*: floats > 0)."""
    if raw is None:
        return {}
    sec = Section(raw, path)
    fields: dict[str, object] = {}
    if sec.raw("unit") is not None:
        fields["unit"] = SpendUnit(one_of(sec, "unit", SpendUnit, SpendUnit.TOKENS))
    for name in ("per_day", "per_month"):
        value = sec.raw(name)
        if value is None:
            continue
        limit = expect(value, float, sec.child(name))
        positive(limit, sec.child(name))
        fields[name] = limit
    sec.close()
    return fields


def merged_spend(own: Mapping[str, object], base: Mapping[str, object]) -> Mapping[str, object]:
    """Field by field, own over base; but an entry that changes the unit replaces the
    budget it builds on (a class's limit in tokens is no limit in dollars)."""
    unit = SpendUnit.TOKENS
    if own.get("unit", base.get("unit", unit)) != base.get("unit", unit):
        return own
    return {**base, **own}


def spend_limits(fields: Mapping[str, object]) -> SpendLimits | None:
    """The merged fields as a budget; None when neither window is set."""
    if fields.get("per_day") is None and fields.get("per_month") is None:
        return None
    return SpendLimits(**fields)  # type: ignore[arg-type]


def _price_list(raw: object, path: str) -> dict[str, float]:
    sec = Section(raw, path)
    prices: dict[str, float] = {}
    for kind in TOKEN_KINDS:
        value = sec.raw(kind)
        if value is not None:
            price = expect(value, float, sec.child(kind))
            if price < 0:
                raise PolicyError(f"{sec.child(kind)}: must be >= 0, got {price}")
            prices[kind] = price
    sec.close()
    for kind in TOKEN_KINDS:
        if kind not in prices:
            sibling = _FALLBACK.get(kind)
            if sibling is None:
                raise PolicyError(f"{path}.{kind}: required field is missing")
            prices[kind] = prices[sibling]
    return prices


def read_prices(raw: object, path: str) -> SpendPrices:
    """`prices.tokens` (default: 1 each) and `prices.usd_per_million` (optional). A list
    must price prompt and completion; cached_prompt and reasoning default to those."""
    if raw is None:
        return SpendPrices()
    sec = Section(raw, path)
    tokens_raw = sec.raw("tokens")
    usd_raw = sec.raw("usd_per_million")
    prices = SpendPrices(
        tokens=SpendPrices().tokens
        if tokens_raw is None
        else _price_list(tokens_raw, sec.child("tokens")),
        usd_per_million=None
        if usd_raw is None
        else _price_list(usd_raw, sec.child("usd_per_million")),
    )
    sec.close()
    return prices


def check_units(tenants: Mapping[str, Tenant], prices: SpendPrices, path: str) -> None:
    """A budget in usd needs `prices.usd_per_million`."""
    if prices.usd_per_million is not None:
        return
    for where, tenant in tenants.items():
        if tenant.spend is not None and tenant.spend.unit is SpendUnit.USD:
            raise PolicyError(
                f"{where}.spend.unit: usd needs {path}.prices.usd_per_million (per token kind)"
            )
