"""What a finished request's latency is held against: like with like.

What lives here: `latency_objective_s`, pure. A streamed request's time to its first token
is compared with its tier's (and bucket's) TTFT SLO. A request that is not streamed gets
its first byte only when the whole answer is done, so its first byte is not a TTFT: its
total time is compared with TTFT SLO + (output tokens - 1) x the tier's per-output-token
SLO (`tpot_slos`), the time the answer may take if each part meets its objective. A tenant
that sets its own objectives (`tenants:`) has them replace its tier's for its requests. The
breaker then reads one number for both kinds: the P99 of observed / objective, per pool,
tier and bucket (1.0 = on the SLO). A non-streamed answer whose output length is unknown
(no usage came back) gives no sample: it cannot be judged.

Why not the engines' own TTFT histogram (`vllm:time_to_first_token_seconds`, scraped): it
covers every request of an endpoint at once, with no tier or bucket, so it cannot be held
against per-tier SLOs; it would say "slow" without saying for whom.
"""

from __future__ import annotations

from policy.domain import Tier
from policy.schema import Policy


def latency_objective_s(
    policy: Policy,
    tier: Tier,
    bucket: str,
    stream: bool,
    output_tokens: int | None,
    tenant: str | None = None,
) -> float | None:
    """Seconds the request may take to what was measured: its first token (streamed) or its
    whole answer (not streamed); None when there is no objective to hold it against. Its
    tenant's objectives replace its tier's where the policy's `tenants:` sets them."""
    ttft_ms = policy.slo_ms(tier, bucket, tenant)
    if ttft_ms is None:
        return None
    if stream:
        return ttft_ms / 1000.0
    if output_tokens is None:
        return None
    per_token_ms = policy.tpot_ms(tier, tenant)
    if per_token_ms is None:
        return None
    return (ttft_ms + max(0, output_tokens - 1) * per_token_ms) / 1000.0
