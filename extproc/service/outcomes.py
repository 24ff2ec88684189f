"""What Envoy reports of a routed request, read into its `RequestOutcome`: an access-log
entry (`outcome_from_entry`, with the entry's `tracking_id` and `usage_proof`) or, in the
endpoint picker protocol's streaming mode, what the ext_proc stream itself saw
(`outcome_from_stream`). Pure: no I/O, no state; extproc.service.access_log records them.
"""

from __future__ import annotations

from collections.abc import Mapping

from admission.decision import RequestOutcome, RoutingDecision
from engines.engine import engine_address
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.request.contract import METADATA_NAMESPACE, TRACKING_ID_FIELD, USAGE_PROOF_FIELD
from extproc.request.response_usage import MAX_REPORTED_COUNT, ResponseUsage
from policy.apis import ApiKind


def _tag_int(tags: Mapping[str, str], name: str) -> int | None:
    value = tags.get(name, "")
    if not value or value == "-":
        # Absent (no tag, or Envoy's "-"): most of an entry's eight tags. Answered before
        # int(float()) raises on it: ~0.6 µs an exception, five of them per entry.
        return None
    try:
        number = int(float(value))
    except (ValueError, OverflowError):
        return None  # "-" (absent), garbage or infinite ("inf", "1e400"): not reported
    return number if 0 <= number <= MAX_REPORTED_COUNT else None


def _tag_ms(tags: Mapping[str, str], name: str) -> float | None:
    value = _tag_int(tags, name)
    return None if value is None else value / 1000.0


def _time_to_first_token_s(tags: Mapping[str, str], duration_s: float) -> float | None:
    """To a stream's first output event where the usage tap saw one (the first body byte
    plus the tap's delay after it: a Responses stream's first bytes come before any token),
    else to the first body byte (a JSON body's first byte is its whole answer; a stream
    that sent no output, or an Envoy whose tap does not time it, keeps the old reading)."""
    first_byte_s = _tag_ms(tags, "ttft_ms")
    delay_s = _tag_ms(tags, "first_output_delay_ms")
    if first_byte_s is None or delay_s is None:
        return first_byte_s
    # Two clocks (Envoy's monotonic one for the byte, the tap's wall clock in ms): their sum
    # may pass the request's end by a millisecond, which would make TPOT negative.
    ttft_s = first_byte_s + delay_s
    return min(ttft_s, duration_s) if duration_s > 0 else ttft_s


def _prompt_in_parts(tags: Mapping[str, str]) -> int | None:
    """The native tap's prompt (tooling.render.envoy_config.usage_tap): `input_tokens` plus the
    prompt cache Anthropic leaves out of it (the Lua tap writes the sum as prompt_tokens)."""
    inputs = _tag_int(tags, "input_tokens")
    if inputs is None:
        return None
    cache = ("cache_read_input_tokens", "cache_creation_input_tokens")
    return inputs + sum(_tag_int(tags, name) or 0 for name in cache)


def _cached_prompt(tags: Mapping[str, str]) -> int | None:
    """OpenAI's cached_tokens, or Anthropic's cache read where the native tap left it apart."""
    cached = _tag_int(tags, "cached_tokens")
    return cached if cached is not None else _tag_int(tags, "cache_read_input_tokens")


def _metadata_string(entry: accesslog_pb2.HTTPAccessLogEntry, field: str) -> str | None:
    """A field of the sidecar's metadata namespace, as Envoy copied it into the entry."""
    namespace = entry.common_properties.metadata.filter_metadata.get(METADATA_NAMESPACE)
    if namespace is None:
        return None
    value = namespace.fields.get(field)
    return value.string_value if value is not None else None


def tracking_id(entry: accesslog_pb2.HTTPAccessLogEntry) -> str | None:
    """The sidecar's in-flight id of a routed request; None for any other request."""
    return _metadata_string(entry, TRACKING_ID_FIELD)


def usage_proof(entry: accesslog_pb2.HTTPAccessLogEntry) -> str:
    """The proof of its tracking id the entry carries ("": none)."""
    return _metadata_string(entry, USAGE_PROOF_FIELD) or ""


def outcome_from_entry(
    decision: RoutingDecision, tracking: str, entry: accesslog_pb2.HTTPAccessLogEntry
) -> RequestOutcome:
    common = entry.common_properties
    tags = common.custom_tags
    duration_s = common.duration.ToNanoseconds() / 1e9 if common.HasField("duration") else 0.0
    if duration_s == 0.0 and common.HasField("time_to_last_downstream_tx_byte"):
        duration_s = common.time_to_last_downstream_tx_byte.ToNanoseconds() / 1e9
    # Envoy measures no negative time; an entry that says so is not believed (the waiting
    # room's decay, 0.5 ** (duration / half-life), overflowed on -3e6 s).
    duration_s = max(0.0, duration_s)
    prompt = _tag_int(tags, "prompt_tokens")
    if prompt is None:
        prompt = _prompt_in_parts(tags)
    completion = _completion(decision, prompt, _tag_int(tags, "completion_tokens"))
    upstream = common.upstream_remote_address.socket_address
    flags = common.response_flags
    return RequestOutcome(
        decision=decision,
        tracking_id=tracking,
        status=entry.response.response_code.value,
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=_time_to_first_token_s(tags, duration_s),
        duration_s=duration_s,
        details=entry.response.response_code_details,
        stream_events=_tag_int(tags, "stream_events"),
        cached_prompt_tokens=_cached_prompt(tags),
        reasoning_tokens=_tag_int(tags, "reasoning_tokens"),
        upstream=engine_address(upstream.address, upstream.port_value) if upstream.address else "",
        # Refused or reset before an answer, or no answer in time (a hung engine).
        upstream_failed=(
            flags.upstream_connection_failure
            or flags.upstream_remote_reset
            or flags.upstream_connection_termination
            or flags.upstream_request_timeout
        ),
    )


def _completion(
    decision: RoutingDecision, prompt: int | None, completion: int | None
) -> int | None:
    if completion is None and prompt is not None and decision.api.kind is ApiKind.EMBED:
        return 0  # embeddings report only prompt_tokens: that is their whole usage
    return completion


def outcome_from_stream(
    decision: RoutingDecision,
    tracking: str,
    status: int,
    usage: ResponseUsage,
    ttft_s: float | None,
    duration_s: float,
    upstream: str,
    details: str,
) -> RequestOutcome:
    """What the ext_proc stream itself saw of a routed request's response (the endpoint
    picker protocol's streaming mode, where no access log comes)."""
    prompt = usage.prompt_tokens
    return RequestOutcome(
        decision=decision,
        tracking_id=tracking,
        status=status,
        prompt_tokens=prompt,
        completion_tokens=_completion(decision, prompt, usage.completion_tokens),
        ttft_s=ttft_s,
        duration_s=duration_s,
        details=details,
        stream_events=usage.stream_events,
        cached_prompt_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        upstream=upstream,
        upstream_failed=status in (502, 503, 504) and details != "via_upstream",
    )
