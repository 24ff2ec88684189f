"""Spend budgets per tenant: what a request costs, the calendar windows, the arithmetic.

What lives here: pure values and functions, no I/O, no clock (the caller passes the time):
`TokenUsage` and what it costs at a price per token kind, the UTC calendar windows a
budget counts in (a day from 00:00 UTC, a month from the 1st), and the ledger of one
tenant's windows — `reserve` and `settle` — that the in-process store applies directly and
the Redis store runs in Lua (budget/lua/spend_*.lua); one suite holds both to it.

The rule: a request is admitted while what its tenant has spent and holds in reservations
stays under every window's limit; it then reserves its largest cost (prompt at the prompt
price, every completion's max_tokens at the higher of the completion and reasoning
prices) and settles on its real usage. So the last request admitted may take the total
past the limit, by at most its own cost (a stream is never cut mid-way), and the next is
refused until the window ends. A reservation never settled expires after its ttl and its
charge stays spent (the work may have been done).

A check that did not answer in time (a slow or away store) leaves the request's reservation
unknown: it may still land later (the command was sent) or never. Such a request is settled
`unverified` (`settle_unverified`): its reservation replaced by what it spent when it
landed, else what it spent charged outright; either way a marker of the settlement stays
for `ttl_s`, so that a reservation landing after it holds nothing and a retried settlement
changes nothing. A request refused because its check did not answer is settled so too,
with nothing spent.
"""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DAY_S = 86400
# Warnings: the shares of a window's limit that each raise one (a header, a metric).
WARNING_SHARES = (0.8, 1.0)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """A request's tokens by kind, as vLLM reports them: `cached_prompt` is part of
    `prompt` (usage.prompt_tokens_details.cached_tokens), `reasoning` part of `completion`
    (usage.completion_tokens_details.reasoning_tokens)."""

    prompt: int
    completion: int
    cached_prompt: int = 0
    reasoning: int = 0

    def cost(self, per_token: Mapping[str, float]) -> float:
        cached = min(self.cached_prompt, self.prompt)
        reasoning = min(self.reasoning, self.completion)
        return (
            (self.prompt - cached) * per_token["prompt"]
            + cached * per_token["cached_prompt"]
            + (self.completion - reasoning) * per_token["completion"]
            + reasoning * per_token["reasoning"]
        )


def reserved_cost(prompt: int, completion_limit: int, per_token: Mapping[str, float]) -> float:
    """The most a request can cost: its prompt uncached, and every token it may generate at
    the dearer of completion and reasoning (which it will be is known only at the end)."""
    dearest = max(per_token["completion"], per_token["reasoning"])
    return prompt * per_token["prompt"] + completion_limit * dearest


@dataclass(frozen=True, slots=True)
class SpendWindow:
    """One calendar window of one budget: `name` day or month, `id` e.g. 'month:2026-12'
    (what the store keys it by), its limit, and when it ends (unix seconds, UTC)."""

    name: str
    id: str
    limit: float
    ends_s: float


def window(name: str, limit: float, now_s: float) -> SpendWindow:
    """The window `name` ('day' or 'month') that `now_s` falls in."""
    now = dt.datetime.fromtimestamp(now_s, dt.UTC)
    if name == "day":
        start = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
        return SpendWindow(name, f"day:{start:%Y-%m-%d}", limit, start.timestamp() + DAY_S)
    if name == "month":
        days = calendar.monthrange(now.year, now.month)[1]
        start = dt.datetime(now.year, now.month, 1, tzinfo=dt.UTC)
        return SpendWindow(name, f"month:{start:%Y-%m}", limit, start.timestamp() + days * DAY_S)
    raise ValueError(f"no spend window named {name!r}")


def windows(limits: Mapping[str, float], now_s: float) -> tuple[SpendWindow, ...]:
    return tuple(window(name, limit, now_s) for name, limit in limits.items())


