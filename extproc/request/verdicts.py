"""What the request path answers, and the hooks it is given: kept apart from the flow
(extproc.request.flow), which imports them; so do the flow's callers.

What lives here: `Routed` (an admitted request), `HeaderVerdict` (the header phase's
answer), `CountedRequest` (a request counted and routed, before its admission), and the
`Admitter` / `CandidatePolicy` protocols.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from admission.decision import Admitted, Applicant, RoutingDecision
from engines.prefix import PromptBlocks
from extproc.request.bodies.request import InferenceRequest
from extproc.request.tokens.prompt import PromptCount
from policy.domain import ApiKey
from policy.schema import Policy


class Admitter(Protocol):
    """The admission chain (admission.chain.AdmissionChain), as the request path sees it."""

    async def admit(self, applicant: Applicant) -> Admitted: ...

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        """Give back what an admitted request holds: it will not run after all."""
        ...


class CandidatePolicy(Protocol):
    """A policy judged beside the enforced one, never enforced (extproc.request.candidate):
    it notes each routed decision, and sees each admission's answer."""

    def attach(self, decision: RoutingDecision) -> RoutingDecision: ...

    async def beside(
        self, enforced: Awaitable[Routed], counted: CountedRequest, policy: Policy
    ) -> Routed: ...


@dataclass(frozen=True, slots=True)
class Routed:
    """An admitted request: the decision, its in-flight id and the new body, if any."""

    decision: RoutingDecision
    tracking_id: str  # comes back in the access log; see extproc.request.inflight
    new_body: bytes | None = field(default=None, repr=False)
    # Rendered by Envoy on the response from dynamic metadata (no extra round trip).
    response_headers: Mapping[str, str] = field(default_factory=dict)
    # slogate asked the stream for its usage itself: the Lua tap hides it from the client.
    hide_usage: bool = False
    # The tracking id's proof (InFlight.proof): its access-log entry settles only with it.
    usage_proof: str = field(default="", repr=False)
    # Headers for upstream beside the decision's own: a request sent to another region
    # carries its crossing token (extproc.request.crossing_token).
    upstream_headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class CountedRequest:
    """A parsed request counted and routed under its policy snapshot, not yet admitted.
    `decision` is its shape (the traffic record keeps it for a refusal too)."""

    request: InferenceRequest
    counted: PromptCount
    decision: RoutingDecision
    blocks: PromptBlocks  # its prompt's prefix hashes, for the engine picker
    body: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class HeaderVerdict:
    """The header phase's answer. `routed` is set when the request was admitted already
    (an API whose body is not read: its route and tracking id go out with the headers)."""

    inference: bool  # the body phase follows
    strip_headers: tuple[str, ...]  # client-supplied x-slogate-* headers
    caller: ApiKey | None
    request_id: str
    routed: Routed | None = None
