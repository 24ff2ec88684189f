"""The two APIs whose streams are named events, in vLLM 0.32's shapes and order.

The Responses API (vllm/entrypoints/openai/responses/serving.py and streaming_events.py):
`response.created` and `response.in_progress` as soon as the stream starts (before the first
token), then with the first token `response.output_item.added` and
`response.content_part.added`, one `response.output_text.delta` per token, and at the end
`response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
`response.completed` with the usage (its type stays `response.completed` when the status is
`incomplete`). Every event carries a `sequence_number` from 0; the response object carries
the request's settings back (instructions, temperature, ...) and vLLM's own null fields.

Anthropic's Messages API (vllm/entrypoints/anthropic/serving.py, which serves it through chat
completions with usage on every chunk): `message_start` (a whole message, `content: []`,
usage with the input tokens and `output_tokens: 0`), `content_block_start` with
`{"type": "text", "text": ""}` at the first token, one `content_block_delta` (`text_delta`) per
token, `content_block_stop`, `message_delta` (stop reason and the final usage),
`message_stop`; no `ping`. The id is the chat completion's (`chatcmpl-...`). Its usage follows
Anthropic's rule that `input_tokens` excludes the cache: the final usage (`message_delta`, the
JSON body) has `input_tokens = prompt - cached` beside `cache_read_input_tokens` and
`cache_creation_input_tokens` (the simulator writes 0 there, as it does in chat's
`created_cache_tokens`), while `message_start` has the whole prompt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sim.server._wire import Usage, dumps, random_id, sse_event

# The Responses request's settings vLLM sends back in the response object, with what it says
# when the request names none (temperature and top_p: the model's generation defaults).
RESPONSES_ECHOED: dict[str, Any] = {
    "instructions": None,
    "metadata": None,
    "parallel_tool_calls": True,
    "temperature": 1.0,
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "background": False,
    "max_tool_calls": None,
    "previous_response_id": None,
    "prompt": None,
    "reasoning": None,
    "service_tier": "auto",
    "text": None,
    "truncation": "disabled",
    "user": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def responses_settings(body: dict[str, Any]) -> dict[str, Any]:
    """The settings a Responses request named (not null), for its response object."""
    return {k: body[k] for k in RESPONSES_ECHOED if body.get(k) is not None}


def _output_text(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


@dataclass(slots=True)
class ResponsesFrame:
    """The Responses API: a `response` object; a stream of `response.*` events (stateful:
    sequence numbers, the item opened at the first token, the text so far)."""

    response_id: str
    model: str
    max_output_tokens: int
    settings: dict[str, Any] = field(default_factory=dict)
    created_s: int = field(default_factory=lambda: int(time.time()))
    item_id: str = field(default_factory=lambda: "msg_" + random_id())
    _sequence: int = field(default=0, init=False)
    _text: str | None = field(default=None, init=False)  # None: no output item opened yet

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: Usage | None
    ) -> dict[str, Any]:
        echoed = {**RESPONSES_ECHOED, **self.settings}
        if not echoed["tools"]:
            echoed["tool_choice"] = "none"  # vLLM's validator: no tools, no choice
        return {
            "id": self.response_id,
            "created_at": self.created_s,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": echoed["instructions"],
            "metadata": echoed["metadata"],
            "model": self.model,
            "object": "response",
            "output": output,
            **{k: echoed[k] for k in ("parallel_tool_calls", "temperature", "tool_choice")},
            **{k: echoed[k] for k in ("tools", "top_p", "background")},
            "max_output_tokens": self.max_output_tokens,
            **{k: echoed[k] for k in ("max_tool_calls", "previous_response_id", "prompt")},
            "reasoning": echoed["reasoning"],
            "service_tier": echoed["service_tier"],
            "status": status,
            "text": echoed["text"],
            "top_logprobs": None,
            "truncation": echoed["truncation"],
            "usage": None if usage is None else self._usage(usage),
            "user": echoed["user"],
            "presence_penalty": echoed["presence_penalty"],
            "frequency_penalty": echoed["frequency_penalty"],
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    @staticmethod
    def _usage(usage: Usage) -> dict[str, Any]:
        return {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": usage.cached_tokens,
                "cache_write_tokens": 0,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }

    def _item(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
            "phase": None,
        }

    @staticmethod
    def _status(finish_reason: str) -> str:
        return "incomplete" if finish_reason == "length" else "completed"

    def _event(self, name: str, body: dict[str, Any]) -> bytes:
        # OpenAI's event types declare their fields in alphabetical order.
        body = dict(sorted({**body, "sequence_number": self._sequence, "type": name}.items()))
        self._sequence += 1
        return sse_event(name, body)

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes:
        content = [_output_text(text, None)] if text else []
        output = [self._item("completed", content)]
        return dumps(self._response(self._status(finish_reason), output, usage))

    def stream_head(self) -> bytes:
        started = self._response("in_progress", [], None)
        return self._event("response.created", {"response": started}) + self._event(
            "response.in_progress", {"response": started}
        )

    def stream_open(self, include_usage: bool) -> bytes:
        return b""  # the output item opens with the first token

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
        out = b""
        where = {"item_id": self.item_id, "output_index": 0}
        if self._text is None:
            self._text = ""
            item = {"item": self._item("in_progress", []), "output_index": 0}
            part = {"content_index": 0, **where, "part": _output_text("", [])}
            out += self._event("response.output_item.added", item)
            out += self._event("response.content_part.added", part)
        self._text += text
        delta = {"content_index": 0, "delta": text, **where, "logprobs": []}
        return out + self._event("response.output_text.delta", delta)

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        out = b""
        output = []
        if self._text is not None:
            where = {"content_index": 0, "item_id": self.item_id}
            done = {**where, "logprobs": [], "output_index": 0, "text": self._text}
            part = _output_text(self._text, None)
            item = self._item("completed", [part] if self._text else [])
            out += self._event("response.output_text.done", done)
            part_done = {**where, "output_index": 0, "part": part}
            out += self._event("response.content_part.done", part_done)
            out += self._event("response.output_item.done", {"item": item, "output_index": 0})
            output.append(item)
        final = self._response(self._status(finish_reason), output, usage)
        return out + self._event("response.completed", {"response": final})


@dataclass(slots=True)
class MessagesFrame:
    """Anthropic's Messages API: a `message` object; a stream of `message_*` and
    `content_block_*` events (stateful: the text block opens at the first token)."""

    response_id: str
    model: str
    prompt_tokens: int
    _block_open: bool = field(default=False, init=False)

    @staticmethod
    def _stop(finish_reason: str) -> str:
        return "max_tokens" if finish_reason == "length" else "end_turn"

    @staticmethod
    def _usage(usage: Usage) -> dict[str, Any]:
        """vLLM's final usage: Anthropic's `input_tokens` leaves the cached tokens out."""
        return {
            "input_tokens": max(0, usage.prompt_tokens - usage.cached_tokens),
            "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens,
        }

    def full_response(self, text: str, finish_reason: str, usage: Usage) -> bytes:
        # Serialized without its null fields (stop_sequence, kv_transfer_params, ...); an
        # empty completion is one empty text block.
        body = {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": self.model,
            "stop_reason": self._stop(finish_reason),
            "usage": self._usage(usage),
        }
        return dumps(body)

    def stream_head(self) -> bytes:
        return b""

    def stream_open(self, include_usage: bool) -> bytes:
        message: dict[str, Any] = {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return sse_event("message_start", {"type": "message_start", "message": message})

    def stream_token(
        self, text: str, include_usage: bool, finish_reason: str | None = None
    ) -> bytes:
        out = b""
        if not self._block_open:
            self._block_open = True
            block = {"type": "text", "text": ""}
            start = {"type": "content_block_start", "content_block": block, "index": 0}
            out += sse_event("content_block_start", start)
        delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}}
        return out + sse_event("content_block_delta", {**delta, "index": 0})

    def stream_close(self, finish_reason: str, usage: Usage, include_usage: bool) -> bytes:
        out = b""
        if self._block_open:
            out += sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop(finish_reason), "stop_sequence": None},
            "usage": self._usage(usage),
        }
        out += sse_event("message_delta", delta)
        return out + sse_event("message_stop", {"type": "message_stop"})
