"""Names shared by the Envoy around slogate and the sidecar: change both or neither.

What lives here: metadata namespaces, header names, access-log tag names, the names of the
Envoy pieces slogate adds, and `ENVOY_PIECES`, what slogate needs from an Envoy and what
breaks without each piece (docs/operators/deploy-envoy.md's contract table is rendered from
it). The bootstrap, the fragment and the mesh manifests (tooling.render.envoy_config,
tooling.render.k8s) all take their names from here. No logic.
"""

from __future__ import annotations

from typing import NamedTuple

from admission.decision import DEGRADED_HEADER, QUEUED_HEADER, SPEND_WARNING_HEADER

METADATA_NAMESPACE = "slogate"  # set by the sidecar on the request path (ext_proc)
TRACKING_ID_FIELD = "id"  # in METADATA_NAMESPACE: the sidecar's in-flight id of the request
# In METADATA_NAMESPACE: the id's proof (extproc.request.inflight): an access-log entry
# settles only with it. No route renders it: clients and engines never see it.
USAGE_PROOF_FIELD = "proof"
# In METADATA_NAMESPACE: the pool the sidecar chose. Envoy's pool routes match on it, so only
# the sidecar can pick a pool: a client can send any header, but cannot set metadata.
POOL_FIELD = "pool"
# The Gateway API inference extension's endpoint picker protocol (its proposal 004), which
# slogate speaks wherever it picks the engine, so one Envoy configuration works with slogate
# or with any other picker:
# - the engines picked, "ip:port,ip:port" best first, in the request header and, with the
#   same value, in dynamic metadata DESTINATION_NAMESPACE / DESTINATION_KEY. The pool
#   cluster's override-host load-balancing policy sends the request to the first and retries
#   a refused connection on the next; without one named, Envoy balances.
DESTINATION_NAMESPACE = "envoy.lb"
DESTINATION_KEY = "x-gateway-destination-endpoint"
DESTINATION_HEADER = DESTINATION_KEY
# - the endpoints a gateway allows ("ip:port" list) in the metadata it forwards with the
#   request: slogate picks only among them, or answers 503 (no_hinted_endpoint).
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_HINT_KEY = "x-gateway-destination-endpoint-subset"
# - the endpoint that served, in DESTINATION_NAMESPACE of the metadata forwarded with the
#   response (a fallback may have served instead of the first named).
SERVED_KEY = "x-gateway-destination-endpoint-served"
# In METADATA_NAMESPACE, true when the sidecar asked for the stream's usage itself: the Lua
# tap then removes the usage-only event the client never asked for.
STRIP_USAGE_FIELD = "strip_usage"
# In METADATA_NAMESPACE, true when the request's end should reach the sidecar at once
# (RoutingDecision.settle_promptly): its access-log entry goes to the unbatched logger.
SETTLE_PROMPTLY_FIELD = "settle_promptly"
USAGE_NAMESPACE = "slogate.usage"  # set by the usage tap (usage_tap.lua spells both)

# jwt_authn writes the verified payload here; ext_proc forwards it with the headers.
JWT_AUTHN_NAMESPACE = "envoy.filters.http.jwt_authn"
JWT_PAYLOAD_KEY = "jwt_payload"

SLOGATE_HEADER_PREFIX = "x-slogate-"  # only slogate sets these; client copies are removed
POOL_HEADER = "x-slogate-pool"  # request: the route; response: the pool that served it
REASON_HEADER = "x-slogate-reason"  # on every rejection slogate answers itself
# On a request one region sends to another (admission.crossing): the origin's token
# (extproc.request.crossing_token); the receiving sidecar reads it before it removes every
# x-slogate-* header, and the origin's body reply sets it after its header reply removed the
# client's copy.
CROSSED_HEADER = "x-slogate-crossed"
# On the response of a request that crossed: the region that served it (the origin's route).
REGION_HEADER = "x-slogate-region"
# Answered by Envoy itself where regions are on: the path a peer's probe measures the
# round trip with (extproc.runtime.peer_probe); no sidecar, no engine.
REGION_PING_PATH = "/slogate/region-ping"
# What the sidecar tells the pool on an admitted request (extproc.service.replies).
TENANT_HEADER = "x-slogate-tenant"
TIER_HEADER = "x-slogate-tier"
BUCKET_HEADER = "x-slogate-bucket"
ESTIMATE_HEADER = "x-slogate-est-tokens"
# The Gateway API inference extension's endpoint-picker protocol: the objective (its
# priority) and the fairness id the picker queues by; slogate sets them to the caller's
# objective (its tenant's, else its tier's: policy.domain.ApiKey.objective) and tenant, so a
# picker behind slogate honours slogate's classes (and clients cannot claim another's).
OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
# ... and the names llm-d's router reads first (the ones above are its deprecated aliases):
# set too, or a client's copy of these would win there over slogate's.
LLM_D_OBJECTIVE_HEADER = "x-llm-d-inference-objective"
LLM_D_FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
SIDECAR_SET_HEADERS = (
    POOL_HEADER,
    TENANT_HEADER,
    TIER_HEADER,
    BUCKET_HEADER,
    ESTIMATE_HEADER,
    OBJECTIVE_HEADER,
    FAIRNESS_HEADER,
    LLM_D_OBJECTIVE_HEADER,
    LLM_D_FAIRNESS_HEADER,
    DESTINATION_HEADER,
)

