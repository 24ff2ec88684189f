"""Request bodies the simulated pool accepts, as vLLM 0.32 does: parsing into one shape.

The APIs: OpenAI chat completions and completions, the Responses API, Anthropic's Messages API,
embeddings (and /invocations, routed to chat or completions by its payload). Only shapes live
here: no sleeping, no KV accounting, no aiohttp; response bodies are in `sim.server._frames`.
Token counts are a cheap approximation (ceil(utf-8 bytes / 4), +4 per chat message) unless the
pool counts with DeepSeek's vocabulary (`sim.server.config.PoolConfig.tokenizer`).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.server._event_frames import responses_settings
from sim.server.model import PromptSegment, chain_segments

DEFAULT_MAX_TOKENS = 256
_TOKENS_PER_MESSAGE = 4
# Completion prompts are split into blocks this many bytes long for prefix caching.
_PROMPT_BLOCK_BYTES = 1_024
_FILLER_WORDS = (
    "the", "fleet", "serves", "tokens", "under", "load", "while", "budgets", "hold",
    "and", "breakers", "watch", "tail", "latency", "so", "every", "tenant", "keeps", "its", "SLO",
)  # fmt: skip


class Endpoint(enum.Enum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    MESSAGES = "messages"
    EMBEDDINGS = "embeddings"

    @property
    def generates(self) -> bool:
        return self is not Endpoint.EMBEDDINGS


class RequestError(ValueError):
    """A client mistake; becomes an HTTP 400 invalid_request_error."""

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    # The raw `stream_options` object (None when absent), echoed back for tests.
    stream_options: dict[str, Any] | None
    # vLLM extension: keep generating until max_tokens; makes completion length exact.
    ignore_eos: bool
    segments: tuple[PromptSegment, ...]
    # The `model` the client asked for (echoed back for tests; the pool serves its own).
    requested_model: str | None = None
    # The output limit as the body named it (None: not named), echoed back for tests.
    named_max_tokens: int | None = None
    priority: int = 0  # vLLM's scheduling priority (lower runs first)
    # The Responses API: the settings the request named, which its response object repeats.
    settings: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    # The request named `reasoning_effort` (a reasoning model's setting): half of what the
    # pool generates is reported as reasoning (usage.completion_tokens_details).
    reasoning: bool = False
    # A chat's messages as (role, text), for a paged cache that tokenizes the chat as the
    # engine would; empty for the other APIs.
    chat: tuple[tuple[str, str], ...] = ()


Counter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A cheap stand-in for a tokenizer: a quarter of the UTF-8 bytes. Pools started with
    `--tokenizer deepseek` count with the real vocabulary instead (crafted prompts cost the
    engine what they would cost vLLM)."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def _content_text(content: Any) -> str:
    """Text of a chat message content: a string, or a list of parts (non-text parts as JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, sort_keys=True))
        return "".join(parts)
    raise RequestError("message content must be a string or a list of parts")


def _chat_pieces(body: dict[str, Any], count: Counter) -> list[tuple[str, int]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "missing_messages")
    pieces: list[tuple[str, int]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
        text = _content_text(message.get("content"))
        pieces.append((message["role"] + "\x00" + text, count(text) + _TOKENS_PER_MESSAGE))
    return pieces


def _completion_pieces(body: dict[str, Any], count: Counter) -> list[tuple[str, int]]:
    """Pieces of a `prompt`: a string, a list of strings, token ids, or lists of token ids.

    A list of several prompts is served as one concatenated prompt with one choice.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = [prompt] if all(isinstance(p, int) for p in prompt) else prompt
    else:
        raise RequestError("'prompt' must be a non-empty string or list", "missing_prompt")
    pieces: list[tuple[str, int]] = []
    for item in prompts:
        if isinstance(item, str):
            raw = item.encode("utf-8")
            for start in range(0, max(len(raw), 1), _PROMPT_BLOCK_BYTES):
                block = raw[start : start + _PROMPT_BLOCK_BYTES]
                text = block.decode("utf-8", "replace")
                pieces.append((text, count(text)))
        elif isinstance(item, list) and all(isinstance(t, int) for t in item):
            pieces.append((",".join(map(str, item)), len(item)))
        else:
            raise RequestError("'prompt' items must be strings or lists of token ids")
    return pieces


def _texts_of(value: Any) -> str:
    """Every string inside an item except its structural members (type, role, ids)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (_texts_of(v) for v in value) if t)
    if isinstance(value, dict):
        skip = {"type", "role", "id", "call_id", "status"}
        return "\n".join(t for k, v in value.items() if k not in skip for t in [_texts_of(v)] if t)
    return ""


