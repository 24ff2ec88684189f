"""Who is calling: a small pluggable step between the request headers and the decision.

What lives here: the `IdentityResolver` protocol and the API-key resolver (`Authorization:
Bearer <key>` or `x-api-key`). JWT claims arrive as Envoy metadata and get their own
resolver later; the request flow only sees the protocol. Keys are looked up by SHA-256 and
never stored or logged in clear. A caller none of whose requests may pass (its tenant
suspended, a limit of 0: admission.access) is refused here, before its body is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from admission.access import check_caller
from admission.errors import Unauthenticated
from policy.domain import ApiKey, Tier, build_caller, hash_api_key
from policy.schema import Policy


class IdentityResolver(Protocol):
    def resolve(
        self, headers: Mapping[str, str], claims: Mapping[str, Any] | None, policy: Policy
    ) -> ApiKey:
        """The caller of a request, or raise Unauthenticated (or Forbidden: it may send
        nothing, admission.access.check_caller).

        `claims` is the JWT payload Envoy's jwt_authn verified, when there is one; `policy`
        the request's snapshot.
        """
        ...


def api_key_from_headers(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = headers.get("x-api-key")
    return api_key.strip() if api_key and api_key.strip() else None


class StoredKeys(Protocol):
    """Keys managed outside the policy (extproc.runtime.key_store)."""

    def caller(self, key_sha256: str, policy: Policy) -> ApiKey | str | None:
        """The caller of a stored key; the refusal reason of a stored key that may not be
        used now (`revoked_api_key`, `expired_api_key`); None: not stored."""
        ...


_STORED_REFUSALS = {
    "revoked_api_key": "The API key provided has been revoked.",
    "expired_api_key": "The API key provided has expired.",
    "pending_api_key": "The API key provided is not valid yet.",
}


class ApiKeyResolver:
    """Verified JWT claims when present (policy `jwt`), else the API key: a stored key
    (`keys`) before the policy's, so the store can revoke or expire a key the policy lists."""

    def __init__(self, keys: StoredKeys | None = None) -> None:
        self._keys = keys

    def resolve(
        self, headers: Mapping[str, str], claims: Mapping[str, Any] | None, policy: Policy
    ) -> ApiKey:
        caller = self._caller(headers, claims, policy)
        check_caller(policy, caller)
        return caller

    def _caller(
        self, headers: Mapping[str, str], claims: Mapping[str, Any] | None, policy: Policy
    ) -> ApiKey:
        if claims is not None and policy.jwt is not None:
            return caller_from_claims(policy, claims)
        key = api_key_from_headers(headers)
        if key is None:
            raise Unauthenticated(
                "You didn't provide an API key. Provide it in the Authorization header "
                "(Authorization: Bearer YOUR_KEY).",
                reason="missing_api_key",
            )
        if self._keys is not None:
            stored = self._keys.caller(hash_api_key(key), policy)
            if isinstance(stored, str):
                raise Unauthenticated(_STORED_REFUSALS[stored], reason=stored)
            if stored is not None:
                return stored
        known = policy.key_for(key)
        if known is None:
            raise Unauthenticated("Incorrect API key provided.", reason="unknown_api_key")
        return known


def caller_from_claims(policy: Policy, claims: Mapping[str, Any]) -> ApiKey:
    """A JWT caller: tenant and tier from the claims the policy names; the budget pool is
    per subject (issuer + sub), with the tier's default limits. A tenant the policy's
    `tenants:` section knows gives what it sets, as to its keys: its tier where the token
    names none, its limits over the tier's. Envoy already verified signature, issuer,
    audience and expiry; this only reads what it vouched for."""
    config = policy.jwt
    assert config is not None
    tenant = claims.get(config.tenant_claim)
    if not isinstance(tenant, str) or not tenant:
        raise Unauthenticated(
            f"The token has no '{config.tenant_claim}' claim naming a tenant.",
            reason="jwt_missing_tenant",
        )
    tier_raw = claims.get(config.tier_claim)
    try:
        tier = Tier(tier_raw) if tier_raw is not None else None
    except ValueError:
        raise Unauthenticated(
            f"The token's '{config.tier_claim}' claim is not a known tier.",
            reason="jwt_bad_tier",
        ) from None
    subject = f"jwt:{claims.get('iss', '')}:{claims.get('sub', tenant)}"
    return build_caller(
        hash_api_key(subject), tenant, tier, {}, policy.tier_limits, policy.tenants, from_jwt=True
    )
