"""Where a response stream's first output is: the event that carries its first token.

What lives here: `FirstOutput`, fed a response body chunk by chunk, which says which chunk
carried the stream's first output event. A stream's first byte is not its first token: a
Responses stream sends `response.created` and `response.in_progress` as soon as it starts,
before any token, so timing its first byte reads a TTFT of ~0. Only the endpoint picker
protocol's streaming mode sends response chunks to the sidecar
(extproc.service.streamed_mode); slogate's own Envoy does the same inside Envoy
(usage_tap.lua spells the same rules in Lua: change both or neither). Pure and bounded.

The rules, by API (the stream's first events name it; until they have, nothing is output,
since a Responses stream's opening events echo the request's metadata and tools):
- chat (`chat.completion.chunk`): a delta with text, reasoning or a tool call, not the
  opening `{"role":"assistant","content":""}`; completions (`text_completion`): text;
- Responses (`response.*`): any `response.*delta` event (output text, reasoning, function
  call arguments...), not created / in_progress / output_item.added / content_part.added;
- Anthropic Messages (`message_start`): the first `content_block_delta`.
A bare quote is needed: JSON-escaped text (\\"content\\":...) cannot match.
"""

from __future__ import annotations

import re

# The tail of the previous chunk searched again with the next: a marker may straddle two.
TAIL_BYTES = 96

_STREAM_APIS: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("responses", re.compile(rb'"type":\s*"response\.')),
    ("messages", re.compile(rb'"type":\s*"message_start"')),
    ("openai", re.compile(rb'"object":\s*"(?:chat\.completion\.chunk|text_completion)"')),
)
_OUTPUT_EVENTS: dict[str, re.Pattern[bytes]] = {
    "responses": re.compile(rb'"type":\s*"response\.[\w.]*delta"'),
    "messages": re.compile(rb'"type":\s*"content_block_delta"'),
    "openai": re.compile(
        rb'"(?:content|reasoning_content|reasoning|text)":\s*"[^"]|"tool_calls":\s*\[\s*\{'
    ),
}


class FirstOutput:
    """One response's body, fed in order: `feed` is True for the chunk that carried its
    first output event, once; a JSON body (no SSE `data:` line) never has one."""

    def __init__(self) -> None:
        self._tail = b""
        self._api: str | None = None
        self._streamed = False
        self.seen = False

    def feed(self, chunk: bytes) -> bool:
        if self.seen:
            return False
        data = self._tail + chunk
        self._tail = data[-TAIL_BYTES:]
        self._streamed = self._streamed or b"data:" in data
        if not self._streamed:
            return False
        if self._api is None:
            self._api = next((api for api, marker in _STREAM_APIS if marker.search(data)), None)
            if self._api is None:
                return False
        self.seen = _OUTPUT_EVENTS[self._api].search(data) is not None
        return self.seen
