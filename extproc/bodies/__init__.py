"""Inference bodies of every API slogate guards: read them, and rewrite them in one place.

`parse_inference_body(shape, body)` returns an `InferenceRequest` or raises
`InvalidRequest` (malformed JSON, wrong types naming the field, nesting too deep).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from extproc.bodies.anthropic import read_messages
from extproc.bodies.openai import read_chat, read_completion, read_embeddings, read_invocation
from extproc.bodies.request import InferenceRequest
from extproc.bodies.responses import read_responses
from extproc.bodies.rewrite import adds_usage, rewritten_body
from extproc.errors import InvalidRequest
from policy.apis import BodyShape

__all__ = ["InferenceRequest", "adds_usage", "parse_inference_body", "rewritten_body"]

_READERS: dict[BodyShape, Callable[[bytes], InferenceRequest]] = {
    BodyShape.CHAT: read_chat,
    BodyShape.COMPLETION: read_completion,
    BodyShape.EMBEDDINGS: read_embeddings,
    BodyShape.RESPONSES: read_responses,
    BodyShape.MESSAGES: read_messages,
    BodyShape.INVOCATIONS: read_invocation,
}


def parse_inference_body(shape: BodyShape, body: bytes) -> InferenceRequest:
    try:
        return _READERS[shape](body)
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
