"""Per-key dynamic budgets: consumption in, a tokens-per-minute ceiling per key out.

What lives here: `KeyQuotas`, which collects each key's settled weighted tokens per
controller interval and keeps a `budget.quotas.KeyBudget` per key whose policy has a
tokens-per-minute limit. A key's dynamic ceiling = P95 of its recent per-interval
consumption (or its Holt-Winters demand forecast, when higher) x the safety factor, scaled
to a minute, never above the policy limit and never below `floor_share` of it (an idle key
must not be frozen out by its own quiet history).
Enforced only when the policy says so (`breaker.controller_key_budgets`); otherwise it is
computed and shown (admin API, metrics), so an operator can watch it before turning it on.
"""

from __future__ import annotations

from collections.abc import Iterable

from budget.quotas import Adjustment, KeyBudget
from policy.domain import ApiKey


class KeyQuotas:
    def __init__(self, interval_s: float, floor_share: float = 0.1) -> None:
        self.interval_s = interval_s
        self.floor_share = floor_share
        self._consumed: dict[str, float] = {}
        self._budgets: dict[str, KeyBudget] = {}

    def observe(self, budget_id: str, weighted_tokens: float) -> None:
        """Tokens settled against a budget (`ApiKey.budget_id`: a key's, or its tenant's
        when the tenant shares its limits among its keys)."""
        self._consumed[budget_id] = self._consumed.get(budget_id, 0.0) + weighted_tokens

    def step(self, keys: Iterable[ApiKey], memory_usage: float | None) -> list[Adjustment]:
        """One controller interval for every key with a tokens-per-minute limit; the budgets
        of keys no longer given are dropped (`retain`)."""
        stepped: set[str] = set()
        adjustments = self.step_keys(keys, self.take_consumed(), memory_usage, stepped)
        self.retain(stepped)
        return adjustments

    def take_consumed(self) -> dict[str, float]:
        """The interval's consumption per key, handed over once: what `step_keys` reads
        when one interval is stepped in slices (ten thousand keys take ~100 ms)."""
        consumed, self._consumed = self._consumed, {}
        return consumed

    def step_keys(
        self,
        keys: Iterable[ApiKey],
        consumed: dict[str, float],
        memory_usage: float | None,
        stepped: set[str] | None = None,
    ) -> list[Adjustment]:
        """One controller interval for these keys' budgets, each once: `stepped` holds the
        budgets already stepped this interval (the keys of a tenant that shares its limits
        are one budget; an interval stepped in slices passes the same set to each)."""
        adjustments: list[Adjustment] = []
        per_interval = self.interval_s / 60.0
        stepped = set() if stepped is None else stepped
        for key in keys:
            limit = key.limits.tokens_per_minute
            if limit is None or key.budget_id in stepped:
                continue
            stepped.add(key.budget_id)
            budget = self._budgets.get(key.budget_id)
            if budget is None:
                budget = self._budgets[key.budget_id] = KeyBudget(hard_limit=limit * per_interval)
            budget.hard_limit = limit * per_interval  # a reloaded policy applies at once
            spent = consumed.get(key.budget_id, 0.0)
            adjustments += budget.step(spent, memory_usage, key.budget_id)
        return adjustments

    def retain(self, budget_ids: set[str]) -> None:
        """Only these budgets kept (the interval's stepped ones): a key removed from the
        policy, or whose limit was, takes its history with it instead of staying for the
        process's life (one a key ever seen: keys rotated daily grew without end)."""
        for budget_id in [b for b in self._budgets if b not in budget_ids]:
            del self._budgets[budget_id]

    def budget_count(self) -> int:
        return len(self._budgets)

    def tokens_per_minute(self, key: ApiKey) -> float | None:
        """The key's dynamic ceiling per minute, or None without a policy limit / history."""
        budget = self._budgets.get(key.budget_id)
        limit = key.limits.tokens_per_minute
        if budget is None or limit is None or not budget.history:
            return None
        per_minute = budget.budget * 60.0 / self.interval_s
        return min(float(limit), max(self.floor_share * limit, per_minute))

    def demand(self, key: ApiKey) -> tuple[float, float | None] | None:
        """The key's last interval of weighted tokens, and its forecast, per minute."""
        budget = self._budgets.get(key.budget_id)
        if budget is None or not budget.history:
            return None
        per_minute = 60.0 / self.interval_s
        forecast = budget.forecast()
        return (
            budget.history[-1] * per_minute,
            None if forecast is None else forecast * per_minute,
        )

    def safety_factor(self, key: ApiKey) -> float | None:
        budget = self._budgets.get(key.budget_id)
        return None if budget is None else budget.safety

    def lowest_safety_factor(self) -> float | None:
        factors = [b.safety for b in self._budgets.values()]
        return min(factors) if factors else None
