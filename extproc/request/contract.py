"""Names shared by the generated Envoy config and the sidecar: change both or neither.

What lives here: metadata namespaces, header names and access-log tag names. No logic.
"""

from __future__ import annotations

from admission.decision import DEGRADED_HEADER, QUEUED_HEADER

METADATA_NAMESPACE = "slogate"  # set by the sidecar on the request path (ext_proc)
TRACKING_ID_FIELD = "id"  # in METADATA_NAMESPACE: the sidecar's in-flight id of the request
# In METADATA_NAMESPACE: the pool the sidecar chose. Envoy's pool routes match on it, so only
# the sidecar can pick a pool: a client can send any header, but cannot set metadata.
POOL_FIELD = "pool"
# In METADATA_NAMESPACE, true when the sidecar asked for the stream's usage itself: the Lua
# tap then removes the usage-only event the client never asked for.
STRIP_USAGE_FIELD = "strip_usage"
USAGE_NAMESPACE = "slogate.usage"  # set by the Lua usage tap (usage_tap.lua spells both)

# jwt_authn writes the verified payload here; ext_proc forwards it with the headers.
JWT_AUTHN_NAMESPACE = "envoy.filters.http.jwt_authn"
JWT_PAYLOAD_KEY = "jwt_payload"

SLOGATE_HEADER_PREFIX = "x-slogate-"  # only slogate sets these; client copies are removed
POOL_HEADER = "x-slogate-pool"  # request: the route; response: the pool that served it
REASON_HEADER = "x-slogate-reason"  # on every rejection slogate answers itself

# OpenAI's rate-limit response headers. The sidecar puts each into METADATA_NAMESPACE under
# its own name; the route renders them, so no response message goes to the sidecar.
RATE_LIMIT_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)

# ... and the admission steps' own response headers, rendered likewise.
RESPONSE_METADATA_HEADERS = (*RATE_LIMIT_HEADERS, DEGRADED_HEADER, QUEUED_HEADER)

ACCESS_LOG_NAME = "slogate"
# Access-log custom tags, by name, and the Envoy formatter that fills each.
ACCESS_LOG_TAGS: dict[str, str] = {
    # First upstream body byte = first token of a stream: TTFT as the pool delivered it.
    "ttft_ms": "%COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:ms)%",
    "prompt_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:prompt_tokens)%",
    "completion_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:completion_tokens)%",
    # SSE events the stream sent (usage_tap.lua): what a stream cut before its usage is
    # settled with.
    "stream_events": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:stream_events)%",
}
