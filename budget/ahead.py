"""Quotas ahead of time: budgets moved a lead before a forecast or declared ramp, given back after.

What may live here: `AheadPlanner`, stepped each controller interval with the outlook
(forecast.outlook: the seasonal fit, the business calendar, or both), the tenants' tiers
and each tenant's measured demand in that interval. No I/O and no clock: the caller says
the time and what it measured. It composes with the reactive controller (budget.quotas.
TierMultipliers) and never changes it: `multipliers` takes the reactive values and
returns what admission applies.

- A raise: when the outlook expects a tenant at `expect` x or more within the lead (or now,
  while a declared event runs), its tier's multiplier is held at its contract (1.0: the
  reactive controller may not cut it), its keys' dynamic ceilings are lifted to their
  policy limits, and headroom is reserved for it: the sheddable tier's multiplier capped at
  `squeeze` and its KV share at `reserve_kv_share` (sheddable first; a sheddable tenant
  ramping squeezes nobody). Moves: "raised by forecast" / "raised by calendar event X".
- Given back: a lead after the ramp came (the tenant's demand up at `rise` x its level at
  the raise, three intervals in a row), or a lead after the outlook last expected it
  (ahead, or now while a declared event runs), whichever is first: the ramping tenant's
  requests are in by then, and the reactive controller carries on ("given back"); not
  raised again until the outlook stops expecting that ramp.
- A wrong forecast is bounded: a raise whose tenant's demand has not risen to `rise` x
  within lead + grace of the raise expires ("given back: the ramp did not come") and is
  not raised again until the outlook stops expecting that ramp. So a ramp that never
  comes, or comes an hour late, costs at most lead + grace of sheddable work squeezed to
  `squeeze` per expected ramp (2 x lead + grace where noise in the measured demand passed
  for the ramp: it is given back a lead after that); the ramping and the critical tenants
  get no less than under the reaction, and after the expiry the controller is the reactive
  one alone.
- Lending (the night case): with `lend` > 1, while no raise holds, the fleet is quiet
  (load score under `QUIET_SCORE`) and every non-sheddable tenant has an expectation that
  it will not rise within the lead, the sheddable tier's multiplier is the reactive one x
  `lend` ("lent to batch: forecast idle"); it is taken back a lead before a ramp, or as
  soon as the fleet is no longer quiet ("given back"). A calendar alone knows nothing of
  the hours between its events, so it lends nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from budget.quotas import Adjustment
from forecast.calendar import outlook_for
from forecast.outlook import Expected, Outlook
from policy._ahead import AheadConfig
from policy.domain import ApiKey

SHEDDABLE = "sheddable"
QUIET_SCORE = 0.5  # the load score under which the fleet counts as quiet enough to lend
# Whether a ramp came: the mean of the last RECENT intervals' demand at `rise` x the mean of
# the BEFORE intervals before the raise, on CONFIRM intervals in a row (one noisy interval
# of a few requests must not pass for a ramp and keep a wrong raise alive).
RECENT = 5
BEFORE = 15
CONFIRM = 3


def reason_of(expected: Expected) -> str:
    """The move's words: "raised by forecast" or "raised by calendar event X"."""
    if expected.reason.startswith("calendar:"):
        return f"raised by calendar event {expected.reason.split(':', 1)[1]}"
    return f"raised by {expected.reason}"


def reason_label(reason: str) -> str:
    """A move's reason as a bounded label (a metric's, a table's): forecast, calendar (the
    event's name is in the log and `slogate status`), given_back, expired, lent."""
    if reason.startswith("raised by calendar"):
        return "calendar"
    if reason.startswith("raised by"):
        return "forecast"
    if reason.startswith("lent"):
        return "lent"
    return "expired" if "did not come" in reason else "given_back"


def tenant_tiers(keys: Iterable[ApiKey]) -> dict[str, str]:
    """Each tenant's tier, as the planner steps them: its first key's (the sidecar and the
    simulator alike; a tenant whose keys sit on several tiers is raised as its first)."""
    tiers: dict[str, str] = {}
    for key in keys:
        tiers.setdefault(key.tenant, key.tier.value)
    return tiers


@dataclass(slots=True)
class Raise:
    """A tenant's budget raised ahead of a ramp."""

    tenant: str
    tier: str
    source: str  # Expected.reason: "forecast" or "calendar:<event>"
    multiple: float
    since_s: float
    baseline: float | None  # its demand per interval when raised (None: none measured yet)
    expected_s: float  # when the outlook last expected the ramp
    came_s: float | None = None  # when its demand rose: the ramp came
    rising: int = 0  # intervals in a row its demand has been up

    @property
    def came(self) -> bool:
        return self.came_s is not None

    @property
    def reason(self) -> str:
        return reason_of(Expected(self.tenant, self.since_s, self.multiple, None, self.source))


