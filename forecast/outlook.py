"""What the quota controller asks of a forecast: a tenant's demand ahead, against now.

An `Outlook` answers, for one tenant, how its demand at a future time compares with its
demand now, and says where that comes from: the fitted seasonal forecast ("forecast") or
an event the operator declared ("calendar:<event name>"). The controller raises budgets a
lead ahead of a ramp from these answers, and names the reason in every move it makes, so
every producer must give one. Times are Unix seconds (the caller's clock: a virtual one in
the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Expected:
    """A tenant's expected demand at `at_s`, as a multiple of its demand at `now_s`."""

    tenant: str
    at_s: float
    multiple: float  # expected demand at at_s / demand at now_s (1.0: no change)
    # The same in weighted tokens per minute (the budgets' unit), where the source knows
    # absolute demand (a fitted forecast does; a calendar event's multiple alone does not).
    tokens_per_minute: float | None
    reason: str  # "forecast" or "calendar:<event name>"


class Outlook(Protocol):
    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        """None: nothing known about this tenant at that time (the controller reacts only)."""
        ...
