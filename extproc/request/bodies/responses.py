"""The OpenAI Responses API body (`POST /v1/responses`).

What lives here: the typed top-level fields and `read_responses`. `input` is a string or a
list of items (messages with text parts, function calls and their outputs, reasoning
items); every content string of every item counts as prompt, and so do `instructions` and
`tools`. `max_output_tokens` is the output limit.

Two features cannot be metered from the body, so they are refused with a 400 rather than
forwarded half-counted: `previous_response_id` (the engine prepends a conversation it
stored, which slogate never saw) and `background` (the answer is fetched later from
`/v1/responses/{id}`, a path slogate does not forward).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from admission.errors import InvalidRequest
from extproc.request.bodies.request import InferenceRequest, collect_texts
from policy.apis import BodyShape

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class ResponsesBody(msgspec.Struct):
    input: str | list[Any] | None = None
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: PositiveInt | msgspec.UnsetType | None = msgspec.UNSET
    stream: bool | None = None
    tools: msgspec.Raw = msgspec.Raw()
    previous_response_id: str | None = None
    background: bool | None = None
    priority: msgspec.Raw = msgspec.Raw()  # vLLM's scheduling priority: never the client's


_RESPONSES = msgspec.json.Decoder(ResponsesBody)


def read_responses(body: bytes) -> InferenceRequest:
    request = _RESPONSES.decode(body)
    if request.input is None or request.input == [] or request.input == "":
        raise InvalidRequest("Invalid request body: `$.input` is required", reason="invalid_field")
    if request.previous_response_id:
        raise InvalidRequest(
            "`previous_response_id` is not supported through this gateway: the stored "
            "conversation cannot be metered. Send the whole conversation in `input`.",
            reason="unsupported_field",
        )
    if request.background:
        raise InvalidRequest(
            "`background` responses are not supported through this gateway.",
            reason="unsupported_field",
        )
    texts: list[str] = []
    if request.instructions:
        texts.append(request.instructions)
    if isinstance(request.input, str):
        texts.append(request.input)
    else:
        for item in request.input:
            text = "\n".join(collect_texts(item))
            if text:
                texts.append(text)
    tools = bytes(request.tools).decode("utf-8", "replace")
    if tools and tools != "null":
        texts.append(tools)
    limit = request.max_output_tokens
    return InferenceRequest(
        shape=BodyShape.RESPONSES,
        model=request.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=0,
        max_tokens=None if limit is msgspec.UNSET else limit,
        stream=bool(request.stream),
        has_limit_member=limit is not msgspec.UNSET,
        has_priority=bool(request.priority),
        conversation_texts=2 if request.instructions else 1,
    )
