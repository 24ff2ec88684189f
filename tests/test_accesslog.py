"""Access-log entries -> outcomes -> metrics and windows, without Envoy or gRPC."""

from __future__ import annotations

from envoy.data.accesslog.v3 import accesslog_pb2

from breaker.latency import ResponseWindows
from extproc.accesslog import OutcomeRecorder, RequestOutcome, outcome_from_entry
from extproc.metrics import SidecarMetrics


def entry(
    status: int = 200,
    tags: dict[str, str] | None = None,
    meta: dict[str, object] | None = None,
    duration_ms: int = 900,
    details: str = "via_upstream",
) -> accesslog_pb2.HTTPAccessLogEntry:
    e = accesslog_pb2.HTTPAccessLogEntry()
    e.response.response_code.value = status
    e.response.response_code_details = details
    e.common_properties.duration.FromMilliseconds(duration_ms)
    for k, v in (tags or {}).items():
        e.common_properties.custom_tags[k] = v
    if meta is not None:
        e.common_properties.metadata.filter_metadata["slogate"].update(meta)
    return e


META = {
    "request_id": "r1",
    "key_id": "abc",
    "tenant": "t",
    "tier": "critical",
    "pool": "long",
    "bucket": "32k-128k",
    "prompt_tokens_est": 41000,
    "max_tokens": 16,
    "exact": False,
}


def test_routed_entry_becomes_outcome() -> None:
    outcome = outcome_from_entry(
        entry(
            tags={"ttft_ms": "120", "prompt_tokens": "40000", "completion_tokens": "16"}, meta=META
        )
    )
    assert outcome is not None
    assert (outcome.pool, outcome.bucket, outcome.tier) == ("long", "32k-128k", "critical")
    assert outcome.prompt_tokens == 40000 and outcome.completion_tokens == 16
    assert outcome.ttft_s == 0.12 and outcome.duration_s == 0.9
    assert outcome.prompt_tokens_est == 41000 and outcome.has_usage


def test_missing_tags_mean_not_reported() -> None:
    outcome = outcome_from_entry(entry(tags={"ttft_ms": "-", "completion_tokens": "x"}, meta=META))
    assert outcome is not None
    assert outcome.ttft_s is None and outcome.completion_tokens is None
    assert not outcome.has_usage


def test_unrouted_entry_is_not_an_outcome() -> None:
    assert outcome_from_entry(entry()) is None


class Sink:
    def __init__(self) -> None:
        self.seen: list[RequestOutcome] = []

    def record(self, outcome: RequestOutcome) -> None:
        self.seen.append(outcome)


class BrokenSink:
    def record(self, outcome: RequestOutcome) -> None:
        raise RuntimeError("boom")


def test_recorder_feeds_metrics_windows_and_sinks() -> None:
    metrics = SidecarMetrics()
    windows = ResponseWindows(clock=lambda: 50.0)
    sink = Sink()
    recorder = OutcomeRecorder(metrics, windows, [BrokenSink(), sink])
    tags = {"ttft_ms": "100", "prompt_tokens": "40000", "completion_tokens": "11"}
    recorder.record_entry(entry(tags=tags, meta=META))
    recorder.record_entry(entry(status=503, meta=META, details="via_upstream"))
    recorder.record_entry(entry(status=413, details="request_payload_too_large"))
    recorder.record_entry(entry(status=404))  # an upstream 404 on a non-inference path
    value = metrics.registry.get_sample_value
    assert (
        value("slogate_tokens_total", {"pool": "long", "bucket": "32k-128k", "kind": "completion"})
        == 11
    )
    assert (
        value(
            "slogate_upstream_ttft_seconds_count",
            {"pool": "long", "bucket": "32k-128k", "tier": "critical"},
        )
        == 1
    )
    assert value("slogate_responses_total", {"pool": "long", "code_class": "5xx"}) == 1
    assert value("slogate_envoy_local_replies_total", {"status": "413"}) == 1
    assert value("slogate_envoy_local_replies_total", {"status": "404"}) is None
    # tpot = (0.9 s - 0.1 s) / (11 - 1)
    assert (
        value(
            "slogate_upstream_time_per_output_token_seconds_sum",
            {"pool": "long", "bucket": "32k-128k"},
        )
        == 0.08
    )
    assert windows.error_rate("long", 60) == 0.5
    assert windows.quantile("ttft", 0.5, 60, pool="long") is not None
    assert [o.status for o in sink.seen] == [200, 503]  # the broken sink did not stop it
