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


# vLLM names its error types after the HTTP status (OpenAI's API names them by kind).
_VLLM_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error document: `type` from the status, `code` the status itself."""
    error_type = _VLLM_ERROR_TYPES.get(status, "InternalServerError")
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def anthropic_error_body(message: str, error_type: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def body(self, details: dict[str, Any]) -> dict[str, Any]:
        """vLLM's usage object (its field order), `prompt_tokens_details` as given."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, **details},
        }


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()  # compact, as vLLM writes


def _event(name: str | None, body: dict[str, Any]) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + _dumps(body) + b"\n\n"


class Frame(Protocol):
    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes: ...
    def stream_open(self, include_usage: bool) -> bytes: ...
    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes: ...
    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes: ...


FINGERPRINT = "sim-slogate"  # vLLM's reads vllm-<version>-<hash>


@dataclass(frozen=True, slots=True)
class OpenAiFrame:
    """Chat completions and completions, in vLLM's shapes (held to a real vLLM by
    tests/test_sim_matches_vllm.py): its vLLM-only fields (`prompt_token_ids`,
    `kv_transfer_params`, ...) as null, `finish_reason` on the last token's chunk, the usage
    chunk (`choices: []`) only when asked for, and no `usage: null` on the other chunks
    (OpenAI's API adds those; vLLM does not)."""

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
        tail = {"stop_reason": None, "token_ids": None}
        if self.chat:
            message = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                **tail,
                "routed_experts": None,
            }
            body = self._head("chat.completion")
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                **tail,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            body = self._head("text_completion")
        body["choices"] = [choice]
        body["service_tier"] = None
        body["system_fingerprint"] = FINGERPRINT
        body["usage"] = {
            **usage.body({"created_cache_tokens": 0, "multimodal_tokens": None}),
            "completion_tokens_details": None,
        }
        if self.chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return _dumps(body)

    def stream_open(self, include_usage: bool) -> bytes:
        if not self.chat:
            return b""
        body = self._head("chat.completion.chunk")
        delta = {"role": "assistant", "content": ""}
        body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        body.update(prompt_token_ids=None, prompt_text=None)
        return _event(None, body)

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None}
            choice["finish_reason"] = finish_reason
            if finish_reason is not None:
                choice["stop_reason"] = None
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            choice.update(stop_reason=None, prompt_token_ids=None)
        choice["token_ids"] = None
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = [choice]
        if finish_reason is not None and not include_usage:
            body["system_fingerprint"] = FINGERPRINT  # else on the usage chunk, as vLLM does
        return _event(None, body)

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        """What follows the last token (which carried `finish_reason`)."""
        out = b""
        if include_usage:
            body = self._head("chat.completion.chunk" if self.chat else "text_completion")
            body["choices"] = []
            # vLLM's streamed usage: created_cache_tokens only in chat.
            body["usage"] = usage.body({"created_cache_tokens": 0} if self.chat else {})
            body["system_fingerprint"] = FINGERPRINT
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

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
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

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
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

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
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
