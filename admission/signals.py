"""What a finished request tells the breaker: its status and its latency against its
objective, recorded into the latency windows (breaker.latency).

What lives here: `record_signals`, the one place that turns a `RequestOutcome` into window
samples. The sidecar's access-log recorder and the simulator both call it, so the breaker
reads the same signals from either. Pure: the windows carry their own clock.
"""

from __future__ import annotations

from admission.decision import RequestOutcome
from breaker.latency import SLO_RATIO, ResponseWindows
from breaker.objectives import latency_objective_s
from policy import Policy


def record_signals(windows: ResponseWindows, policy: Policy, outcome: RequestOutcome) -> None:
    """Every response counts for the error rate; a successful inference request also gives
    its total time, its first-byte time and, like with like, observed / objective: a
    stream's TTFT against its TTFT SLO, a JSON answer's whole time against the objective
    for its output (breaker.objectives)."""
    d = outcome.decision
    pool, tier, bucket = d.pool, d.caller.tier.value, d.bucket.name
    windows.record_response(pool, outcome.status)
    if outcome.status >= 400 or not d.meters_tokens:
        return
    windows.record_latency("total", pool, tier, bucket, outcome.duration_s)
    if outcome.ttft_s is not None:
        windows.record_latency("ttft", pool, tier, bucket, outcome.ttft_s)
    observed_s = outcome.ttft_s if d.stream else outcome.duration_s
    if observed_s is None:
        return
    objective_s = latency_objective_s(
        policy, d.caller.tier, bucket, d.stream, outcome.completion_tokens
    )
    if objective_s is not None and objective_s > 0:
        windows.record_latency(SLO_RATIO, pool, tier, bucket, observed_s / objective_s)
