"""What each breaker level does to one request: a table and a lookup. No I/O.

| level | critical            | standard                        | sheddable                    |
| ----- | ------------------- | ------------------------------- | ---------------------------- |
| L0    | admit               | admit                           | admit                        |
| L1    | admit               | admit                           | refuse if context > 8k       |
| L2    | admit               | refuse if context > 8k (capped) | refuse                       |
| L3    | reroute to fallback | refuse                          | refuse                       |

Memory back-pressure follows from the order: long low-priority requests go first, short
and critical ones last. Half-open probing lets `probe_fraction` of what a level would
refuse through, so recovery is measured on real traffic without a thundering herd.
Budgets shrink with the level: `budget_multiplier` scales a key's limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from breaker.levels import BreakerLevel
from policy.domain import Tier

LONG_CONTEXT_TOKENS = 8192  # the cap standard requests get at L2


class Action(Enum):
    ADMIT = "admit"
    REFUSE = "refuse"
    REROUTE = "reroute"  # to the fallback pool, with the fallback model


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reason: str  # metric label: ok, long_context_shed, tier_shed, context_capped, fallback


def shed(level: BreakerLevel, tier: Tier, context_tokens: int) -> Verdict:
    long_context = context_tokens > LONG_CONTEXT_TOKENS
    if level is BreakerLevel.L0:
        return Verdict(Action.ADMIT, "ok")
    if tier is Tier.CRITICAL:
        if level is BreakerLevel.L3:
            return Verdict(Action.REROUTE, "fallback")
        return Verdict(Action.ADMIT, "ok")
    if tier is Tier.STANDARD:
        if level is BreakerLevel.L3:
            return Verdict(Action.REFUSE, "tier_shed")
        if level is BreakerLevel.L2 and long_context:
            return Verdict(Action.REFUSE, "context_capped")
        return Verdict(Action.ADMIT, "ok")
    # sheddable
    if level is BreakerLevel.L1:
        return (
            Verdict(Action.REFUSE, "long_context_shed")
            if long_context
            else Verdict(Action.ADMIT, "ok")
        )
    return Verdict(Action.REFUSE, "tier_shed")


# Budget multipliers per level and tier: sheddable shrinks first, standard next.
_MULTIPLIERS: dict[BreakerLevel, dict[Tier, float]] = {
    BreakerLevel.L0: {Tier.CRITICAL: 1.0, Tier.STANDARD: 1.0, Tier.SHEDDABLE: 1.0},
    BreakerLevel.L1: {Tier.CRITICAL: 1.0, Tier.STANDARD: 1.0, Tier.SHEDDABLE: 0.5},
    BreakerLevel.L2: {Tier.CRITICAL: 1.0, Tier.STANDARD: 0.75, Tier.SHEDDABLE: 0.25},
    BreakerLevel.L3: {Tier.CRITICAL: 1.0, Tier.STANDARD: 0.5, Tier.SHEDDABLE: 0.1},
}


def budget_multiplier(level: BreakerLevel, tier: Tier) -> float:
    return _MULTIPLIERS[level][tier]
