"""Who is calling: a small pluggable step between the request headers and the decision.

What lives here: the `IdentityResolver` protocol and the API-key resolver (`Authorization:
Bearer <key>` or `x-api-key`). JWT claims arrive as Envoy metadata and get their own
resolver later; the request flow only sees the protocol. Keys are looked up by SHA-256 and
never stored or logged in clear.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from budget.policy import ApiKey, Policy
from extproc.errors import Unauthenticated


class IdentityResolver(Protocol):
    def resolve(self, headers: Mapping[str, str]) -> ApiKey:
        """The caller of a request, or raise Unauthenticated."""
        ...


def api_key_from_headers(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = headers.get("x-api-key")
    return api_key.strip() if api_key and api_key.strip() else None


class ApiKeyResolver:
    def __init__(self, policy: Callable[[], Policy]) -> None:
        self._policy = policy  # read per request: a reloaded policy takes effect at once

    def resolve(self, headers: Mapping[str, str]) -> ApiKey:
        key = api_key_from_headers(headers)
        if key is None:
            raise Unauthenticated(
                "You didn't provide an API key. Provide it in the Authorization header "
                "(Authorization: Bearer YOUR_KEY).",
                reason="missing_api_key",
            )
        known = self._policy().key_for(key)
        if known is None:
            raise Unauthenticated("Incorrect API key provided.", reason="unknown_api_key")
        return known
