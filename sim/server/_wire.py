"""What every simulated response body is made of: the usage counts and vLLM's JSON and SSE
encodings (compact JSON, as pydantic and Starlette write it; `event:` lines where the API
names its events)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # part of completion_tokens (a reasoning request only)

    def body(self, details: dict[str, Any]) -> dict[str, Any]:
        """vLLM's usage object (its field order), `prompt_tokens_details` as given, and
        `completion_tokens_details` when the completion reasoned."""
        body = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, **details},
        }
        if self.reasoning_tokens:
            body["completion_tokens_details"] = self.completion_details()
        return body

    def completion_details(self) -> dict[str, int] | None:
        return {"reasoning_tokens": self.reasoning_tokens} if self.reasoning_tokens else None


def dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()  # compact, as vLLM writes


def sse_event(name: str | None, body: dict[str, Any]) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + dumps(body) + b"\n\n"


def random_id() -> str:
    """vLLM's `random_uuid()`: 16 hex digits."""
    return uuid.uuid4().hex[:16]
