"""The one place that changes a body before it goes upstream.

Three changes, each only when needed:
- a stream of chat or completions without `stream_options.include_usage` gets it, or the
  stream would never report its usage and could not be settled;
- a request that names no output limit gets the one slogate charged for (`max_tokens`, or
  `max_output_tokens` for the Responses API), so the engine cannot generate past the
  reservation (vLLM's own default is the model's length minus the prompt);
- at breaker L3 the `model` is rewritten to the fallback model;
- vLLM's scheduling `priority` comes from the caller's tier, never from the client: written
  for a pool that declares `priority_scheduling` (lower runs first), and a client's own
  removed elsewhere (it would jump the engine's queue, or be refused by an engine that
  does not schedule by priority).
Absent members are spliced in after the opening brace (one copy, no re-encoding of a
possibly multi-megabyte prompt); a member that is present (say `max_tokens: null`) is
replaced by re-encoding, so a key is never duplicated.
"""

from __future__ import annotations

from typing import Any

import msgspec

from extproc.request.bodies.request import InferenceRequest
from policy.apis import BodyShape

_LIMIT_MEMBER = {
    BodyShape.CHAT: "max_tokens",
    BodyShape.COMPLETION: "max_tokens",
    BodyShape.RESPONSES: "max_output_tokens",
    BodyShape.MESSAGES: "max_tokens",
}
_USAGE_SHAPES = frozenset({BodyShape.CHAT, BodyShape.COMPLETION})


def adds_usage(request: InferenceRequest) -> bool:
    """slogate asks the stream for its usage itself (the Lua tap then hides it again)."""
    return request.stream and request.shape in _USAGE_SHAPES and not request.wants_usage


def rewritten_body(
    body: bytes,
    request: InferenceRequest,
    charged_max_tokens: int | None = None,
    model: str | None = None,
    priority: int | None = None,
) -> bytes | None:
    """The body to forward, or None when it goes unchanged. `priority`: the engine
    priority to write (None: the pool does not schedule by priority)."""
    spliced: dict[str, Any] = {}
    replaced: dict[str, Any] = {}
    if priority is not None:
        (replaced if request.has_priority else spliced)["priority"] = priority
    if adds_usage(request):
        if request.has_stream_options:
            replaced["stream_options"] = {"include_usage": True}  # merged below
        else:
            spliced["stream_options"] = {"include_usage": True}
    if charged_max_tokens is not None and request.max_tokens is None and request.generates:
        member = _LIMIT_MEMBER[request.shape]
        (replaced if request.has_limit_member else spliced)[member] = charged_max_tokens
    if model is not None:
        replaced["model"] = model
    if replaced or (request.has_priority and priority is None):
        document = msgspec.json.decode(body)
        if priority is None:
            document.pop("priority", None)
        options = replaced.pop("stream_options", None)
        if options is not None:
            document["stream_options"] = {**(document.get("stream_options") or {}), **options}
        document.update(replaced)
        document.update(spliced)
        return msgspec.json.encode(document)
    if not spliced:
        return None
    members = msgspec.json.encode(spliced)[1:-1]  # '"a":1,"b":2'
    brace = body.index(b"{")  # the decoder already proved the body is a JSON object
    rest = body[brace + 1 :]
    separator = b"" if rest.lstrip().startswith(b"}") else b","
    return body[: brace + 1] + members + separator + rest
