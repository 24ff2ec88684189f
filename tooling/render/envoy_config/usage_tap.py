"""The usage tap: what reads `usage` out of each inference response inside Envoy, for the
access log to carry to the sidecar (extproc.service.access_log reads both forms).

`data_path.usage_tap: lua` (the default) runs extproc/usage_tap.lua on every response.
`native` hands the non-streamed JSON bodies to Envoy's own json_to_metadata and keeps the
Lua for everything else. Why the split (docs/operators/data-path.md; checked on Envoy 1.40):

- The Lua filter costs ~250 µs of Envoy CPU per response even when it reads one small JSON
  chunk (a coroutine, the metadata lookup, the body iteration); json_to_metadata parses the
  same body for a few µs.
- json_to_metadata buffers the whole body, and a response over the connection's buffer
  limit (1 MiB by default) is then Envoy's own 500 (`rs_too_large`). So it only takes
  responses that declare a JSON content type and a content-length of at most six digits;
  chunked or larger JSON stays with the Lua, which never buffers.
- Streams stay with the Lua: sse_to_metadata (Envoy 1.38+) reads each event's usage right,
  across chunk splits and before a cut, but it cannot count the events (what a stream cut
  before its usage is settled with) nor cut out the usage event the sidecar asked for
  (`strip_usage`); the Lua must run on streams anyway, and it reads the usage on the way.

The two filters are gated by one predicate on the response headers, so exactly one of them
reads each response. What must not live here: the names the sidecar reads (the contract).
"""

from __future__ import annotations

from importlib import resources

import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.extensions.common.matching.v3 as matching
import envoy_data_plane.envoy.extensions.filters.common.matcher.action.v3 as action
import envoy_data_plane.envoy.extensions.filters.http.json_to_metadata.v3 as j2m
import envoy_data_plane.envoy.extensions.filters.http.lua.v3 as lua
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.envoy.type.matcher.v3 as envoy_matcher
import envoy_data_plane.google.protobuf as pb
import envoy_data_plane.xds.core.v3 as xds_core
import envoy_data_plane.xds.type.matcher.v3 as xds_matcher

from extproc.request.contract import USAGE_NAMESPACE, USAGE_TAP_FILTER
from policy._data_path import UsageTap
from policy.schema import Policy

# json_to_metadata's own name: a second filter next to the Lua one.
NATIVE_JSON_FILTER = "slogate.usage_json"
JSON_CONTENT_TYPE = r"^application/json(;.*)?$"  # vLLM sends it bare; a charset is allowed
# At most 999,999 bytes: below the 1 MiB buffer limit json_to_metadata's buffering meets.
SMALL_CONTENT_LENGTH = r"^[0-9]{1,6}$"

# Where each API puts each usage number in a JSON body, and the metadata key it goes to.
# Keys the sidecar reads as they are: prompt_tokens, completion_tokens, cached_tokens,
# reasoning_tokens. Anthropic's prompt is input_tokens + both cache fields, summed by the
# sidecar; the Responses API's input_tokens is the whole prompt (its cache fields never
# appear, so the same sum holds).
JSON_USAGE_PATHS: tuple[tuple[str, str], ...] = (
    ("usage.prompt_tokens", "prompt_tokens"),  # chat, completions, embeddings
    ("usage.completion_tokens", "completion_tokens"),
    ("usage.prompt_tokens_details.cached_tokens", "cached_tokens"),
    ("usage.completion_tokens_details.reasoning_tokens", "reasoning_tokens"),
    ("usage.input_tokens", "input_tokens"),  # Responses, Messages
    ("usage.output_tokens", "completion_tokens"),
    ("usage.cache_read_input_tokens", "cache_read_input_tokens"),  # Messages
    ("usage.cache_creation_input_tokens", "cache_creation_input_tokens"),
    ("usage.input_tokens_details.cached_tokens", "cached_tokens"),  # Responses
    ("usage.output_tokens_details.reasoning_tokens", "reasoning_tokens"),
)


