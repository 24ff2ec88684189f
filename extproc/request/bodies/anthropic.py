"""The Anthropic Messages API body (`POST /v1/messages`), which vLLM also serves.

What lives here: the typed top-level fields and `read_messages`. `system` is a string or a
list of text blocks; each message's `content` is a string or a list of blocks (text,
tool_use with its `input`, tool_result with its `content`, thinking); every content string
counts as prompt, and so do `tools`. `max_tokens` is required, as in Anthropic's API.
Usage comes back as `input_tokens` / `output_tokens` (see usage_tap.lua).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from admission.errors import InvalidRequest
from extproc.request.bodies.request import InferenceRequest, collect_texts
from policy.apis import BodyShape

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class AnthropicMessage(msgspec.Struct):
    role: str
    content: str | list[Any] | None = None


class MessagesBody(msgspec.Struct):
    messages: list[AnthropicMessage] | None = None
    model: str | None = None
    max_tokens: PositiveInt | None = None
    system: str | list[Any] | None = None
    stream: bool | None = None
    tools: msgspec.Raw = msgspec.Raw()
    priority: msgspec.Raw = msgspec.Raw()  # vLLM's scheduling priority: never the client's


_MESSAGES = msgspec.json.Decoder(MessagesBody)


def read_messages(body: bytes) -> InferenceRequest:
    request = _MESSAGES.decode(body)
    if not request.messages:
        raise InvalidRequest("messages: Field required", reason="invalid_field")
    if request.max_tokens is None:
        raise InvalidRequest("max_tokens: Field required", reason="invalid_field")
    texts: list[str] = []
    if request.system:
        texts.append("\n".join(collect_texts(request.system)))
    for message in request.messages:
        texts.append("\n".join(collect_texts(message.content)))
    tools = bytes(request.tools).decode("utf-8", "replace")
    if tools and tools != "null":
        texts.append(tools)
    return InferenceRequest(
        shape=BodyShape.MESSAGES,
        model=request.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=0,
        max_tokens=request.max_tokens,
        stream=bool(request.stream),
        has_limit_member=True,
        has_priority=bool(request.priority),
        conversation_texts=2 if request.system else 1,  # the system prompt, the first turn
    )
