"""Reading any inference body: the one entry the request path calls.

What lives here: `parse_inference_body(shape, body)`, which hands the body to its API's
reader (`openai`, `responses`, `anthropic`) and returns an `InferenceRequest`, or raises
`InvalidRequest` (malformed JSON, wrong types naming the field, nesting too deep).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from admission.errors import InvalidRequest
from extproc.request.bodies.anthropic import read_messages
from extproc.request.bodies.openai import (
    read_chat,
    read_completion,
    read_embeddings,
    read_invocation,
)
from extproc.request.bodies.request import InferenceRequest
from extproc.request.bodies.responses import read_responses
from policy.apis import BodyShape

__all__ = ["parse_inference_body"]

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
