"""One ext_proc message per request (policy `data_path.messages: one`): the sidecar's side.

Envoy skips the request headers and sends only the buffered body (tooling.render.envoy_config.
one_message). What lives here: reading the request headers the sidecar decides on out of
the metadata forwarded with the body, and turning a body reply's header mutations into
metadata the pool route renders upstream (Envoy drops header mutations when it skipped the
headers). The decision itself is the same code as in the two-message mode (the servicer
runs the header phase's logic on the forwarded headers, then the body's).
"""

from __future__ import annotations

from admission.errors import InternalError
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import FORWARDED_NAMESPACE, METADATA_NAMESPACE

# A header mutation Envoy can drop: without any mutation it ignores clear_route_cache
# (stat clear_route_cache_ignored) and the request keeps the route picked before the
# decision (ENVOY-NOTES). No client sends this header; removing it changes nothing.
_ROUTE_CACHE_KEEPER = "x-slogate-route-again"


def forwarded_headers(request: pb.ProcessingRequest) -> dict[str, str]:
    """The request headers a body message without a header message carries as metadata
    (an absent header is absent here too)."""
    namespaces = request.metadata_context.filter_metadata
    forwarded = namespaces.get(FORWARDED_NAMESPACE) if namespaces else None
    if forwarded is None:
        # A body without its headers and without the forwarding filter: Envoy is set up
        # for one message per request without slogate's filter before ext_proc.
        raise InternalError(
            "The gateway received a request body without its headers.",
            reason="headers_not_forwarded",
        )
    return {name: value.string_value for name, value in forwarded.fields.items()}


def headers_as_metadata(reply: pb.ProcessingResponse) -> None:
    """Move the headers a body reply still sets into METADATA_NAMESPACE under their names
    (the pool routes render them: contract.UPSTREAM_METADATA_HEADERS) and keep the mutation
    non-empty, so that clear_route_cache still routes again. The routed reply's own headers
    are built there already (replies.routed_body_reply); what is left is an observer's (the
    tracer's traceparent)."""
    common = reply.request_body.response
    mutation = common.header_mutation
    if not mutation.set_headers and not common.clear_route_cache:
        return
    if mutation.set_headers:
        fields = reply.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
        for option in mutation.set_headers:
            fields[option.header.key].string_value = option.header.raw_value.decode()
    mutation.Clear()
    mutation.remove_headers.append(_ROUTE_CACHE_KEEPER)