@dataclass
class AheadPlanner:
    config: AheadConfig
    outlook: Outlook | None
    # The lead and the grace in the caller's seconds (the simulator plays a day in minutes).
    lead_s: float
    grace_s: float
    raises: dict[str, Raise] = field(default_factory=dict)
    # Expired raises: tenant -> the source whose ramp did not come, until it is no longer
    # expected (no second raise for the same wrong expectation).
    expired: dict[str, str] = field(default_factory=dict)
    lending: bool = False
    # Tenant -> the expectation already served (its raise given back or expired): no second
    # raise for it until the outlook stops expecting that ramp.
    _served: dict[str, str] = field(default_factory=dict)
    _demand: dict[str, deque[float]] = field(default_factory=dict)

    @classmethod
    def from_config(
        cls, config: AheadConfig, outlook: Outlook | None, time_scale: float = 1.0
    ) -> AheadPlanner:
        """`time_scale`: calendar seconds per caller second (1 in the sidecar)."""
        minute_s = 60.0 / time_scale
        return cls(config, outlook, config.lead_min * minute_s, config.grace_min * minute_s)

    def step(
        self,
        now_s: float,
        tiers: Mapping[str, str],
        measured: Mapping[str, float],
        score: float | None,
    ) -> list[Adjustment]:
        """One controller interval. `tiers`: tenant -> its tier; `measured`: tenant -> its
        demand in the interval (any unit, the same every interval); `score`: the fleet's
        load score (None: no signal, nothing is lent)."""
        for tenant in tiers:
            self._demand.setdefault(tenant, deque(maxlen=BEFORE)).append(measured.get(tenant, 0.0))
        moves: list[Adjustment] = []
        for tenant, tier in tiers.items():
            moves += self._step_tenant(now_s, tenant, tier)
        for tenant in [t for t in self.raises if t not in tiers]:  # left the policy
            moves.append(self._give_back(self.raises.pop(tenant), now_s, "given back"))
        moves += self._step_lending(now_s, tiers, score)
        return moves

    def _expected(self, tenant: str, now_s: float) -> Expected | None:
        """A ramp of `tenant` expected within the lead, or running now (a declared event)."""
        if self.outlook is None:
            return None
        for at_s in (now_s + self.lead_s, now_s):
            expected = self.outlook.expected(tenant, now_s, at_s)
            if expected is not None and expected.multiple >= self.config.expect:
                return expected
        return None

    def _recent(self, tenant: str) -> float:
        history = list(self._demand.get(tenant, ()))[-RECENT:]
        return sum(history) / len(history) if history else 0.0

    def _step_tenant(self, now_s: float, tenant: str, tier: str) -> list[Adjustment]:
        expected = self._expected(tenant, now_s)
        held = self.raises.get(tenant)
        if held is None:
            if expected is None:
                self.expired.pop(tenant, None)
                self._served.pop(tenant, None)
                return []
            if self._served.get(tenant) == expected.reason:
                return []
            # Before this interval's demand: the level the ramp is to rise from.
            history = list(self._demand.get(tenant, ()))[:-1]  # BEFORE - 1 intervals
            baseline = sum(history) / len(history) if history else None
            held = self.raises[tenant] = Raise(
                tenant, tier, expected.reason, expected.multiple, now_s, baseline, now_s
            )
            self.expired.pop(tenant, None)
            return [self._move(held, reason_of(expected), 1.0, expected.multiple, now_s)]
        if expected is not None:
            held.expected_s = now_s
        recent = self._recent(tenant)
        if held.baseline is None:  # raised on the first interval: measure from here
            held.baseline = recent
        elif held.came_s is None:
            up = recent > 0 and recent >= self.config.rise * held.baseline
            held.rising = held.rising + 1 if up else 0
            if held.rising >= CONFIRM:
                held.came_s = now_s
        if not held.came and now_s - held.since_s >= self.lead_s + self.grace_s:
            del self.raises[tenant]
            self.expired[tenant] = self._served[tenant] = held.source
            return [self._give_back(held, now_s, "given back: the ramp did not come")]
        over = now_s - held.expected_s >= self.lead_s
        if over or (held.came_s is not None and now_s - held.came_s >= self.lead_s):
            del self.raises[tenant]
            self._served[tenant] = held.source
            return [self._give_back(held, now_s, "given back")]
        return []

    def _step_lending(
        self, now_s: float, tiers: Mapping[str, str], score: float | None
    ) -> list[Adjustment]:
        lend = (
            self.config.lend > 1.0
            and self.outlook is not None
            and not self.raises
            and score is not None
            and score < QUIET_SCORE
            and all(self._flat(t, now_s) for t, tier in tiers.items() if tier != SHEDDABLE)
        )
        if lend == self.lending:
            return []
        self.lending = lend
        inputs = {"score": -1.0 if score is None else score, "at_s": now_s}
        if lend:
            return [
                Adjustment(
                    f"ahead:{SHEDDABLE}",
                    1.0,
                    self.config.lend,
                    inputs,
                    "lent to batch: forecast idle",
                )
            ]
        return [Adjustment(f"ahead:{SHEDDABLE}", self.config.lend, 1.0, inputs, "given back")]

    def _flat(self, tenant: str, now_s: float) -> bool:
        """Known not to rise within the lead (no knowledge is no promise)."""
        assert self.outlook is not None
        expected = self.outlook.expected(tenant, now_s, now_s + self.lead_s)
        return expected is not None and expected.multiple < self.config.expect

    def _move(
        self, held: Raise, reason: str, before: float, after: float, now_s: float
    ) -> Adjustment:
        baseline = -1.0 if held.baseline is None else held.baseline
        inputs = {"multiple": held.multiple, "baseline": baseline, "at_s": now_s}
        return Adjustment(f"ahead:{held.tenant}", before, after, inputs, reason)

    def _give_back(self, held: Raise, now_s: float, reason: str) -> Adjustment:
        return self._move(held, reason, held.multiple, 1.0, now_s)

    # What admission applies.

    def multipliers(self, reactive: Mapping[str, float]) -> dict[str, float]:
        """The tier multipliers admission applies: the reactive ones, with the raised tiers
        held at their contract and sheddable squeezed while a raise holds, or lent more
        while the forecast says the hours ahead are idle."""
        values = dict(reactive)
        if self.raises:
            raised = {r.tier for r in self.raises.values()}
            for tier in raised:
                values[tier] = max(values.get(tier, 1.0), 1.0)
            if SHEDDABLE not in raised:
                values[SHEDDABLE] = min(values.get(SHEDDABLE, 1.0), self.config.squeeze)
        elif self.lending:
            values[SHEDDABLE] = values.get(SHEDDABLE, 1.0) * self.config.lend
        return values

    def apply(
        self,
        reactive: Mapping[str, float],
        multipliers: dict[str, float],
        kv_caps: dict[str, float],
    ) -> None:
        """Write what admission reads, in place (the dicts the budget and KV steps hold)."""
        multipliers.clear()
        multipliers.update(self.multipliers(reactive))
        kv_caps.clear()
        kv_caps.update(self.kv_share_caps())

    def kv_share_caps(self) -> dict[str, float]:
        """Caps on the tiers' KV shares: headroom kept for the raised tenants."""
        if self.raises and SHEDDABLE not in {r.tier for r in self.raises.values()}:
            return {SHEDDABLE: self.config.reserve_kv_share}
        return {}

    def raised(self, tenant: str) -> bool:
        """Its keys' dynamic ceilings give way to their policy limits (budget.key_quotas)."""
        return tenant in self.raises

    def status(self) -> dict[str, object]:
        """What `slogate status` shows: each raise, the reservation, the lending."""
        return {
            "lead_s": self.lead_s,
            "grace_s": self.grace_s,
            "raised": {
                t: {
                    "reason": r.reason,
                    "multiple": r.multiple,
                    "since_s": r.since_s,
                    "ramp_came": r.came,
                }
                for t, r in sorted(self.raises.items())
            },
            "reserved": {
                "sheddable_multiplier_cap": self.config.squeeze if self.kv_share_caps() else None,
                "kv_share_caps": self.kv_share_caps(),
            },
            "lending": self.config.lend if self.lending else None,
            "expired": dict(sorted(self.expired.items())),
        }


