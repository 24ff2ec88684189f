"""What a reload may not change: the settings the sidecar reads once, when it starts.

What lives here: `START_ONLY_SETTINGS` (paths into `Policy`) and `start_only_changes`, which
the reload (extproc.runtime.policy_holder) and the candidate policy (policy.candidate)
refuse a policy for.
"""

from __future__ import annotations

from policy.schema import Policy

# Settings the sidecar reads once, when it starts (gRPC limits, stores, loops, windows,
# Envoy's own configuration): a reload that changes any of them is refused as a whole, the
# running policy stays, and the refusal names them. Applying half a policy is worse.
START_ONLY_SETTINGS = (
    "max_body_bytes",
    "message_timeout_ms",
    "upstream_timeout_s",
    "failure_mode",
    "failure_mode_by_path",
    "paths",
    "counting",
    "budget",
    "breaker.window_s",
    "breaker.scrape_metrics",
    "breaker.scrape_interval_s",
    "breaker.stale_after_s",
    "breaker.controller_interval_s",
    "engines.health",  # Envoy's health checks and outlier detection are written from it
    "decision_log",
    "traffic_record",
    "tls",
    "jwt",
    "shadow",
    "key_store",
    "telemetry.tracing",  # the tracer and its exporter are built once
    "data_path",  # Envoy's bootstrap is written from it
    # Envoy's cluster and route per peer region are written where crossing is on, and the
    # crossing secret is read at start (docs/operators/crossing.md). The peers a sidecar
    # sends requests to are those it started with (admission.crossing.Crossing).
    "regions.crossing.enabled",
    "regions.crossing.secret_file",
)


def start_only_changes(running: Policy, new: Policy) -> list[str]:
    """The start-only settings `new` would change."""

    def read(policy: Policy, path: str) -> object:
        value: object = policy
        for part in path.split("."):
            value = getattr(value, part)
        return value

    return [path for path in START_ONLY_SETTINGS if read(running, path) != read(new, path)]
