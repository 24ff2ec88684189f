"""OpenAI wire format for the simulated pool: request parsing and response/SSE bodies.

Only shapes live here: no sleeping, no KV accounting, no aiohttp. Token counts are a cheap
approximation (ceil(utf-8 bytes / 4), +4 per chat message), not a tokenizer.
"""

from __future__ import annotations

import enum
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from sim.model import PromptSegment, chain_segments

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


def approx_tokens(text: str) -> int:
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


def _chat_pieces(body: dict[str, Any]) -> list[tuple[str, int]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "missing_messages")
    pieces: list[tuple[str, int]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
        text = _content_text(message.get("content"))
        pieces.append((message["role"] + "\x00" + text, approx_tokens(text) + _TOKENS_PER_MESSAGE))
    return pieces


def _completion_pieces(body: dict[str, Any]) -> list[tuple[str, int]]:
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
                pieces.append((block.decode("utf-8", "replace"), math.ceil(len(block) / 4)))
        elif isinstance(item, list) and all(isinstance(t, int) for t in item):
            pieces.append((",".join(map(str, item)), len(item)))
        else:
            raise RequestError("'prompt' items must be strings or lists of token ids")
    return pieces


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"'{key}' must be a positive integer", "invalid_max_tokens")
        return value
    return DEFAULT_MAX_TOKENS


def parse_request(raw: bytes, endpoint: Endpoint) -> ParsedRequest:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}", "invalid_json") from exc
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", "invalid_json")
    pieces = _chat_pieces(body) if endpoint is Endpoint.CHAT else _completion_pieces(body)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise RequestError("'stream_options' must be an object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean")
    return ParsedRequest(
        endpoint=endpoint,
        prompt_tokens=sum(tokens for _, tokens in pieces),
        max_tokens=_max_tokens(body),
        stream=stream,
        include_usage=bool(stream_options and stream_options.get("include_usage") is True),
        stream_options=stream_options,
        ignore_eos=body.get("ignore_eos") is True,
        segments=tuple(chain_segments(pieces)),
        requested_model=body["model"] if isinstance(body.get("model"), str) else None,
    )


def filler_token(index: int) -> str:
    return " " + _FILLER_WORDS[index % len(_FILLER_WORDS)]


def error_body(message: str, error_type: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code}}


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True, slots=True)
class ResponseFrame:
    """Fields shared by every body of one response."""

    endpoint: Endpoint
    response_id: str
    model: str
    created_s: int

    @classmethod
    def new(cls, endpoint: Endpoint, response_id: str, model: str) -> ResponseFrame:
        return cls(endpoint, response_id, model, int(time.time()))

    def _head(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created_s,
            "model": self.model,
        }

    def full_response(self, text: str, finish_reason: str, usage: dict[str, Any]) -> bytes:
        if self.endpoint is Endpoint.CHAT:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("text_completion")
        body["choices"] = [choice]
        body["usage"] = usage
        return json.dumps(body).encode()

    def _chunk(self, choices: list[dict[str, Any]], with_usage_field: bool) -> bytes:
        name = "chat.completion.chunk" if self.endpoint is Endpoint.CHAT else "text_completion"
        body = self._head(name)
        body["choices"] = choices
        if with_usage_field:
            # OpenAI: with include_usage every chunk carries "usage": null except the last.
            body["usage"] = None
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    def role_chunk(self, with_usage_field: bool) -> bytes:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._chunk([choice], with_usage_field)

    def token_chunk(self, token_text: str, with_usage_field: bool) -> bytes:
        return self._chunk([self._stream_choice(token_text, None)], with_usage_field)

    def finish_chunk(self, finish_reason: str, with_usage_field: bool) -> bytes:
        return self._chunk([self._stream_choice(None, finish_reason)], with_usage_field)

    def _stream_choice(self, token_text: str | None, finish_reason: str | None) -> dict[str, Any]:
        if self.endpoint is Endpoint.CHAT:
            delta = {} if token_text is None else {"content": token_text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        text = "" if token_text is None else token_text
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        name = "chat.completion.chunk" if self.endpoint is Endpoint.CHAT else "text_completion"
        body = self._head(name)
        body["choices"] = []
        body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
