"""Errors a request can end with, each knowing how the client should see it.

    RequestRejected                      (never raised itself)
    ├── InvalidRequest        400  invalid_request_error     malformed or wrong-typed body
    │   └── ContextLengthExceeded 400 context_length_exceeded prompt + max_tokens over the model max
    ├── Unauthenticated       401  invalid_api_key           missing or unknown API key
    ├── MethodNotAllowed      405  method_not_allowed        inference path without POST
    ├── BodyTooLarge          413  request_too_large         body over the policy byte limit
    ├── RateLimited           429  rate_limit_exceeded       budget spent (carries Retry-After)
    ├── InternalError         500  internal_error            a slogate bug: never route on a guess
    └── Overloaded            503  overloaded                shed by the breaker (Retry-After)

Each error carries `reason`, a short label from a fixed set, used as the metric label for
rejections. The messages never contain prompt text or API keys. Turning these into an
Envoy ImmediateResponse happens in exactly one place: `extproc.responses.rejection`.
"""

from __future__ import annotations

from collections.abc import Mapping


class RequestRejected(Exception):
    status: int = 400
    error_type: str = "invalid_request_error"
    code: str | None = None  # OpenAI leaves it null for generic invalid requests

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        retry_after_s: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.headers: Mapping[str, str] = headers or {}  # e.g. the rate-limit headers


class InvalidRequest(RequestRejected):
    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthenticated(RequestRejected):
    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class BodyTooLarge(RequestRejected):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(RequestRejected):
    status = 429
    error_type = "rate_limit_exceeded"
    code = "rate_limit_exceeded"


class Overloaded(RequestRejected):
    status = 503
    error_type = "server_error"
    code = "overloaded"


class MethodNotAllowed(RequestRejected):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class InternalError(RequestRejected):
    """A bug in slogate; the request is refused rather than routed on a guess."""

    status = 500
    error_type = "server_error"
    code = "internal_error"
