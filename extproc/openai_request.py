"""Decoding OpenAI-style inference bodies into what slogate decides on.

What lives here: the typed body schemas (msgspec, so decoding and type checks run in C) and
`parse_inference_body`, which returns an `InferenceRequest` or raises `InvalidRequest`.
Only the fields slogate needs are typed; everything else passes through to the upstream
untouched. No token counting and no policy here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import msgspec

from extproc.errors import InvalidRequest

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
INFERENCE_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    # Tool calls count towards the prompt; kept raw so their shape is the upstream's business.
    tool_calls: msgspec.Raw = msgspec.Raw()  # empty when absent


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class ChatCompletionBody(msgspec.Struct):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    model: str | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    stream: bool | None = None
    # UNSET tells an absent member from an explicit null (splicing must not duplicate keys).
    stream_options: StreamOptions | msgspec.UnsetType | None = msgspec.UNSET
    tools: msgspec.Raw = msgspec.Raw()


class CompletionBody(msgspec.Struct):
    prompt: str | list[str | int | list[int]]
    model: str | None = None
    max_tokens: PositiveInt | None = None
    stream: bool | None = None
    stream_options: StreamOptions | msgspec.UnsetType | None = msgspec.UNSET


_CHAT_DECODER = msgspec.json.Decoder(ChatCompletionBody)
_COMPLETION_DECODER = msgspec.json.Decoder(CompletionBody)


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """The parts of one inference body that routing and budgets need."""

    path: str
    model: str | None
    prompt_texts: tuple[str, ...]  # one entry per message / prompt, in order
    prompt_token_ids: int  # prompts already given as token ids (exact count)
    max_tokens: int | None
    stream: bool
    wants_usage: bool  # stream_options.include_usage already true
    has_stream_options: bool

    @property
    def prompt_chars(self) -> int:
        return sum(len(t) for t in self.prompt_texts)


def parse_inference_body(path: str, body: bytes) -> InferenceRequest:
    try:
        if path == CHAT_PATH:
            return _from_chat(path, _CHAT_DECODER.decode(body))
        return _from_completion(path, _COMPLETION_DECODER.decode(body))
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"Invalid request body: {exc}", reason="invalid_field") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc}", reason="malformed_json"
        ) from None
    except RecursionError:
        raise InvalidRequest(
            "The JSON body of your request is nested too deeply.", reason="malformed_json"
        ) from None


def _raw_text(raw: msgspec.Raw) -> str:
    text = bytes(raw).decode("utf-8", "replace")
    return "" if text == "null" else text


def _from_chat(path: str, body: ChatCompletionBody) -> InferenceRequest:
    texts: list[str] = []
    for message in body.messages:
        parts: list[str] = []
        if isinstance(message.content, str):
            parts.append(message.content)
        elif message.content is not None:
            parts.extend(p.text for p in message.content if p.text)
        tool_calls = _raw_text(message.tool_calls)
        if tool_calls:
            parts.append(tool_calls)
        texts.append("".join(parts) if len(parts) != 1 else parts[0])
    tools = _raw_text(body.tools)
    if tools:
        texts.append(tools)
    max_tokens = body.max_completion_tokens or body.max_tokens
    return InferenceRequest(
        path=path,
        model=body.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=0,
        max_tokens=max_tokens,
        stream=bool(body.stream),
        wants_usage=_wants_usage(body.stream_options),
        has_stream_options=body.stream_options is not msgspec.UNSET,
    )


def _from_completion(path: str, body: CompletionBody) -> InferenceRequest:
    texts: list[str] = []
    token_ids = 0
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if prompts and all(isinstance(p, int) for p in prompts):
        token_ids = len(prompts)  # a single prompt given as a list of token ids
    else:
        for prompt in prompts:
            if isinstance(prompt, str):
                texts.append(prompt)
            elif isinstance(prompt, list):
                token_ids += len(prompt)
            else:
                raise InvalidRequest(
                    "Invalid request body: `prompt` mixes token ids and strings",
                    reason="invalid_field",
                )
    return InferenceRequest(
        path=path,
        model=body.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=token_ids,
        max_tokens=body.max_tokens,
        stream=bool(body.stream),
        wants_usage=_wants_usage(body.stream_options),
        has_stream_options=body.stream_options is not msgspec.UNSET,
    )


def _wants_usage(options: StreamOptions | msgspec.UnsetType | None) -> bool:
    return isinstance(options, StreamOptions) and bool(options.include_usage)


def with_usage_requested(body: bytes, request: InferenceRequest) -> bytes | None:
    """The body with `stream_options.include_usage: true`, or None when no change is needed.

    Without that option a stream never reports its usage and the request could not be
    accounted. When the body has no `stream_options` yet, the member is spliced in after the
    opening brace (one copy, no re-encoding of a possibly multi-megabyte prompt).
    """
    if not request.stream or request.wants_usage:
        return None
    if not request.has_stream_options:
        brace = body.index(b"{")  # the decoder already proved the body is a JSON object
        return body[: brace + 1] + b'"stream_options":{"include_usage":true},' + body[brace + 1 :]
    document = msgspec.json.decode(body)
    options = document.get("stream_options")
    document["stream_options"] = {**(options or {}), "include_usage": True}
    return msgspec.json.encode(document)


def with_model(body: bytes, model: str) -> bytes:
    """The body with `model` replaced (the breaker's fallback model); re-encoded, rare."""
    document = msgspec.json.decode(body)
    document["model"] = model
    return msgspec.json.encode(document)