@dataclass(frozen=True, slots=True)
class SpendHold:
    """What a request reserved against its tenant's spend budget, carried in its decision
    so that it is settled in the windows and at the prices it was reserved under (a
    reservation made at 23:59 settles in that day, whatever the policy says by then)."""

    tenant: str
    spans: tuple[SpendWindow, ...]
    per_token: Mapping[str, float]
    amount: float  # what it reserved
    # False: its check went unanswered, so its reservation is unknown (it may land later, or
    # never): it is settled with `settle_unverified`.
    verified: bool = True

    @property
    def window_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.spans)


@dataclass(frozen=True, slots=True)
class SpendVerdict:
    admitted: bool
    # window id -> spent plus held, after this request's reservation when admitted
    used: Mapping[str, float]
    refused: SpendWindow | None = None  # the window whose limit refused (the latest ending)


@dataclass(slots=True)
class WindowState:
    spent: float = 0.0
    # reservation id -> (amount, expiry in unix seconds)
    reservations: dict[str, tuple[float, float]] = field(default_factory=dict)
    # reservation id -> expiry: settled unverified (a late reservation of it holds nothing)
    settled: dict[str, float] = field(default_factory=dict)

    def expire(self, now_s: float) -> None:
        """Reservations past their expiry: their charge stays spent. Settlement markers
        past theirs are forgotten."""
        for rid in [r for r, (_, expires_s) in self.reservations.items() if expires_s <= now_s]:
            self.spent += self.reservations.pop(rid)[0]
        for rid in [r for r, expires_s in self.settled.items() if expires_s <= now_s]:
            del self.settled[rid]

    @property
    def used(self) -> float:
        return self.spent + sum(amount for amount, _ in self.reservations.values())


def reserve(
    states: Mapping[str, WindowState],
    spans: Sequence[SpendWindow],
    amount: float,
    reservation_id: str,
    now_s: float,
    ttl_s: float,
) -> SpendVerdict:
    """Admit while every window's spent + held stays under its limit, holding `amount` in
    each; else refuse, naming the window that reopens last."""
    for span in spans:
        states[span.id].expire(now_s)
    if any(reservation_id in states[s.id].settled for s in spans):
        # Settled while its check went unanswered: landing now, it must hold nothing.
        return SpendVerdict(False, {s.id: states[s.id].used for s in spans})
    full = [s for s in spans if states[s.id].used >= s.limit]
    if full:
        used = {s.id: states[s.id].used for s in spans}
        return SpendVerdict(False, used, max(full, key=lambda s: s.ends_s))
    for span in spans:
        states[span.id].reservations[reservation_id] = (amount, now_s + ttl_s)
    return SpendVerdict(True, {s.id: states[s.id].used for s in spans})


def settle(
    states: Mapping[str, WindowState], reservation_id: str, actual: float | None
) -> dict[str, float] | None:
    """Replace the reservation with what was spent (None: refund it all), in every window
    that holds it; what each holds then, or None when none held it (settled, expired)."""
    found = False
    for state in states.values():
        held = state.reservations.pop(reservation_id, None)
        if held is not None:
            found = True
            state.spent += actual or 0.0
    return {wid: state.used for wid, state in states.items()} if found else None


def settle_unverified(
    states: Mapping[str, WindowState],
    reservation_id: str,
    actual: float | None,
    now_s: float,
    ttl_s: float,
) -> dict[str, float] | None:
    """Settle a request whose reservation is unknown (its check went unanswered): the
    reservation, where it landed, replaced by `actual`; where it did not, `actual` charged
    outright (None: nothing). A marker stays `ttl_s` so that the reservation landing after
    this holds nothing and this settlement retried changes nothing. What each window holds
    then, or None when it was settled already."""
    for state in states.values():
        state.expire(now_s)
    if any(reservation_id in state.settled for state in states.values()):
        return None
    for state in states.values():
        state.reservations.pop(reservation_id, None)
        state.spent += actual or 0.0
        state.settled[reservation_id] = now_s + ttl_s
    return {wid: state.used for wid, state in states.items()}
