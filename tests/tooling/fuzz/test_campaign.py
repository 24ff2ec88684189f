"""The sidecar fuzzed at its door (tooling.fuzz): a real sidecar in this process, its
gRPC port sent ext_proc streams and access-log messages built at random and mutated from
real ones, a fixed number of examples from a fixed seed (derandomized: the same inputs in
every run; `slogate fuzz --seconds N` runs longer and at random). Each example: the stream
answered or closed, every reply a valid ext_proc response for its phase, nothing logged as
an error, and what it routed settled leaves nothing held. After them, a plain request is
routed and settled as ever."""

from __future__ import annotations

from pathlib import Path

from hypothesis import example, given, settings

from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import (
    ProcessingMode,
)
from tests.support.stack import EXAMPLE_POLICY
from tooling.fuzz.access_log_cases import access_log_streams
from tooling.fuzz.campaign import (
    FUZZ_SETTINGS,
    access_log_case,
    ext_proc_case,
    fuzz_policy,
    still_serving,
)
from tooling.fuzz.cases import LogCase, StreamCase
from tooling.fuzz.ext_proc_cases import ext_proc_streams
from tooling.fuzz.seeds import (
    API_KEYS,
    CHAT,
    ROUTED_ID,
    access_log_entry,
    access_log_seeds,
    one_message,
)
from tooling.fuzz.target import FuzzTarget


def _routed_entry(usage: dict[str, int | str], duration_s: int = 1) -> LogCase:
    """One access-log message naming the id of the one request routed before it."""
    message = access_log_seeds()[0]
    del message.http_logs.log_entry[:]
    entry = access_log_entry(ROUTED_ID.format(0), 200, usage)
    entry.common_properties.duration.FromSeconds(duration_s)
    message.http_logs.log_entry.append(entry)
    return LogCase((message.SerializeToString(),), 1, "found")


# What the fuzzer found, kept as examples (each fixed in its own commit).
EMPTY_MESSAGE = StreamCase((b"",), None, "found")
(_body_first,) = one_message("/v1/chat/completions", API_KEYS[0], CHAT)
_body_first.protocol_config.request_body_mode = ProcessingMode.FULL_DUPLEX_STREAMED
BODY_FIRST_STREAMING = StreamCase((_body_first.SerializeToString(),), None, "found")
INFINITE_COUNT = _routed_entry({"completion_tokens": "inf"})
NEGATIVE_DURATION = _routed_entry({"completion_tokens": 3}, duration_s=-3_019_426)
TTFT_PAST_EVERY_BIN = _routed_entry({"completion_tokens": 3, "ttft_ms": "1e308"})


def test_the_sidecar_fuzzed_at_its_door(tmp_path: Path) -> None:
    """One test, one sidecar (the suite's workers take in-process tests one by one): the
    ext_proc streams, then the access-log streams, then a plain request. 8-40 s of the
    suite's time on 2 cores, by how busy they are (10-50 cases a second)."""
    target = FuzzTarget(fuzz_policy(EXAMPLE_POLICY, tmp_path))  # no engine runs here
    target.start()
    try:

        @settings(FUZZ_SETTINGS, max_examples=300, derandomize=True)
        @given(case=ext_proc_streams)
        @example(case=EMPTY_MESSAGE)
        @example(case=BODY_FIRST_STREAMING)
        def ext_proc_streams_are_answered_validly_and_hold_nothing(case: StreamCase) -> None:
            assert ext_proc_case(target, case) == []

        @settings(FUZZ_SETTINGS, max_examples=80, derandomize=True)
        @given(case=access_log_streams)
        @example(case=INFINITE_COUNT)
        @example(case=NEGATIVE_DURATION)
        @example(case=TTFT_PAST_EVERY_BIN)
        def access_log_entries_settle_what_they_name_and_hold_nothing(case: LogCase) -> None:
            assert access_log_case(target, case) == []

        ext_proc_streams_are_answered_validly_and_hold_nothing()
        access_log_entries_settle_what_they_name_and_hold_nothing()
        assert still_serving(target) == []
    finally:
        target.stop()
