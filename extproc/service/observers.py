"""What watches a request's life: one interface, for its decision and for its answer.

What lives here: `RequestObserver`, which the tracer (extproc.service.tracing), the decision
log (decision_log) and the traffic record (traffic_record) implement, and `RequestSeen`,
what an observer may read of a request while it is decided (the request flow,
extproc.request.flow.RequestFlow, is one). The moments:

- `arrived`: its headers were read (the tracer takes the client's trace context);
- `routed`: it was admitted and its reply is about to go (the tracer may add headers to it);
- `refused`: its refusal is about to go;
- `abandoned`: its stream went away while its decision waited;
- `record`: it was answered — its access-log entry came, or it expired. This is the
  OutcomeSink method (admission.chain), so the access-log side calls the same objects, inline
  on its task: an observer's record never waits (a file's writer has its own thread).

The ext_proc servicer calls every observer at each moment of the decision, in the order it
was given them; the OutcomeRecorder (extproc.service.access_log) calls them with its other
sinks when the request ends. An observer with nothing to say of a moment does nothing
there. What must not live here: anything that changes a decision (that is admission's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from admission.decision import RequestOutcome, RoutingDecision
from admission.errors import RequestRejected
from policy.domain import ApiKey

if TYPE_CHECKING:
    from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from extproc.request.verdicts import Routed


class RequestSeen(Protocol):
    """A request as far as it was decided: its id and caller once its headers were read,
    its shape once it was counted (a refusal's too), when its stream began (wall clock),
    and the client's trace context (set by the tracer, when one observes)."""

    @property
    def request_id(self) -> str: ...

    @property
    def caller(self) -> ApiKey | None: ...

    @property
    def shape(self) -> RoutingDecision | None: ...

    @property
    def arrived_s(self) -> float: ...

    trace_parent: Any


class RequestObserver(Protocol):
    def arrived(self, request: RequestSeen, headers: Mapping[str, str]) -> None: ...

    def routed(self, request: RequestSeen, routed: Routed, reply: pb.ProcessingResponse) -> None:
        """May add headers to `reply` (the tracer's `traceparent`)."""
        ...

    def refused(self, request: RequestSeen, error: RequestRejected) -> None: ...

    def abandoned(self, request: RequestSeen) -> None: ...

    def record(self, outcome: RequestOutcome) -> None: ...
