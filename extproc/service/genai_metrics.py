"""OpenTelemetry's GenAI semantic-convention metrics, as Prometheus names them, beside
slogate's own: dashboards and alerts built for those names read a slogate fleet as it is.

What lives here: `GenAiMetrics`, an OutcomeSink fed the same outcomes as slogate's own
histograms (a routed request's access-log entry: usage, TTFT, duration), writing

- `gen_ai_server_time_to_first_token_seconds` (gen_ai.server.time_to_first_token),
- `gen_ai_server_time_per_output_token_seconds` (gen_ai.server.time_per_output_token),
- `gen_ai_server_request_duration_seconds` (gen_ai.server.request.duration),
- `gen_ai_client_token_usage` (gen_ai.client.token.usage; gen_ai_token_type input/output),

labelled `gen_ai_operation_name` (chat, text_completion, embeddings, generate_content) and
`gen_ai_request_model` (the policy's model, or the breaker's fallback model that served
it): both bounded by the policy. Bucket bounds are the conventions' advice. Only
successful answers are observed, as slogate's own latency histograms do.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from admission.decision import RequestOutcome
from extproc.service.loop_metrics import Family, LoopHistogram
from policy.apis import BodyShape
from policy.schema import Policy

# fmt: off
_TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)
_TPOT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)
_DURATION_BUCKETS_S = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
# fmt: on
_OPERATION = ["gen_ai_operation_name", "gen_ai_request_model"]
# The conventions' operation names by body shape; a body-less API (tokenize, the model
# list) is no inference and is not observed. SageMaker's /invocations may be either chat
# or completion: the conventions' generic generate_content.
_OPERATIONS = {
    BodyShape.CHAT: "chat",
    BodyShape.RESPONSES: "chat",
    BodyShape.MESSAGES: "chat",
    BodyShape.COMPLETION: "text_completion",
    BodyShape.EMBEDDINGS: "embeddings",
    BodyShape.INVOCATIONS: "generate_content",
}


class GenAiMetrics:
    def __init__(self, registry: CollectorRegistry, policy: Callable[[], Policy]) -> None:
        self._policy = policy

        def histogram(name: str, doc: str, labels: list[str], buckets: tuple[float, ...]) -> Family:
            return Family(LoopHistogram(name, doc, labels, buckets=buckets, registry=registry))

        self.ttft = histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "OpenTelemetry gen_ai.server.time_to_first_token: time to the first token.",
            _OPERATION,
            _TTFT_BUCKETS_S,
        )
        self.tpot = histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "OpenTelemetry gen_ai.server.time_per_output_token: time per output token after "
            "the first.",
            _OPERATION,
            _TPOT_BUCKETS_S,
        )
        self.duration = histogram(
            "gen_ai_server_request_duration_seconds",
            "OpenTelemetry gen_ai.server.request.duration: the request's duration.",
            _OPERATION,
            _DURATION_BUCKETS_S,
        )
        self.tokens = histogram(
            "gen_ai_client_token_usage",
            "OpenTelemetry gen_ai.client.token.usage: tokens per request, input and output.",
            [*_OPERATION, "gen_ai_token_type"],
            _TOKEN_BUCKETS,
        )

    def record(self, outcome: RequestOutcome) -> None:
        """OutcomeSink: one answered request."""
        decision = outcome.decision
        shape = decision.api.shape
        operation = _OPERATIONS.get(shape) if shape is not None else None
        if operation is None or outcome.status >= 400:
            return
        model = decision.model_override or self._policy().model_name
        self.duration(operation, model).observe(outcome.duration_s)
        if outcome.ttft_s is not None:
            self.ttft(operation, model).observe(outcome.ttft_s)
        if outcome.prompt_tokens is not None:
            self.tokens(operation, model, "input").observe(outcome.prompt_tokens)
        completion = outcome.completion_tokens
        if completion is not None and operation != "embeddings":
            self.tokens(operation, model, "output").observe(completion)
            if outcome.ttft_s is not None and completion > 1:
                per_token_s = (outcome.duration_s - outcome.ttft_s) / (completion - 1)
                if per_token_s >= 0:
                    self.tpot(operation, model).observe(per_token_s)
