"""Response bodies of the simulated pool, in each API's own shape, JSON or SSE.

What lives here: `frame_for`, the `Frame` protocol, OpenAI chat and completions (chunks, the
optional usage chunk, `[DONE]`) and embeddings (JSON only). The APIs whose streams are named
events (the Responses API, Anthropic's Messages API) are in `sim.server._event_frames`; usage
and the encodings in `sim.server._wire`. Only shapes: no timing, no aiohttp.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

from sim.server._event_frames import MessagesFrame, ResponsesFrame
from sim.server._openai import Endpoint, ParsedRequest
from sim.server._wire import Usage, dumps, random_id, sse_event

__all__ = [
    "DONE_EVENT",
    "FINGERPRINT",
    "EmbeddingsFrame",
    "Frame",
    "OpenAiFrame",
    "Usage",
    "anthropic_error_body",
    "error_body",
    "filler_token",
    "frame_for",
]

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


class Frame(Protocol):
    """One response's body. A stream is `stream_head` (as soon as it starts), `stream_open`
    (with the first token), `stream_token` per token (the last with the finish reason) and
    `stream_close`; frames of event APIs keep state between these calls."""

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes: ...
    def stream_head(self) -> bytes: ...
    def stream_open(self, include_usage: bool) -> bytes: ...
    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes: ...
    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes: ...


FINGERPRINT = "sim-slogate"  # vLLM's reads vllm-<version>-<hash>


@dataclass(frozen=True, slots=True)
class OpenAiFrame:
    """Chat completions and completions, in vLLM's shapes (held to a real vLLM by
    tests/e2e/test_sim_matches_vllm.py): its vLLM-only fields (`prompt_token_ids`,
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
            "completion_tokens_details": usage.completion_details(),
        }
        if self.chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return dumps(body)

    def stream_head(self) -> bytes:
        return b""

    def stream_open(self, include_usage: bool) -> bytes:
        if not self.chat:
            return b""
        body = self._head("chat.completion.chunk")
        delta = {"role": "assistant", "content": ""}
        body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        body.update(prompt_token_ids=None, prompt_text=None)
        return sse_event(None, body)

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
        return sse_event(None, body)

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        """What follows the last token (which carried `finish_reason`)."""
        out = b""
        if include_usage:
            body = self._head("chat.completion.chunk" if self.chat else "text_completion")
            body["choices"] = []
            # vLLM's streamed usage: created_cache_tokens only in chat.
            body["usage"] = usage.body({"created_cache_tokens": 0} if self.chat else {})
            body["system_fingerprint"] = FINGERPRINT
            out += sse_event(None, body)
        return out + DONE_EVENT


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

    def stream_head(self) -> bytes:
        raise ValueError("embeddings do not stream")

    def stream_open(self, include_usage: bool) -> bytes:
        raise ValueError("embeddings do not stream")

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
        raise ValueError("embeddings do not stream")

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        raise ValueError("embeddings do not stream")


def frame_for(parsed: ParsedRequest, model: str) -> Frame:
    endpoint = parsed.endpoint
    suffix = random_id()
    if endpoint is Endpoint.RESPONSES:
        settings = parsed.settings or {}
        return ResponsesFrame("resp_" + suffix, model, parsed.max_tokens, settings)
    if endpoint is Endpoint.MESSAGES:
        # vLLM serves the Messages API through chat completions and keeps their id.
        return MessagesFrame("chatcmpl-" + suffix, model, parsed.prompt_tokens)
    if endpoint is Endpoint.EMBEDDINGS:
        return EmbeddingsFrame(model)
    chat = endpoint is Endpoint.CHAT
    created = int(time.time())
    return OpenAiFrame(chat, ("chatcmpl-" if chat else "cmpl-") + suffix, model, created)