def _text_pieces(texts: list[str], count: Counter) -> list[tuple[str, int]]:
    return [(text, count(text) + _TOKENS_PER_MESSAGE) for text in texts]


def _responses_pieces(body: dict[str, Any], count: Counter) -> list[tuple[str, int]]:
    items = body.get("input")
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be a non-empty string or list", "missing_input")
    texts = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    return _text_pieces(texts + [_texts_of(item) for item in items], count)


def _messages_pieces(body: dict[str, Any], count: Counter) -> list[tuple[str, int]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: Field required", "missing_messages")
    texts = [_texts_of(body["system"])] if body.get("system") else []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
        texts.append(_texts_of(message.get("content")))
    return _text_pieces(texts, count)


def _embeddings_pieces(body: dict[str, Any], count: Counter) -> list[tuple[str, int]]:
    return _completion_pieces({"prompt": body.get("input")}, count)


_PIECES = {
    Endpoint.CHAT: _chat_pieces,
    Endpoint.COMPLETIONS: _completion_pieces,
    Endpoint.RESPONSES: _responses_pieces,
    Endpoint.MESSAGES: _messages_pieces,
    Endpoint.EMBEDDINGS: _embeddings_pieces,
}
# What each API generates when the request names no limit (vLLM: completions 16; the
# simulator's stand-in for "the rest of the model's window" elsewhere).
_LIMIT_MEMBERS = {
    Endpoint.CHAT: ("max_completion_tokens", "max_tokens"),
    Endpoint.COMPLETIONS: ("max_tokens",),
    Endpoint.RESPONSES: ("max_output_tokens",),
    Endpoint.MESSAGES: ("max_tokens",),
    Endpoint.EMBEDDINGS: (),
}
_DEFAULT_LIMITS = {Endpoint.COMPLETIONS: 16, Endpoint.EMBEDDINGS: 0}


def _max_tokens(body: dict[str, Any], endpoint: Endpoint) -> int:
    for key in _LIMIT_MEMBERS[endpoint]:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"'{key}' must be a positive integer", "invalid_max_tokens")
        return value
    if endpoint is Endpoint.MESSAGES:
        raise RequestError("max_tokens: Field required", "missing_max_tokens")
    return _DEFAULT_LIMITS.get(endpoint, DEFAULT_MAX_TOKENS)


def invocation_endpoint(raw: bytes) -> Endpoint:
    """vLLM's /invocations: a chat payload (`messages`) or a completion one (`prompt`)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}", "invalid_json") from exc
    if isinstance(body, dict) and "messages" in body:
        return Endpoint.CHAT
    if isinstance(body, dict) and "prompt" in body:
        return Endpoint.COMPLETIONS
    raise RequestError("an invocation needs 'messages' or 'prompt'", "invalid_invocation")


def parse_request(raw: bytes, endpoint: Endpoint, count: Counter | None = None) -> ParsedRequest:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}", "invalid_json") from exc
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", "invalid_json")
    pieces = _PIECES[endpoint](body, count or approx_tokens)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise RequestError("'stream_options' must be an object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean")
    return ParsedRequest(
        endpoint=endpoint,
        prompt_tokens=sum(tokens for _, tokens in pieces),
        max_tokens=_max_tokens(body, endpoint),
        stream=stream and endpoint.generates,
        include_usage=bool(stream_options and stream_options.get("include_usage") is True),
        stream_options=stream_options,
        ignore_eos=body.get("ignore_eos") is True,
        segments=tuple(chain_segments(pieces)),
        requested_model=body["model"] if isinstance(body.get("model"), str) else None,
        named_max_tokens=next(
            (body[k] for k in _LIMIT_MEMBERS[endpoint] if isinstance(body.get(k), int)), None
        ),
        priority=_priority(body),
        settings=responses_settings(body) if endpoint is Endpoint.RESPONSES else None,
        reasoning=body.get("reasoning_effort") is not None,
        chat=tuple(_role_text(text) for text, _ in pieces) if endpoint is Endpoint.CHAT else (),
    )


def _role_text(piece: str) -> tuple[str, str]:
    role, _, text = piece.partition("\x00")  # a chat piece is role NUL text
    return role, text


def _priority(body: dict[str, Any]) -> int:
    value = body.get("priority", 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError("'priority' must be an integer")
    return value
