"""What a finished request tells the breaker: its status and its latency against its
objective, recorded into the latency windows (breaker.latency).

What lives here: `record_signals`, the one place that turns a `RequestOutcome` into window
samples. The sidecar's access-log recorder and the simulator both call it, so the breaker
reads the same signals from either. Pure: the windows carry their own clock.

The breaker judges the pools, so a request's wait in the waiting room is taken out of its
latency samples (Envoy's times start when the request arrived): the wait is the waiting
room's doing, watched by its own metric and alert. Left in, a full and healthy pool — the
waiting room's normal state under load — would look slow, trip the breaker and shed what
the pool could serve.

Alike, the answer of an engine taken out of its pool (dead: killed, hung, ejected; or
draining) counts for its status only, not its latency: the requests stuck on a hung engine
end late, once it answers again, and they are that engine's problem, not the pool's (the
error rate leaves the same engines out, breaker.board.error_rate).
"""

from __future__ import annotations

from admission.crossing import crossed_to
from admission.decision import RequestOutcome
from breaker.latency import SLO_RATIO, ResponseWindows
from breaker.objectives import latency_objective_s
from policy.schema import Policy


def record_signals(
    windows: ResponseWindows,
    policy: Policy,
    outcome: RequestOutcome,
    engines_out: frozenset[str] = frozenset(),
) -> None:
    """Every response counts for the error rate; a successful inference request also gives
    its total time, its first-byte time and, like with like, observed / objective: a
    stream's TTFT against its TTFT SLO, a JSON answer's whole time against the objective
    for its output (breaker.objectives) — unless its engine is one of `engines_out`, the
    pool's engines taken out of it when the answer came (engines.state.EngineFleet.out)."""
    d = outcome.decision
    if crossed_to(d.pool) is not None:
        return  # served by another region: it says nothing of this region's pools
    pool, tier, bucket = d.pool, d.caller.tier.value, d.bucket.name
    windows.record_response(pool, outcome.status, outcome.upstream)
    if outcome.status >= 400 or not d.meters_tokens or outcome.upstream in engines_out:
        return
    duration_s = max(0.0, outcome.duration_s - d.waited_s)
    ttft_s = None if outcome.ttft_s is None else max(0.0, outcome.ttft_s - d.waited_s)
    windows.record_latency("total", pool, tier, bucket, duration_s)
    if ttft_s is not None:
        windows.record_latency("ttft", pool, tier, bucket, ttft_s)
    observed_s = ttft_s if d.stream else duration_s
    if observed_s is None:
        return
    objective_s = latency_objective_s(
        policy, d.caller.tier, bucket, d.stream, outcome.completion_tokens, d.caller.tenant
    )
    if objective_s is not None and objective_s > 0:
        windows.record_latency(SLO_RATIO, pool, tier, bucket, observed_s / objective_s)
