"""Crossing regions as Prometheus metrics (admission.crossing, extproc.request.crossing_token,
extproc.runtime.peer_probe).

What lives here: `CrossingMetrics`, on the sidecar's registry:
- `slogate_region_link_rtt_seconds{peer}`: the measured round trip to a peer region's
  ingress (EWMA of the probes); absent until the first answer, NaN while the peer does
  not answer (a request is never sent over a link that is not measured).
- `slogate_region_crossed_total{peer,tier}`: requests this region sent to a peer.
- `slogate_region_crossing_skipped_total{reason}`: requests of a saturated pool that did
  not cross: already_crossed, not_tolerant, no_peer_room, too_far.
- `slogate_region_crossing_tokens_rejected_total{reason}`: requests that came with a
  crossing token that did not verify (malformed, forged, expired, unknown_origin): charged
  here as this region's own, and never sent on.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from admission.crossing import Skip
from extproc.request.crossing_token import Rejected


class CrossingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.link_rtt = Gauge(
            "slogate_region_link_rtt_seconds",
            "The measured round trip to a peer region's ingress (EWMA of its probes; NaN "
            "while it does not answer)",
            ["peer"],
            registry=registry,
        )
        self.crossed_total = Counter(
            "slogate_region_crossed",
            "Requests this region sent to a peer region's pool (its own pool saturated)",
            ["peer", "tier"],
            registry=registry,
        )
        self.skipped = Counter(
            "slogate_region_crossing_skipped",
            "Requests of a saturated pool that did not cross, by why",
            ["reason"],
            registry=registry,
        )
        self.rejected = Counter(
            "slogate_region_crossing_tokens_rejected",
            "Requests that came with a crossing token that did not verify (charged here)",
            ["reason"],
            registry=registry,
        )
        for skip in Skip:
            self.skipped.labels(skip.value)
        for rejected in Rejected:
            self.rejected.labels(rejected.value)

    def crossing_skipped(self, reason: str) -> None:
        self.skipped.labels(reason).inc()

    def crossed(self, peer: str, tier: str) -> None:
        self.crossed_total.labels(peer, tier).inc()

    def token_rejected(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def link(self, peer: str, rtt_s: float | None) -> None:
        self.link_rtt.labels(peer).set(math.nan if rtt_s is None else rtt_s)