# One ext_proc message per request (policy `data_path.messages: one`): ext_proc skips the
# request headers, so a header_to_metadata filter before it copies the ones the sidecar reads
# into this namespace, which ext_proc forwards with the body (extproc.service.one_message).
FORWARDED_NAMESPACE = "slogate.request"
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context: read, and sent upstream
FORWARDED_HEADERS = (
    ":path",
    ":method",
    "x-request-id",
    "authorization",
    "x-api-key",
    *TRACE_HEADERS,
    CROSSED_HEADER,  # a request another region sent: where it was charged
)
# ... and with the headers skipped Envoy drops the body reply's header mutations: the sidecar
# puts what it would set into METADATA_NAMESPACE under each header's name, and the pool routes
# render them upstream (overwriting a client's copy).
UPSTREAM_METADATA_HEADERS = (
    *SIDECAR_SET_HEADERS,
    "content-length",
    *TRACE_HEADERS,
    CROSSED_HEADER,  # on a request sent to another region (the region routes render it)
)

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
RESPONSE_METADATA_HEADERS = (
    *RATE_LIMIT_HEADERS,
    DEGRADED_HEADER,
    QUEUED_HEADER,
    SPEND_WARNING_HEADER,
)

ACCESS_LOG_NAME = "slogate"
# Access-log custom tags, by name, and the Envoy formatter that fills each.
ACCESS_LOG_TAGS: dict[str, str] = {
    # The first upstream body byte, from the request's start: the whole answer of a JSON
    # body, but not the first token of every stream (a Responses stream opens with events
    # sent before any token)...
    "ttft_ms": "%COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:ms)%",
    # ... so the usage tap adds how long after that byte a stream's first output event came
    # (usage_tap.lua): TTFT = ttft_ms + first_output_delay_ms, for every API.
    "first_output_delay_ms": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:first_output_delay_ms)%",
    "prompt_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:prompt_tokens)%",
    "completion_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:completion_tokens)%",
    # SSE events the stream sent (usage_tap.lua): what a stream cut before its usage is
    # settled with.
    "stream_events": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:stream_events)%",
    # Parts of the usage that spend budgets price apart (usage_tap.lua).
    "cached_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:cached_tokens)%",
    "reasoning_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:reasoning_tokens)%",
    # The native tap (json_to_metadata) cannot add: it writes Anthropic's and the Responses
    # API's prompt in parts, and the sidecar sums them where prompt_tokens is absent.
    "input_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:input_tokens)%",
    "cache_read_input_tokens": f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:cache_read_input_tokens)%",
    "cache_creation_input_tokens": (
        f"%DYNAMIC_METADATA({USAGE_NAMESPACE}:cache_creation_input_tokens)%"
    ),
}

# The Envoy pieces slogate adds, by name. A filter's name is free in Envoy (the typed
# config's type picks the extension); slogate's own names keep its per-route settings off
# any other ext_proc or Lua filter in the chain (the inference extension's endpoint picker
# is an ext_proc filter too).
EXT_PROC_FILTER = "slogate.ext_proc"
USAGE_TAP_FILTER = "slogate.usage_tap"
JWT_FILTER = JWT_AUTHN_NAMESPACE  # jwt_authn writes its metadata under this name
SIDECAR_CLUSTER = "slogate_sidecar"
POOL_ROUTE_PREFIX = "slogate_pool_"  # one route per pool: POOL_ROUTE_PREFIX + pool name
SIDECAR_FAILURE_STATUS = 502  # what clients get when fail-closed and the sidecar fails


class EnvoyPiece(NamedTuple):
    """One thing slogate needs from the Envoy it runs in."""

    piece: str
    where: str
    what: str
    if_missing: str


