"""The stages of the request path that `slogate bench stages` charges time to: each a set of
source files (a function belongs to the first stage one of whose markers its file path
holds), and a profile's shares of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    markers: tuple[str, ...]  # a function whose file path holds any of these


# First match wins: the specific before the general (the access log's metrics are
# metrics; a count's numpy is counting only where it is called from, so numpy is its own).
STAGES = (
    Stage("prompt counting", ("extproc/request/tokens/",)),
    Stage(
        "metrics",
        (
            "prometheus_client/",
            "service/metrics.py",
            "genai_metrics.py",
            "tenant_",
            "known_",
            "runtime/events.py",
        ),
    ),
    Stage(
        "access log and settling",
        (
            "service/access_log.py",
            "service/outcomes.py",
            "decision_log.py",
            "traffic_record.py",
            "admission/signals",
            "prompt_feedback.py",
        ),
    ),
    Stage("body parsing and rewriting", ("extproc/request/bodies/",)),
    Stage("budgets", ("budget/", "admission/budget_step.py", "admission/spend")),
    Stage("KV admission and waiting room", ("admission/kv/", "admission/waiting_room.py")),
    Stage("breaker", ("breaker/", "admission/breaker_step.py")),
    Stage("admission chain, access, decision", ("admission/",)),
    Stage("engine picking and prefix hashing", ("engines/",)),
    Stage("identity, routing, request flow", ("extproc/request/",)),
    Stage("policy lookups", ("policy/", "policy_holder.py", "candidate_holder.py")),
    Stage("protobuf replies", ("service/replies.py", "service/one_message.py", "protobuf")),
    Stage("ext_proc servicer", ("service/ext_proc.py", "service/streamed_mode.py")),
    Stage("dataclass copies and inits", ("dataclasses.py", "<string>")),
    Stage(
        "event loop and grpc.aio (cygrpc inside)",
        ("asyncio/", "selectors.py", "grpc", "_weakrefset.py", "contextvars", "inspect.py"),
    ),
    Stage("threads (pool, locks)", ("threading.py", "concurrent/")),
)
OTHER = "other"
# The in-process benchmark's own lines (building Envoy's messages): not the sidecar's cost.
HARNESS = "the benchmark's harness"


def stage_of(path: str) -> str:
    if "tooling/benchmarks/" in path:
        return HARNESS
    for stage in STAGES:
        if any(marker in path for marker in stage.markers):
            return stage.name
    return OTHER


def shares(own: Mapping[str, float]) -> dict[str, float]:
    """Each stage's share of the sidecar's own time (the harness's left out)."""
    total = sum(value for stage, value in own.items() if stage != HARNESS) or 1.0
    return {stage: value / total for stage, value in own.items() if stage != HARNESS}
