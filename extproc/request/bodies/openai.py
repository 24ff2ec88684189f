"""OpenAI-shaped bodies: chat completions, completions, embeddings, and /invocations.

What lives here: the typed schemas (msgspec, so decoding and type checks run in C) of the
fields slogate needs, and one reader per shape returning an `InferenceRequest`. Everything
else passes through to the upstream untouched. Errors are `InvalidRequest` naming the field
(`$.max_tokens`).

What multiplies generation is read too: `n` and `best_of` completions per prompt (vLLM also
takes `use_beam_search` with `n` beams), one completion per prompt of a batched `prompt`
list, and `ignore_eos` / `min_tokens`, which make a request run to its limit.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from admission.errors import InvalidRequest
from extproc.request.bodies.request import InferenceRequest
from policy.apis import BodyShape

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


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


class _Sampling(msgspec.Struct):
    """What both generating shapes share: the output limit and what multiplies it."""

    model: str | None = None
    max_tokens: PositiveInt | msgspec.UnsetType | None = msgspec.UNSET
    n: PositiveInt | None = None
    best_of: PositiveInt | None = None
    use_beam_search: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: NonNegativeInt | None = None
    stream: bool | None = None
    # UNSET tells an absent member from an explicit null (splicing must not duplicate keys).
    stream_options: StreamOptions | msgspec.UnsetType | None = msgspec.UNSET
    priority: msgspec.Raw = msgspec.Raw()  # vLLM's scheduling priority: never the client's


class ChatCompletionBody(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | msgspec.UnsetType | None = msgspec.UNSET
    tools: msgspec.Raw = msgspec.Raw()


class CompletionBody(_Sampling, kw_only=True):
    prompt: str | list[str | int | list[int]]


class EmbeddingsBody(msgspec.Struct):
    input: str | list[str | int | list[int]]
    model: str | None = None
    priority: msgspec.Raw = msgspec.Raw()


_CHAT = msgspec.json.Decoder(ChatCompletionBody)
_COMPLETION = msgspec.json.Decoder(CompletionBody)
_EMBEDDINGS = msgspec.json.Decoder(EmbeddingsBody)


class _Probe(msgspec.Struct):
    """Which OpenAI shape an /invocations payload is: only the members' presence matters."""

    messages: msgspec.Raw = msgspec.Raw()
    prompt: msgspec.Raw = msgspec.Raw()


_PROBE = msgspec.json.Decoder(_Probe)


def _raw_text(raw: msgspec.Raw) -> str:
    text = bytes(raw).decode("utf-8", "replace")
    return "" if text == "null" else text


def _unset_none(value: int | msgspec.UnsetType | None) -> int | None:
    return None if value is msgspec.UNSET else value


def _sequences(body: _Sampling) -> int:
    return max(body.n or 1, body.best_of or 1)


def _runs_to_limit(body: _Sampling, max_tokens: int | None) -> bool:
    if body.ignore_eos:
        return True
    return body.min_tokens is not None and max_tokens is not None and body.min_tokens >= max_tokens


def _wants_usage(options: StreamOptions | msgspec.UnsetType | None) -> bool:
    return isinstance(options, StreamOptions) and bool(options.include_usage)


