"""The board's levels on a pool whose cache KV admission keeps full by design."""

from __future__ import annotations

from breaker.board import BreakerBoard
from breaker.latency import ResponseWindows
from breaker.levels import BreakerLevel
from policy.loader import parse_policy
from policy.schema import Policy
from tests.support.clock import VirtualClock


def policy(kv_capacity_tokens: int | None) -> Policy:
    default: dict[str, object] = {"endpoints": ["127.0.0.1:1"]}
    if kv_capacity_tokens is not None:
        default["kv_capacity_tokens"] = kv_capacity_tokens
    return parse_policy(
        {
            "pools": {
                "default": default,
                "long": {"endpoints": ["127.0.0.1:2"]},
                "fallback": {"endpoints": ["127.0.0.1:3"]},
            },
            "breaker": {"thresholds": {"enter_hold_s": [5, 5, 5]}},
        }
    )


def level_after_a_full_cache(spec: Policy, usage: float) -> BreakerLevel:
    clock = VirtualClock(1000.0)
    board = BreakerBoard(
        lambda: spec, ResponseWindows(clock), lambda pool: usage, lambda: None, clock
    )
    for _ in range(10):
        board.evaluate()
        clock.now_s += 1.0
    return board.level("default")


def test_a_cache_at_the_tiers_shares_is_no_overload_where_kv_admission_holds_it() -> None:
    """Without KV admission, 0.95 of the cache for 5 s is L1 (sheddable budgets halved).
    With it, the ledger holds every tier to its share (and lends the reserve: budget.
    lending), so a full cache is the design; the board still reads and shows it."""
    assert level_after_a_full_cache(policy(None), 0.95) is BreakerLevel.L1
    admitted = policy(300_000)
    assert level_after_a_full_cache(admitted, 0.95) is BreakerLevel.L0
    clock = VirtualClock(1000.0)
    board = BreakerBoard(
        lambda: admitted, ResponseWindows(clock), lambda pool: 0.95, lambda: None, clock
    )
    board.evaluate()
    assert board.readings["default"].signals.kv_cache_usage == 0.95