def usage_tap_lua() -> str:
    return resources.files("extproc").joinpath("usage_tap.lua").read_text(encoding="utf-8")


def usage_tap_filter() -> hcm.HttpFilter:
    """The Lua tap alone, on every response."""
    return hcm.HttpFilter(name=USAGE_TAP_FILTER, typed_config=pb.Any.pack(lua_config()))


def usage_tap_filters(policy: Policy) -> list[hcm.HttpFilter]:
    """The usage tap of the policy's `data_path.usage_tap`, in filter order."""
    if policy.data_path.usage_tap is UsageTap.LUA:
        return [usage_tap_filter()]
    small_json = _small_json_response()
    return [
        _skipped_when(NATIVE_JSON_FILTER, _json_usage(), _not(small_json)),
        _skipped_when(USAGE_TAP_FILTER, lua_config(), small_json),
    ]


def lua_config() -> lua.Lua:
    return lua.Lua(default_source_code=core.DataSource(inline_string=usage_tap_lua()))


def _json_usage() -> j2m.JsonToMetadata:
    rules = [
        j2m.JsonToMetadataRule(
            selectors=[j2m.JsonToMetadataSelector(key=part) for part in path.split(".")],
            on_present=j2m.JsonToMetadataKeyValuePair(
                metadata_namespace=USAGE_NAMESPACE,
                key=key,
                type=j2m.JsonToMetadataValueType.NUMBER,
            ),
        )
        for path, key in JSON_USAGE_PATHS
    ]
    return j2m.JsonToMetadata(
        response_rules=j2m.JsonToMetadataMatchRules(
            rules=rules,
            # The default list holds the bare "application/json" only.
            allow_content_types_regex=envoy_matcher.RegexMatcher(regex=JSON_CONTENT_TYPE),
        )
    )


Predicate = xds_matcher.MatcherMatcherListPredicate
Predicates = xds_matcher.MatcherMatcherListPredicatePredicateList


def _response_header(name: str, regex: str) -> Predicate:
    return Predicate(
        single_predicate=xds_matcher.MatcherMatcherListPredicateSinglePredicate(
            input=xds_core.TypedExtensionConfig(
                name=name,
                typed_config=pb.Any.pack(
                    envoy_matcher.HttpResponseHeaderMatchInput(header_name=name)
                ),
            ),
            value_match=xds_matcher.StringMatcher(
                safe_regex=xds_matcher.RegexMatcher(
                    google_re2=xds_matcher.RegexMatcherGoogleRe2(), regex=regex
                )
            ),
        )
    )


def _small_json_response() -> Predicate:
    """A JSON body json_to_metadata can buffer; a missing header never matches."""
    both = [
        _response_header("content-type", JSON_CONTENT_TYPE),
        _response_header("content-length", SMALL_CONTENT_LENGTH),
    ]
    return Predicate(and_matcher=Predicates(predicate=both))


def _not(predicate: Predicate) -> Predicate:
    return Predicate(not_matcher=predicate)


def _skipped_when(
    name: str, config: lua.Lua | j2m.JsonToMetadata, skip: Predicate
) -> hcm.HttpFilter:
    skip_action = xds_core.TypedExtensionConfig(
        name="skip", typed_config=pb.Any.pack(action.SkipFilter())
    )
    matcher = xds_matcher.Matcher(
        matcher_list=xds_matcher.MatcherMatcherList(
            matchers=[
                xds_matcher.MatcherMatcherListFieldMatcher(
                    predicate=skip, on_match=xds_matcher.MatcherOnMatch(action=skip_action)
                )
            ]
        )
    )
    wrapped = matching.ExtensionWithMatcher(
        xds_matcher=matcher,
        extension_config=core.TypedExtensionConfig(name=name, typed_config=pb.Any.pack(config)),
    )
    return hcm.HttpFilter(name=name, typed_config=pb.Any.pack(wrapped))
