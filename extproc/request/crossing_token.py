"""The crossing token: what a region's sidecar puts on a request it sends to another region,
and what the receiving sidecar verifies before it skips charging the request.

What lives here: `mint` and `verify` (pure: HMAC-SHA256 with the regions' shared secret,
the time passed in), `Crossed` (a verified token) and `Rejected` (why one was not), and
`CrossingDesk`, the request path's use of them with the clock and the events wired in: the
origin's `departure` (the token header of a decision re-routed to a peer), the receiver's
`arrival` (what a request's headers say of where it comes from).

The token is `origin.request_id.expiry.signature`: the origin region (a region name: no
dots), the origin's request id, the expiry in whole Unix seconds (regions compare wall
clocks: they must agree within a few seconds, as NTP keeps them), and the hex HMAC-SHA256
of the three joined by dots. A token that does not verify — malformed, forged (a wrong
signature, compared in constant time), expired, or from a region the policy does not list
— is ignored: the request is the receiving region's own (charged there) and never crosses
again. Within its expiry a captured token could be replayed with another body: the link
between regions is the operator's private network (docs/operators/crossing.md), and the
expiry (`crossing.token_ttl_s`, 30 s) bounds it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from admission.crossing import crossed_to
from admission.decision import RoutingDecision
from extproc.request.contract import CROSSED_HEADER
from policy._regions import RegionsConfig

# The shared secret's least length: as long as the HMAC's output.
MIN_SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class Crossed:
    origin: str
    request_id: str
    expires_s: int


class Rejected(StrEnum):
    MALFORMED = "malformed"
    FORGED = "forged"
    EXPIRED = "expired"
    UNKNOWN_ORIGIN = "unknown_origin"


def _signature(secret: bytes, signed: str) -> str:
    return hmac.new(secret, signed.encode(), hashlib.sha256).hexdigest()


def mint(secret: bytes, origin: str, request_id: str, expires_s: float) -> str:
    signed = f"{origin}.{request_id}.{math.ceil(expires_s)}"
    return f"{signed}.{_signature(secret, signed)}"


def verify(
    secret: bytes, token: str, now_s: float, origins: Mapping[str, object]
) -> Crossed | Rejected:
    """The token's origin and request id, or why it is not to be trusted. `origins`: the
    regions it may come from."""
    origin, _, rest = token.partition(".")
    parts = rest.rsplit(".", 2)
    if len(parts) != 3 or not origin or not parts[1].isdigit():
        return Rejected.MALFORMED
    request_id, expiry, signature = parts
    expected = _signature(secret, f"{origin}.{request_id}.{expiry}")
    if not hmac.compare_digest(expected, signature):
        return Rejected.FORGED
    if int(expiry) < now_s:
        return Rejected.EXPIRED
    if origin not in origins:
        return Rejected.UNKNOWN_ORIGIN
    return Crossed(origin, request_id, int(expiry))


class CrossingCounts(Protocol):
    """What the desk reports (extproc.service.crossing_metrics)."""

    def crossed(self, peer: str, tier: str) -> None: ...
    def token_rejected(self, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Arrival:
    """Where a request comes from: `crossed_from` the verified origin (None: this region's
    own); `may_cross` False when it came with any crossing token."""

    crossed_from: str | None = None
    may_cross: bool = True


HOME = Arrival()


class CrossingDesk:
    def __init__(
        self,
        secret: bytes,
        wall_clock: Callable[[], float],
        counts: CrossingCounts,
        this: str | None = None,
    ) -> None:
        """`this`: `slogate serve --region` (None: the policy's `regions.this`)."""
        self._this = this
        self._secret = secret
        self._clock = wall_clock
        self._counts = counts

    def arrival(self, headers: Mapping[str, str], regions: RegionsConfig) -> Arrival:
        token = headers.get(CROSSED_HEADER)
        if token is None:
            return HOME
        this = self._this or regions.this
        peers = {name: region for name, region in regions.regions.items() if name != this}
        verdict = verify(self._secret, token, self._clock(), peers)
        if isinstance(verdict, Rejected):
            self._counts.token_rejected(verdict.value)
            return Arrival(None, may_cross=False)
        return Arrival(verdict.origin, may_cross=False)

    def departure(
        self, decision: RoutingDecision, request_id: str, regions: RegionsConfig
    ) -> dict[str, str]:
        """The headers a request re-routed to a peer carries there; none for a local one."""
        peer = crossed_to(decision.pool)
        this = self._this or regions.this
        if peer is None or this is None:
            return {}
        self._counts.crossed(peer, decision.caller.tier.value)
        expires_s = self._clock() + regions.crossing.token_ttl_s
        return {CROSSED_HEADER: mint(self._secret, this, request_id, expires_s)}
