"""Errors a request can end with, each knowing how the client should see it.

    RequestRejected                      (never raised itself)
    ├── InvalidRequest        400  invalid_request_error     malformed or wrong-typed body
    │   └── ContextLengthExceeded 400 context_length_exceeded prompt + max_tokens over the model max
    ├── Unauthenticated       401  invalid_api_key           missing or unknown API key
    ├── Forbidden             403  request_forbidden         may not send this: retrying won't help
    │   ├── TenantSuspended   403  tenant_suspended          the caller's tenant is suspended
    │   ├── LimitZero         403  limit_zero                a limit of the caller's is 0
    │   └── PoolNotAllowed    403  pool_not_allowed          routed to a pool its tenant may not use
    ├── NotFound              404  not_found                 a path the policy does not forward
    ├── MethodNotAllowed      405  method_not_allowed        a method the API does not serve
    ├── BodyTooLarge          413  request_too_large         body over the policy byte limit
    ├── RateLimited           429  rate_limit_exceeded       budget spent (carries Retry-After)
    │   └── SpendExhausted    429  insufficient_quota        the tenant's day/month spend used up
    ├── Shed                  429  overloaded                sheddable traffic the breaker sheds
    ├── InternalError         500  internal_error            a slogate bug: never route on a guess
    ├── Overloaded            503  overloaded                shed by the breaker (Retry-After)
    ├── SpendUnverified       503  spend_unverified          the spend store did not answer in
    │                                                        time (`spend_unverified: refuse`)
    └── NoEndpoint            503  no_endpoint               none of the endpoints the gateway
                                                             allows (its subset hint) can serve

Each error carries `reason`, a short label from a fixed set, used as the metric label for
rejections. The messages never contain prompt text or API keys. Turning these into an
Envoy ImmediateResponse happens in exactly one place: `extproc.service.replies.rejection`, in the
error shape of the API the client called (OpenAI's, or Anthropic's for /v1/messages).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy.apis import ErrorStyle


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


class Forbidden(RequestRejected):
    """The caller is known, and the policy says it may not send this request: retrying
    will not help (unlike a 429 or a 503)."""

    status = 403
    error_type = "request_forbidden"  # what OpenAI's own 403s carry
    code = "request_forbidden"


class TenantSuspended(Forbidden):
    code = "tenant_suspended"


class LimitZero(Forbidden):
    code = "limit_zero"


class PoolNotAllowed(Forbidden):
    code = "pool_not_allowed"


class BodyTooLarge(RequestRejected):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(RequestRejected):
    status = 429
    error_type = "rate_limit_exceeded"
    code = "rate_limit_exceeded"


class SpendExhausted(RateLimited):
    """The tenant's spend budget for the day or month is used up: OpenAI's answer to an
    exhausted quota (429 insufficient_quota), with Retry-After until the window ends."""

    error_type = "insufficient_quota"
    code = "insufficient_quota"


class Overloaded(RequestRejected):
    status = 503
    error_type = "server_error"
    code = "overloaded"


class SpendUnverified(RequestRejected):
    """The tenant's spend budget could not be checked in time (the spend store, Redis, slow
    or away) and the policy refuses what it cannot check (`budget.spend_unverified:
    refuse`): a 503 to retry shortly (Retry-After), not an exhausted quota."""

    status = 503
    error_type = "server_error"
    code = "spend_unverified"


class Shed(RequestRejected):
    """Sheddable traffic the breaker drops while the fleet is under load: the endpoint picker
    protocol's 429 for "a request that should be dropped" (a gateway and the clients' SDKs
    retry it after Retry-After; other tiers' shedding stays a 503, Overloaded)."""

    status = 429
    error_type = "rate_limit_exceeded"
    code = "overloaded"


class NoEndpoint(RequestRejected):
    """The gateway allowed only some endpoints (the endpoint picker protocol's subset hint)
    and none of them can serve the request: the protocol's 503."""

    status = 503
    error_type = "server_error"
    code = "no_endpoint"


class NotFound(RequestRejected):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(RequestRejected):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class InternalError(RequestRejected):
    """A bug in slogate; the request is refused rather than routed on a guess."""

    status = 500
    error_type = "server_error"
    code = "internal_error"


# Anthropic's error types by status (its SDKs branch on them); 503 is its overloaded_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_document(
    style: ErrorStyle, status: int, message: str, error_type: str, code: str | None
) -> dict[str, Any]:
    """An error as the API's own clients expect it: OpenAI's `{"error": {message, type,
    code}}`, or Anthropic's `{"type": "error", "error": {type, message}}`. Used for the
    sidecar's replies and Envoy's local replies alike."""
    if style is ErrorStyle.ANTHROPIC:
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": error_type, "code": code}}
