"""What admission decides on and what it gives back: the types the chain passes around.

What lives here: `CountKind` (how a prompt was counted), `RoutingDecision` (one request as
admission sees it: caller, pool, bucket, tokens, and the breaker level and effective limits
it was admitted under), `Applicant` (one request as the chain hands it to each step),
`Admitted` (a step's answer) and `RequestOutcome` (what became of the request: what
settlement and the signals read). Plain frozen values, no I/O; the sidecar builds
decisions from request bodies (extproc.request), the simulator from its arrivals
(sim.fleet.offline), and both hand them to the same chain (admission.chain).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from operator import attrgetter

from admission.waiting_room import WaitNotice
from breaker.levels import BreakerLevel
from budget.spend import SpendHold
from policy.apis import KNOWN_APIS, Api, ApiKind
from policy.domain import ApiKey, ContextBucket, Limits
from policy.schema import Policy

_CHAT_API = KNOWN_APIS[0]
# Response headers the steps set (Envoy renders them from the sidecar's metadata): the level
# a re-routed request met (L3), and how long a request waited for room in its pool.
DEGRADED_HEADER = "x-slogate-degraded"
QUEUED_HEADER = "x-slogate-queued-ms"
# The tenant's spend budget windows at 80% or 100% (admission.spend_step): "month=80%".
SPEND_WARNING_HEADER = "x-slogate-spend-warning"
EXPIRED_DETAILS = "slogate_expired"


class CountKind(StrEnum):
    EXACT = "exact"  # counted now (some messages may have come from the cache)
    CACHED = "cached"  # every message was counted before
    BOUND = "bound"  # too large to count: the byte bound decided
    BUSY = "busy"  # the counter was busy: the byte bound decided

    @property
    def exact(self) -> bool:
        """Counted token for token (not a bound)."""
        return self in (CountKind.EXACT, CountKind.CACHED)


@dataclass(slots=True)
class CandidateNote:
    """What the candidate policy would have done with a request (extproc.request.candidate):
    `verdict` same / would_refuse / would_admit / would_route / skipped, "" until judged
    (just after the enforced decision, off its path); `reason`: the candidate's refusal;
    `pool`: where the candidate would have routed it. Read by the traffic record."""

    verdict: str = ""
    reason: str = ""
    pool: str = ""


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    request_id: str
    caller: ApiKey
    pool: str
    bucket: ContextBucket
    prompt_tokens: int
    max_tokens: int  # per completion: what the request was charged for (and may generate)
    estimate: CountKind  # how prompt_tokens was counted
    stream: bool
    model_override: str | None = None  # the breaker's fallback model at L3
    api: Api = _CHAT_API
    sequences: int = 1  # completions generated at once (n, best_of, beam width, batch)
    runs_to_limit: bool = False  # generates max_tokens whatever the model does (ignore_eos)
    # The caller's prompt correction that prompt_tokens includes (request.tokens.corrections).
    prompt_correction: float = 1.0
    body_bytes: int = 0  # what Envoy holds for the request while it waits for room
    waited_s: float = 0.0  # how long it waited in the waiting room (admission.kv.step)
    # Its pool's KV is tight (another request of its footprint would not fit now, or it
    # waited for room): its end should reach the sidecar at once, not with the access log's
    # next batch, since the next request in the pool waits for what it frees.
    settle_promptly: bool = False
    # Set by the steps as they admit, read back when the request is settled or refunded: the
    # breaker level it met, and the key's limits it was reserved under (scaled by that level
    # and the quota controller). Settling with these, not a fresh read, keeps a level change
    # between reserve and settle from settling against other limits.
    level: BreakerLevel = BreakerLevel.L0
    limits: Limits | None = None
    # The engines slogate picked in the pool, best first (engines.picker); empty: Envoy
    # balances (picking off, one engine, or an endpoint picker of the operator's).
    engines: tuple[str, ...] = ()
    # What it reserved against its tenant's spend budget (admission.spend_step); None: none.
    spend: SpendHold | None = None
    # Crossing regions (admission.crossing): the region that sent it here with a verified
    # token, where it was charged (the budget and spend steps charge nothing here); and
    # whether it may still be sent to another region (False once it crossed, or arrived
    # with any crossing token, verified or not: a request never crosses twice).
    crossed_from: str | None = None
    may_cross: bool = True
    # The candidate policy's verdict on it, when a candidate is evaluated (filled in after).
    candidate: CandidateNote | None = field(default=None, compare=False, hash=False)

    @property
    def exact(self) -> bool:
        return self.estimate.exact

    @property
    def context_tokens(self) -> int:
        """One completion's context: what the model window holds, and what picks the bucket
        and the pool."""
        return self.prompt_tokens + self.max_tokens

    @property
    def reserved_tokens(self) -> int:
        """Everything the request can make the engine hold and generate: the prompt once
        (the completions share it) plus each completion's limit."""
        return self.prompt_tokens + self.sequences * self.max_tokens

    @property
    def charged_here(self) -> bool:
        """False for a request another region charged and sent here (a verified crossing
        token): the budget and spend steps let it through as they do a request with
        nothing to charge; its origin settles it from its own access log."""
        return self.crossed_from is None

    @property
    def meters_tokens(self) -> bool:
        """False for the cheap APIs (tokenize, model list): one request, no tokens, no KV."""
        return self.api.kind is not ApiKind.REQUEST

    def with_engines(self, engines: tuple[str, ...]) -> RoutingDecision:
        """This decision with the engines picked for it (every picked request): its values
        read at once and passed to __init__ by position, ~4.1 µs against
        dataclasses.replace's ~7.6 (which walks the 23 fields' specs, one getattr each,
        and calls __init__ by keyword). The same value, built by the same __init__."""
        values = list(_decision_values(self))
        values[_ENGINES_AT] = engines
        return type(self)(*values)