ENVOY_PIECES: tuple[EnvoyPiece, ...] = (
    EnvoyPiece(
        "jwt_authn (only with `jwt:` in the policy)",
        f"HTTP filter `{JWT_FILTER}`, before slogate's ext_proc",
        "verifies the bearer token, writes the payload to its metadata "
        f"(`{JWT_PAYLOAD_KEY}`), which ext_proc forwards to the sidecar",
        "callers are identified by API key only; tokens reach the sidecar unverified "
        "and are refused",
    ),
    EnvoyPiece(
        "ext_proc",
        f"HTTP filter `{EXT_PROC_FILTER}`, before the usage tap and the router (and before "
        "any endpoint picker's ext_proc)",
        "request headers SEND, request body BUFFERED, everything else SKIP/NONE; "
        "`allow_mode_override`; `message_timeout` and `max_message_timeout` from the policy "
        "(the waiting room lifts one message's timeout); receives metadata "
        f"`{METADATA_NAMESPACE}` and `{DESTINATION_NAMESPACE}` (the engine picked); "
        f"`status_on_error` {SIDECAR_FAILURE_STATUS}; `failure_mode_allow` from the policy; "
        "`max_receive_message_length` above the largest body",
        "no admission at all: no budgets, no breaker, no routing by context",
    ),
    EnvoyPiece(
        "usage tap (Lua; with `data_path.usage_tap: native`, Envoy's json_to_metadata for "
        "JSON bodies under 1 MB and the Lua for the rest)",
        f"HTTP filter `{USAGE_TAP_FILTER}`, after ext_proc, before the router",
        f"reads `usage` out of JSON and SSE responses into metadata `{USAGE_NAMESPACE}`, "
        "counts stream events, times each stream's first output event, drops the usage "
        "event a client did not ask for",
        "reservations settle at their reserved size, never at the tokens used; streamed "
        "clients see a usage event they did not ask for; TTFT is the first byte's (~0 for "
        "a Responses stream)",
    ),
    EnvoyPiece(
        "gRPC access log",
        f"HTTP connection manager `access_log`, log name `{ACCESS_LOG_NAME}`, to "
        f"`{SIDECAR_CLUSTER}`: two loggers told apart by metadata "
        f"`{METADATA_NAMESPACE}.{SETTLE_PROMPTLY_FIELD}`",
        "one entry per request with status, TTFT, usage and stream events as custom tags; "
        "batched (16 KiB, 20 ms), but sent at once for a request marked "
        f"`{SETTLE_PROMPTLY_FIELD}` (its pool waits for the KV it frees)",
        "nothing is ever settled: concurrency slots and KV holds stay taken until they "
        "expire, the breaker sees no latency or errors, budgets charge the reservation",
    ),
    EnvoyPiece(
        "sidecar cluster",
        f"cluster `{SIDECAR_CLUSTER}`, HTTP/2, to the sidecar's gRPC port (in a pod: its Unix "
        "socket as a pipe address, or loopback)",
        "carries ext_proc streams and the access log",
        "Envoy refuses the configuration (both name the cluster)",
    ),
    EnvoyPiece(
        "pool routes",
        f"first in each virtual host that serves inference: `{POOL_ROUTE_PREFIX}<pool>`, "
        f"matching dynamic metadata `{METADATA_NAMESPACE}.{POOL_FIELD}` = the pool, to the "
        "pool's cluster",
        "the sidecar's body reply sets the pool, with header mutations (without one Envoy "
        "ignores `clear_route_cache`), and clears the route cache, so the request is routed "
        f"again on its context size; they add `{POOL_HEADER}` to the response and, from "
        f"metadata `{METADATA_NAMESPACE}`, "
        + ", ".join(f"`{h}`" for h in RESPONSE_METADATA_HEADERS),
        "every request goes where the operator's own route sends it: no long-context pool, "
        "no L3 fallback, no rate-limit headers on successful responses",
    ),
    EnvoyPiece(
        "per-route ext_proc settings",
        f"`typed_per_filter_config` under `{EXT_PROC_FILTER}` on the operator's routes",
        "failure mode per path (`failure_mode_by_path`); `disabled` on routes that serve "
        "nothing the policy lists",
        "the policy-wide failure mode everywhere; the sidecar answers paths it does not "
        "know with its 404 (default deny), the operator's other routes included",
    ),
    EnvoyPiece(
        "body buffer limit",
        "virtual host `request_body_buffer_limit` (or the listener's buffer limit) "
        "at the policy's `max_body_bytes`",
        "the whole body reaches the sidecar in one message",
        "bodies over Envoy's default (1 MiB) get a 413 from Envoy before any decision",
    ),
    EnvoyPiece(
        "stream idle timeout",
        "HTTP connection manager `stream_idle_timeout`",
        "at least the upstream timeout and the longest wait in the waiting room",
        "requests held in the waiting room are cut by Envoy's 5-minute default (or a "
        "shorter operator setting)",
    ),
    EnvoyPiece(
        "path normalisation",
        "HTTP connection manager `normalize_path`, `merge_slashes`, escaped slashes unescaped",
        "the path the sidecar classifies is the one engines act on",
        "`/v1/%63hat/completions` is not a path the sidecar knows: refused with 404, "
        "or, on a route with ext_proc disabled, served unmetered",
    ),
    EnvoyPiece(
        "local replies (optional)",
        "HTTP connection manager `local_reply_config` mappers",
        "Envoy's own 401, 413, 502 and 504 as OpenAI (or Anthropic) JSON errors",
        "those errors reach clients as Envoy's plain text",
    ),
)
