"""The KV reserve's loan (budget.lending): pure, every input injected."""

from __future__ import annotations

import pytest

from budget.lending import KvLending

CALM, BAND, HOT = 0.3, 0.9, 1.2  # load scores: under grow_below, in the dead band, over the line


def loan_after(lending: KvLending, steps: int, waiting: float = 0.0, score: float = CALM) -> float:
    for _ in range(steps):
        lending.step("default", waiting, score, room=0.1)
    return lending.lent.get("default", 0.0)


def test_the_loan_grows_only_after_confirmed_calm_and_never_past_the_room() -> None:
    lending = KvLending(grow_step=0.02, confirm=3)
    assert loan_after(lending, 2) == 0.0  # two calm intervals: not yet trusted
    assert loan_after(lending, 1) == pytest.approx(0.02)
    assert loan_after(lending, 3) == pytest.approx(0.08)
    assert loan_after(lending, 20) == pytest.approx(0.1)  # the ceiling less the share
    assert lending.share("default", base=0.85, most=0.95) == pytest.approx(0.95)
    assert lending.share("default", base=0.85, most=0.90) == pytest.approx(0.90)
    assert lending.share("other", base=0.85, most=0.95) == 0.85  # nothing lent there


def test_a_tier_above_kept_waiting_calls_part_of_the_loan_back() -> None:
    lending = KvLending(patience=0.5, call_back=0.5)
    loan_after(lending, 30)
    assert loan_after(lending, 1, waiting=0.4) == pytest.approx(0.1)  # a short wait: kept
    moved = lending.step("default", 0.6, CALM, room=0.1)
    assert moved is not None and moved.what == "kv_lend:sheddable:default"
    assert (moved.before, moved.after) == (pytest.approx(0.1), pytest.approx(0.05))
    assert moved.inputs["waited"] == 0.6
    assert loan_after(lending, 1, waiting=0.6) == pytest.approx(0.025)
    assert loan_after(lending, 1, waiting=0.6) == 0.0  # under one grow step: all of it


def test_a_wait_noted_between_intervals_counts_once() -> None:
    """The KV step notes a request that waited and was admitted before the interval ended:
    nobody waits at the step, yet the loan is called back -- once."""
    lending = KvLending(patience=0.5, call_back=0.5)
    loan_after(lending, 30)
    lending.note_wait("default", 0.3)
    lending.note_wait("default", 0.8)
    lending.note_wait("long", 0.9)  # another pool's wait is that pool's
    assert loan_after(lending, 1) == pytest.approx(0.05)
    assert loan_after(lending, 1) == pytest.approx(0.05)  # calm again: counting anew


def test_overload_calls_back_the_dead_band_holds_and_no_signal_holds() -> None:
    lending = KvLending(call_back=0.5, confirm=3)
    loan_after(lending, 30)
    assert loan_after(lending, 1, score=HOT) == pytest.approx(0.05)
    assert loan_after(lending, 10, score=BAND) == pytest.approx(0.05)
    assert lending.step("default", 0.0, None, room=0.1) is None
    # The dead band reset the calm: three calm intervals again before it grows.
    assert loan_after(lending, 2) == pytest.approx(0.05)
    assert loan_after(lending, 1) == pytest.approx(0.07)


def test_a_lowered_ceiling_takes_effect_and_no_room_lends_nothing() -> None:
    lending = KvLending()
    loan_after(lending, 30)
    lending.step("default", 0.0, BAND, room=0.04)  # a reloaded policy: a lower ceiling
    assert lending.lent["default"] == pytest.approx(0.04)
    lending.step("default", 0.0, CALM, room=0.0)
    assert lending.lent["default"] == 0.0


def test_under_steady_inputs_the_loan_settles_instead_of_oscillating() -> None:
    """A calm that lasts: the loan climbs to the ceiling and then nothing moves. Waits that
    keep coming: it shrinks to nothing and stays there."""
    lending = KvLending()
    moves = [lending.step("default", 0.0, CALM, room=0.1) for _ in range(60)]
    changed = [i for i, m in enumerate(moves) if m is not None]
    assert changed == sorted(changed) and all(moves[i].after > moves[i].before for i in changed)
    assert all(m is None for m in moves[changed[-1] + 1 :]) and changed[-1] < 20
    backs = [lending.step("default", 1.0, CALM, room=0.1) for _ in range(60)]
    assert all(m is None or m.after < m.before for m in backs)
    assert lending.lent["default"] == 0.0


def test_engines_fuller_than_the_ledger_counts_call_the_loan_back() -> None:
    lending = KvLending(call_back=0.5)
    loan_after(lending, 30)
    moved = lending.step("default", 0.0, CALM, room=0.1, engine_over=True)
    assert moved is not None and moved.after == pytest.approx(0.05)
    assert moved.inputs["engine_over"] == 1.0