# RoutingDecision.with_engines' copy: every field, in __init__'s order (each one an
# argument of it: a field without one would shift the rest).
_DECISION_FIELDS = tuple(f.name for f in fields(RoutingDecision) if f.init)
assert len(_DECISION_FIELDS) == len(fields(RoutingDecision))
_decision_values = attrgetter(*_DECISION_FIELDS)
_ENGINES_AT = _DECISION_FIELDS.index("engines")


@dataclass(frozen=True, slots=True)
class Applicant:
    """One request asking to be admitted, as the chain hands it to each step: taken once
    and passed down, so no step re-reads the policy or is told of a wait sideways.

    `decision`: as the steps before this one left it. `request_id`: what the steps hold
    their reservations under. `policy`: the request's snapshot. `on_wait`: told how long
    the request may wait, if it enters the waiting room (admission.kv.step)."""

    decision: RoutingDecision
    request_id: str
    policy: Policy
    on_wait: WaitNotice | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A step's (and the chain's) answer: the decision, maybe re-routed or annotated, and
    headers for the client."""

    decision: RoutingDecision
    response_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What became of a routed request: its decision plus what was seen of the response."""

    decision: RoutingDecision
    tracking_id: str
    status: int  # as Envoy logged it; 0 when no response was sent (or `expired`)
    prompt_tokens: int | None  # from upstream usage; None when the response had none
    completion_tokens: int | None
    ttft_s: float | None  # None when no response body byte arrived
    duration_s: float
    details: str
    stream_events: int | None = None  # SSE events seen (usage_tap.lua); None: not a stream
    # The engine that answered (`ip:port`, Envoy's upstream host); "" when none did.
    upstream: str = ""
    # Envoy could not connect to it, or timed out waiting for it (its response flags).
    upstream_failed: bool = False
    # Parts of the usage above, when the engine reports them (usage_tap.lua): the prompt's
    # cached tokens (prompt_tokens_details.cached_tokens, or Anthropic's cache reads) and the
    # completion's reasoning tokens (completion_tokens_details.reasoning_tokens).
    cached_prompt_tokens: int | None = None
    reasoning_tokens: int | None = None

    @property
    def has_usage(self) -> bool:
        return self.completion_tokens is not None

    @property
    def expired(self) -> bool:
        """No access-log entry ever came: the in-flight table gave up on it."""
        return self.details == EXPIRED_DETAILS


def expired_outcome(decision: RoutingDecision, tracking: str) -> RequestOutcome:
    return RequestOutcome(decision, tracking, 0, None, None, None, 0.0, EXPIRED_DETAILS)
