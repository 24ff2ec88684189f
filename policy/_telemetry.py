"""The `telemetry:` section: how slogate reports itself beyond its decisions (Prometheus
label bounds, OpenTelemetry traces).

What lives here: `TelemetryConfig`, `TracingConfig` and their reader. The metrics are
extproc.service.metrics; the tracer is extproc.service.tracing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policy._reader import PolicyError, Section, positive


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """A span per decision, exported over OTLP/gRPC to `otlp_endpoint` (host:port)."""

    otlp_endpoint: str
    service_name: str = "slogate"
    # The share of requests without a sampled parent that get a span (a sampled parent's
    # decision is always kept: the trace is already being recorded upstream).
    sample_ratio: float = 1.0


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    # Tenant-labelled series per metric: the tenants with the most traffic keep their own,
    # the rest are folded into tenant="other" (llm-d's endpoint picker folds past 1,000);
    # the policy's own tenants first. The fold: extproc.service.tenant_series.
    tenant_series_max: int = 1000
    tracing: TracingConfig | None = field(default=None)


def parse_telemetry(sec: Section) -> TelemetryConfig:
    series_max = sec.get("tenant_series_max", int, 1000)
    positive(series_max, sec.child("tenant_series_max"))
    tracing_raw = sec.raw("tracing")
    tracing = None
    if tracing_raw is not None:
        tr = Section(tracing_raw, sec.child("tracing"))
        endpoint = tr.require("otlp_endpoint", str)
        if not endpoint:
            raise PolicyError(f"{tr.child('otlp_endpoint')}: names no endpoint")
        ratio = tr.get("sample_ratio", float, 1.0)
        if not 0.0 <= ratio <= 1.0:
            raise PolicyError(f"{tr.child('sample_ratio')}: must be within [0, 1]")
        tracing = TracingConfig(endpoint, tr.get("service_name", str, "slogate"), ratio)
        tr.close()
    sec.close()
    return TelemetryConfig(series_max, tracing)
