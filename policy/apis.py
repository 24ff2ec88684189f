"""The APIs slogate guards: which paths reach a pool, how each is counted, how it errs.

What lives here: `Api` (one engine API: its path, methods, what slogate does with it and the
error shape its clients expect), the catalogue of every API slogate knows (`KNOWN_APIS`),
`canonical_path` (the one normalisation the sidecar and Envoy's routes both apply) and
`PathTable`, which answers "what is this path?" for the policy's public paths, enabled APIs
and extra authenticated paths. No parsing and no I/O.

Default deny: a path that is none of these never reaches a pool. Envoy's route table (built
from the same table, see `envoy_config.route_config`) answers it with a 404 of its own, and
the sidecar refuses it too, so neither a fail-open sidecar nor a routing mistake forwards it.

The path compared is the one Envoy routes on: after `normalize_path` (RFC 3986: percent-
encoded unreserved characters decoded, dot segments removed, backslashes made slashes),
`merge_slashes` and escaped slashes unescaped, without the query string; a trailing slash
names the same API (`canonical_path` strips it, Envoy's routes rewrite it away). Case is
kept: vLLM's router is case-sensitive, so `/V1/chat/completions` is a different, unknown path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class ApiKind(StrEnum):
    GENERATE = "generate"  # parsed, admitted (breaker, KV, budget), settled with its usage
    EMBED = "embed"  # parsed: the prompt is counted and charged, nothing is generated
    REQUEST = "request"  # authenticated; counts as one request (rpm, concurrency), no tokens


class ErrorStyle(StrEnum):
    OPENAI = "openai"  # {"error": {"message", "type", "code"}}
    ANTHROPIC = "anthropic"  # {"type": "error", "error": {"type", "message"}}


class BodyShape(StrEnum):
    """How an inference body is read (extproc.openai_request and its siblings)."""

    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "messages"
    INVOCATIONS = "invocations"  # chat or completion, detected from the payload


@dataclass(frozen=True, slots=True)
class Api:
    name: str  # as the policy names it (paths.apis)
    path: str
    methods: frozenset[str]
    kind: ApiKind
    shape: BodyShape | None = None  # None: the body is not read
    errors: ErrorStyle = ErrorStyle.OPENAI

    @property
    def reads_body(self) -> bool:
        return self.shape is not None


_POST = frozenset({"POST"})

# vLLM 0.32's inference APIs. Others it serves (/v1/chat/completions/batch, /pooling,
# /classify, /score, /rerank, /v1/audio/*, /v1/responses/{id}, /scale_elastic_ep, ...)
# are not forwarded: a path slogate cannot meter is refused, not passed through.
KNOWN_APIS: tuple[Api, ...] = (
    Api("chat_completions", "/v1/chat/completions", _POST, ApiKind.GENERATE, BodyShape.CHAT),
    Api("completions", "/v1/completions", _POST, ApiKind.GENERATE, BodyShape.COMPLETION),
    Api("responses", "/v1/responses", _POST, ApiKind.GENERATE, BodyShape.RESPONSES),
    Api(
        "messages",
        "/v1/messages",
        _POST,
        ApiKind.GENERATE,
        BodyShape.MESSAGES,
        ErrorStyle.ANTHROPIC,
    ),
    Api("embeddings", "/v1/embeddings", _POST, ApiKind.EMBED, BodyShape.EMBEDDINGS),
    Api("invocations", "/invocations", _POST, ApiKind.GENERATE, BodyShape.INVOCATIONS),
    Api("tokenize", "/tokenize", _POST, ApiKind.REQUEST),
    Api("detokenize", "/detokenize", _POST, ApiKind.REQUEST),
    Api(
        "count_tokens",
        "/v1/messages/count_tokens",
        _POST,
        ApiKind.REQUEST,
        errors=ErrorStyle.ANTHROPIC,
    ),
    Api("models", "/v1/models", frozenset({"GET"}), ApiKind.REQUEST),
)
KNOWN_API_NAMES = tuple(api.name for api in KNOWN_APIS)
_BY_NAME: Mapping[str, Api] = {api.name: api for api in KNOWN_APIS}
DEFAULT_PUBLIC_PATHS = ("/health",)


def api_named(name: str) -> Api | None:
    return _BY_NAME.get(name)


def canonical_path(path: str) -> str:
    """The path without its query string and without one trailing slash (Envoy has already
    normalised it and merged repeated slashes)."""
    path = path.split("?", 1)[0]
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return path


def error_style_for(path: str) -> ErrorStyle:
    """The error shape a client of this path expects, known API or not: Anthropic's SDKs
    call everything under /v1/messages."""
    path = canonical_path(path)
    return ErrorStyle.ANTHROPIC if path.startswith("/v1/messages") else ErrorStyle.OPENAI


class PathClass(StrEnum):
    PUBLIC = "public"  # forwarded without an identity
    API = "api"  # one of the enabled APIs
    UNKNOWN = "unknown"  # never forwarded: 404 from the gateway


@dataclass(frozen=True, slots=True)
class PathTable:
    """What each path is under one policy: public, an enabled API, or unknown."""

    public: frozenset[str]
    apis: Mapping[str, Api]  # canonical path -> api

    @classmethod
    def build(
        cls, public: Iterable[str], apis: Iterable[Api], authenticated: Iterable[str] = ()
    ) -> PathTable:
        table = {api.path: api for api in apis}
        for path in authenticated:
            # An operator's extra path: identified callers only, one request each, any method.
            name = "path:" + path
            methods = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
            table[path] = Api(name, path, methods, ApiKind.REQUEST)
        return cls(frozenset(public), table)

    def classify(self, path: str) -> tuple[PathClass, Api | None]:
        path = canonical_path(path)
        if path in self.public:
            return PathClass.PUBLIC, None
        api = self.apis.get(path)
        if api is None:
            return PathClass.UNKNOWN, None
        return PathClass.API, api

    @property
    def forwarded_paths(self) -> tuple[str, ...]:
        """Every path that may reach a pool, sorted (for Envoy's routes)."""
        return tuple(sorted(self.public | set(self.apis)))
