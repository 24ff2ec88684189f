"""Hypothesis strategies for access-log streams, built at random from the fields the
sidecar reads (response codes, durations, the tracking id, usage tags, the upstream
address, flags), or mutated from real ones (tooling.fuzz.mutation). What comes out is
bytes, sent as they are.
"""

from __future__ import annotations

from hypothesis import strategies as st

from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.request.contract import ACCESS_LOG_NAME, METADATA_NAMESPACE, TRACKING_ID_FIELD
from extproc.request.response_usage import USAGE_COUNT_NAMES
from tooling.fuzz.cases import LogCase
from tooling.fuzz.json_values import finite, struct_values
from tooling.fuzz.mutation import mutated_logs
from tooling.fuzz.seeds import ENGINE, ROUTED_ID


@st.composite
def built_entry(draw: st.DrawFn) -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.response.response_code.value = draw(
        st.integers(0, 2**32 - 1) | st.sampled_from([0, 200, 429, 503])
    )
    entry.response.response_code_details = draw(
        st.sampled_from(["via_upstream", "slogate_rate_limit", ""]) | st.text(max_size=20)
    )
    common = entry.common_properties
    if draw(st.booleans()):
        tracking = draw(
            st.sampled_from([ROUTED_ID.format(i) for i in range(3)]) | st.text(max_size=20)
        )
        common.metadata.filter_metadata[METADATA_NAMESPACE].update({TRACKING_ID_FIELD: tracking})
    if draw(st.booleans()):
        common.metadata.filter_metadata[METADATA_NAMESPACE].update(finite(draw(struct_values)))
    if draw(st.booleans()):
        seconds = draw(st.integers(-315_576_000_000, 315_576_000_000))
        common.duration.seconds = seconds
        common.duration.nanos = draw(st.integers(-999_999_999, 999_999_999)) if seconds else 0
    if draw(st.booleans()):
        common.time_to_last_downstream_tx_byte.seconds = draw(st.integers(-(10**6), 10**6))
    # The usage counts the response path reads, and the sidecar's own tags beside them.
    tag_names = st.sampled_from(
        [*USAGE_COUNT_NAMES, "ttft_ms", "first_output_delay_ms", "stream_events"]
    )
    tag_values = (
        st.sampled_from(
            ["-", "0", "7", "-3", "1e308", "inf", "nan", "1e400", "9" * 400, "0x10", " 5 "]
        )
        | st.integers().map(str)
        | st.text(max_size=12)
    )
    for name, value in draw(
        st.dictionaries(tag_names | st.text(max_size=10), tag_values, max_size=6)
    ).items():
        common.custom_tags[name] = value
    if draw(st.booleans()):
        address = common.upstream_remote_address.socket_address
        address.address = draw(
            st.sampled_from([ENGINE.split(":")[0], "::1", ""]) | st.text(max_size=20)
        )
        address.port_value = draw(st.integers(0, 2**32 - 1))
    flags = common.response_flags
    flags.upstream_remote_reset = draw(st.booleans())
    flags.upstream_request_timeout = draw(st.booleans())
    return entry


@st.composite
def built_logs(draw: st.DrawFn) -> LogCase:
    messages = []
    for _ in range(draw(st.integers(1, 3))):
        message = als_pb2.StreamAccessLogsMessage()
        if draw(st.booleans()):
            message.identifier.log_name = draw(st.just(ACCESS_LOG_NAME) | st.text(max_size=8))
        if draw(st.integers(0, 5)) == 0:
            message.tcp_logs.log_entry.add()
        else:
            message.http_logs.log_entry.extend(draw(st.lists(built_entry(), max_size=5)))
        messages.append(message.SerializeToString())
    return LogCase(tuple(messages), draw(st.integers(0, 3)), "built")


access_log_streams = built_logs() | mutated_logs()
