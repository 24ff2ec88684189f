"""Response bodies of the simulated pool, in each API's own shape, JSON or SSE.

What lives here: `Usage`, `frame_for` and one frame class per API family: OpenAI chat and
completions (chunks, the optional usage chunk, `[DONE]`), the Responses API (`response.*`
events, usage in `response.completed`), Anthropic's Messages API (`message_start` with the
input tokens, `content_block_delta` per token, `message_delta` with the output tokens) and
embeddings (JSON only). Only shapes: no timing, no aiohttp.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from sim._openai import Endpoint

DONE_EVENT = b"data: [DONE]\n\n"
_FILLER_WORDS = (
    "the", "fleet", "serves", "tokens", "under", "load", "while", "budgets", "hold",
    "and", "breakers", "watch", "tail", "latency", "so", "every", "tenant", "keeps", "its", "SLO",
)  # fmt: skip


def filler_token(index: int) -> str:
    return " " + _FILLER_WORDS[index % len(_FILLER_WORDS)]


def error_body(message: str, error_type: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code}}


def anthropic_error_body(message: str, error_type: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _event(name: str | None, body: dict[str, Any]) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(body).encode() + b"\n\n"


class Frame(Protocol):
    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes: ...
    def stream_open(self, include_usage: bool) -> bytes: ...
    def stream_token(self, text: str, include_usage: bool) -> bytes: ...
    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes: ...


@dataclass(frozen=True, slots=True)
class OpenAiFrame:
    """Chat completions and completions: `chat.completion(.chunk)` / `text_completion`."""

    chat: bool
    response_id: str
    model: str
    created_s: int

    def _head(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created_s,
            "model": self.model,
        }

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes:
        if self.chat:
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
        body["usage"] = usage_body(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        )
        return json.dumps(body).encode()

    def _chunk(self, choices: list[dict[str, Any]], with_usage_field: bool) -> bytes:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = choices
        if with_usage_field:
            # OpenAI: with include_usage every chunk carries "usage": null except the last.
            body["usage"] = None
        return _event(None, body)

    def _choice(self, text: str | None, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def stream_open(self, include_usage: bool) -> bytes:
        if not self.chat:
            return b""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._chunk([choice], include_usage)

    def stream_token(self, text: str, include_usage: bool) -> bytes:
        return self._chunk([self._choice(text, None)], include_usage)

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        out = self._chunk([self._choice(None, finish_reason)], include_usage)
        if include_usage:
            body = self._head("chat.completion.chunk" if self.chat else "text_completion")
            body["choices"] = []
            body["usage"] = usage_body(
                usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
            )
            out += _event(None, body)
        return out + DONE_EVENT


@dataclass(frozen=True, slots=True)
class ResponsesFrame:
    """The Responses API: a `response` object; streams are `response.*` events."""

    response_id: str
    model: str
    created_s: int

    def _response(self, status: str, text: str | None, usage: Usage | None) -> dict[str, Any]:
        output = []
        if text is not None:
            content = [{"type": "output_text", "text": text, "annotations": []}]
            output.append(
                {
                    "type": "message",
                    "id": "msg_" + self.response_id[5:],
                    "status": "completed",
                    "role": "assistant",
                    "content": content,
                }
            )
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_s,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": None
            if usage is None
            else {
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
        }

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes:
        status = "incomplete" if finish_reason == "length" else "completed"
        return json.dumps(self._response(status, text, usage)).encode()

    def stream_open(self, include_usage: bool) -> bytes:
        created = {
            "type": "response.created",
            "response": self._response("in_progress", None, None),
        }
        added = {"type": "response.content_part.added", "output_index": 0, "content_index": 0}
        return _event("response.created", created) + _event("response.content_part.added", added)

    def stream_token(self, text: str, include_usage: bool) -> bytes:
        delta = {"type": "response.output_text.delta", "output_index": 0, "delta": text}
        return _event("response.output_text.delta", delta)

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        status = "incomplete" if finish_reason == "length" else "completed"
        completed = {"type": "response.completed", "response": self._response(status, "", usage)}
        return _event("response.completed", completed)


@dataclass(frozen=True, slots=True)
class MessagesFrame:
    """Anthropic's Messages API: a `message` object; streams are `message_*` events."""

    response_id: str
    model: str
    prompt_tokens: int

    def _message(self, text: str | None, stop: str | None, output_tokens: int) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [] if text is None else [{"type": "text", "text": text}],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": output_tokens},
        }

    @staticmethod
    def _stop(finish_reason: str) -> str:
        return "max_tokens" if finish_reason == "length" else "end_turn"

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes:
        body = self._message(text, self._stop(finish_reason), usage.completion_tokens)
        return json.dumps(body).encode()

    def stream_open(self, include_usage: bool) -> bytes:
        start = {"type": "message_start", "message": self._message(None, None, 1)}
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
        return _event("message_start", start) + _event("content_block_start", block)

    def stream_token(self, text: str, include_usage: bool) -> bytes:
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }
        return _event("content_block_delta", delta)

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        stop = {"type": "content_block_stop", "index": 0}
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop(finish_reason), "stop_sequence": None},
            "usage": {"output_tokens": usage.completion_tokens},
        }
        return (
            _event("content_block_stop", stop)
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )


@dataclass(frozen=True, slots=True)
class EmbeddingsFrame:
    model: str

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes:
        body = {
            "object": "list",
            "data": [{"object": "embedding", "embedding": [0.0] * 8, "index": 0}],
            "model": self.model,
            "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens},
        }
        return json.dumps(body).encode()

    def stream_open(self, include_usage: bool) -> bytes:
        raise ValueError("embeddings do not stream")

    def stream_token(self, text: str, include_usage: bool) -> bytes:
        raise ValueError("embeddings do not stream")

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        raise ValueError("embeddings do not stream")


def frame_for(endpoint: Endpoint, model: str, prompt_tokens: int) -> Frame:
    created = int(time.time())
    suffix = uuid.uuid4().hex[:24]
    if endpoint is Endpoint.RESPONSES:
        return ResponsesFrame("resp_" + suffix, model, created)
    if endpoint is Endpoint.MESSAGES:
        return MessagesFrame("msg_" + suffix, model, prompt_tokens)
    if endpoint is Endpoint.EMBEDDINGS:
        return EmbeddingsFrame(model)
    chat = endpoint is Endpoint.CHAT
    return OpenAiFrame(chat, ("chatcmpl-" if chat else "cmpl-") + suffix, model, created)