class KeyCeilings(Protocol):
    def tokens_per_minute(self, key: ApiKey) -> float | None: ...


class AheadCeilings:
    """The per-key dynamic ceilings (budget.key_quotas) with a raised tenant's lifted: its
    keys get their policy limits (None: no dynamic cap) until the raise is given back."""

    def __init__(self, base: KeyCeilings, planner: Callable[[], AheadPlanner | None]) -> None:
        self._base = base
        self._planner = planner

    def tokens_per_minute(self, key: ApiKey) -> float | None:
        planner = self._planner()
        if planner is not None and planner.raised(key.tenant):
            return None
        return self._base.tokens_per_minute(key)


class AheadSeat:
    """Where the running sidecar keeps its planner: rebuilt when the policy's `ahead:` section
    changes (a reload starts it afresh: no raise outlives the calendar that declared it); a
    new forecast replaces only its outlook.
    `forecast`: the seasonal fit's outlook, set by whoever refits it (None until then: the
    calendar alone); `learned`: the multiples of its `learn: true` events."""

    def __init__(self, forecast: Outlook | None = None) -> None:
        self.forecast = forecast
        # The `learn: true` events' multiples (forecast.calendar.learn_multiples over the
        # traffic record), set by the forecast's refit (extproc.runtime.forecast_refit).
        self.learned: dict[str, float] = {}
        self._config: AheadConfig | None = None
        self._seen: tuple[Outlook | None, dict[str, float]] = (None, {})
        self.planner: AheadPlanner | None = None

    def current(self, config: AheadConfig | None) -> AheadPlanner | None:
        if config is None:
            self._config, self.planner = None, None
            return None
        seen = (self.forecast, dict(self.learned))
        if config != self._config or self.planner is None:  # a reload that changed it
            self._config, self._seen = config, seen
            outlook = outlook_for(config, self.forecast, learned=self.learned)
            self.planner = AheadPlanner.from_config(config, outlook)
        elif seen[0] is not self._seen[0] or seen[1] != self._seen[1]:
            self._seen = seen  # a refit: the raises held stay
            self.planner.outlook = outlook_for(config, self.forecast, learned=self.learned)
        return self.planner
