"""The usage of a response read from its body as it passes through the sidecar, in chunks.

What lives here: `ResponseUsage`, fed each response body chunk. Only the endpoint picker
protocol's streaming mode sends response bodies to the sidecar (a gateway's Envoy, which
has neither slogate's usage tap nor its access log); slogate's own configurations read
usage inside Envoy (usage_tap.lua) and never send a response chunk here. Pure, bounded: it
keeps the body's last TAIL_BYTES, where a JSON answer's `usage` and a stream's usage event
are (both come last), and counts SSE events.
"""

from __future__ import annotations

import re

TAIL_BYTES = 64 * 1024
# The most tokens (or milliseconds, or events) one request's report is believed to count:
# more is a broken or hostile report, not usage (no context holds two billion tokens);
# beyond it the count reads as not reported and the sidecar's own count settles. Beyond
# 2**63 Redis's INCRBY refuses, and a tenant's budget would be spent by one bad number.
MAX_REPORTED_COUNT = 2**31 - 1
_MAX_DIGITS = len(str(MAX_REPORTED_COUNT))
# The usage counts read from a response body, by their names in every API's `usage`.
USAGE_COUNT_NAMES = (
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cached_tokens",
    "reasoning_tokens",
)
_NUMBER = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*(\d+)') for name in USAGE_COUNT_NAMES
}


class ResponseUsage:
    def __init__(self) -> None:
        self._tail = b""
        self._data_lines = 0
        self._done_lines = 0
        self.streamed = False  # an SSE body (some `data:` line seen)

    def feed(self, chunk: bytes) -> None:
        # A `data:` spanning two chunks is counted once: the carried tail is too short to
        # hold a whole one it already counted.
        joined = self._tail[-5:] + chunk
        self._data_lines += joined.count(b"data:") - self._tail[-5:].count(b"data:")
        self._done_lines += joined.count(b"[DONE]") - self._tail[-5:].count(b"[DONE]")
        self.streamed = self.streamed or self._data_lines > 0
        self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    def _last(self, name: str) -> int | None:
        found = _NUMBER[name].findall(self._tail)
        if not found or len(found[-1]) > _MAX_DIGITS:
            return None  # more digits than any count (and than int() reads: 4,300)
        value = int(found[-1])
        return value if value <= MAX_REPORTED_COUNT else None

    @property
    def prompt_tokens(self) -> int | None:
        prompt = self._last("prompt_tokens")
        if prompt is not None:
            return prompt
        inputs = self._last("input_tokens")
        if inputs is None:
            return None
        # Anthropic leaves its prompt cache out of input_tokens.
        cache = ("cache_read_input_tokens", "cache_creation_input_tokens")
        return inputs + sum(self._last(name) or 0 for name in cache)

    @property
    def completion_tokens(self) -> int | None:
        completion = self._last("completion_tokens")
        return completion if completion is not None else self._last("output_tokens")

    @property
    def cached_tokens(self) -> int | None:
        cached = self._last("cached_tokens")
        return cached if cached is not None else self._last("cache_read_input_tokens")

    @property
    def reasoning_tokens(self) -> int | None:
        return self._last("reasoning_tokens")

    @property
    def stream_events(self) -> int | None:
        """The SSE events the stream sent (its closing `[DONE]` not counted); None: not
        a stream."""
        return self._data_lines - self._done_lines if self.streamed else None