def read_chat(body: bytes, shape: BodyShape = BodyShape.CHAT) -> InferenceRequest:
    chat = _CHAT.decode(body)
    texts: list[str] = []
    head = 0  # through the first user message: what every turn of the chat resends
    for message in chat.messages:
        if not head and message.role == "user":
            head = len(texts) + 1
        parts: list[str] = []
        if isinstance(message.content, str):
            parts.append(message.content)
        elif message.content is not None:
            parts.extend(p.text for p in message.content if p.text)
        tool_calls = _raw_text(message.tool_calls)
        if tool_calls:
            parts.append(tool_calls)
        texts.append("".join(parts) if len(parts) != 1 else parts[0])
    tools = _raw_text(chat.tools)
    if tools:
        texts.append(tools)
    named = _unset_none(chat.max_completion_tokens) or _unset_none(chat.max_tokens)
    return InferenceRequest(
        shape=BodyShape.CHAT,
        model=chat.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=0,
        max_tokens=named,
        sequences=_sequences(chat),
        stream=bool(chat.stream),
        wants_usage=_wants_usage(chat.stream_options),
        has_stream_options=chat.stream_options is not msgspec.UNSET,
        has_limit_member=(
            chat.max_tokens is not msgspec.UNSET or chat.max_completion_tokens is not msgspec.UNSET
        ),
        runs_to_limit=_runs_to_limit(chat, named),
        has_priority=bool(chat.priority),
        conversation_texts=head or len(chat.messages),
        chat_roles=_plain_roles(chat, tools),
    )


def _plain_roles(chat: ChatCompletionBody, tools: str) -> tuple[str, ...]:
    """Each message's role where the chat is plain text (see InferenceRequest.chat_roles)."""
    if tools or not all(
        isinstance(message.content, str) and not _raw_text(message.tool_calls)
        for message in chat.messages
    ):
        return ()
    return tuple(message.role for message in chat.messages)


def _prompt_parts(
    prompt: str | list[str | int | list[int]], field: str
) -> tuple[list[str], int, int]:
    """(texts, token ids, prompts) of a `prompt` / `input`: a string, a list of strings, a
    list of token ids, or a list of such lists; each list entry is one prompt."""
    if isinstance(prompt, list) and not prompt:
        raise InvalidRequest(f"Invalid request body: `$.{field}` is empty", reason="invalid_field")
    if isinstance(prompt, str):
        return [prompt], 0, 1
    if all(isinstance(p, int) for p in prompt):
        return [], len(prompt), 1  # one prompt given as token ids
    texts: list[str] = []
    token_ids = 0
    for item in prompt:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, list):
            token_ids += len(item)
        else:
            raise InvalidRequest(
                f"Invalid request body: `$.{field}` mixes token ids and strings",
                reason="invalid_field",
            )
    return texts, token_ids, len(prompt)


def read_completion(body: bytes) -> InferenceRequest:
    completion = _COMPLETION.decode(body)
    texts, token_ids, prompts = _prompt_parts(completion.prompt, "prompt")
    named = _unset_none(completion.max_tokens)
    return InferenceRequest(
        shape=BodyShape.COMPLETION,
        model=completion.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=token_ids,
        max_tokens=named,
        # A list of prompts is a batch: the engine completes each one, n times.
        sequences=prompts * _sequences(completion),
        stream=bool(completion.stream),
        wants_usage=_wants_usage(completion.stream_options),
        has_stream_options=completion.stream_options is not msgspec.UNSET,
        has_limit_member=completion.max_tokens is not msgspec.UNSET,
        runs_to_limit=_runs_to_limit(completion, named),
        has_priority=bool(completion.priority),
    )


def read_embeddings(body: bytes) -> InferenceRequest:
    embeddings = _EMBEDDINGS.decode(body)
    texts, token_ids, _ = _prompt_parts(embeddings.input, "input")
    return InferenceRequest(
        shape=BodyShape.EMBEDDINGS,
        model=embeddings.model,
        prompt_texts=tuple(texts),
        prompt_token_ids=token_ids,
        max_tokens=None,
        generates=False,
        has_priority=bool(embeddings.priority),
    )


def read_invocation(body: bytes) -> InferenceRequest:
    """vLLM's SageMaker-style endpoint: a chat payload (`messages`) or a completion one
    (`prompt`), told apart the way the engine does, by which member is present."""
    probe = _PROBE.decode(body)
    if bytes(probe.messages):
        return read_chat(body)
    if bytes(probe.prompt):
        return read_completion(body)
    raise InvalidRequest(
        "Invalid request body: an invocation needs `messages` (chat) or `prompt` (completion).",
        reason="invalid_field",
    )
