"""The one-message-per-request lever, measured on the pass-through (`passthrough_one_message`).

ENVOY-NOTES' recipe: ext_proc skips the request headers (the processor gets only the
buffered body), a `header_to_metadata` filter before it forwards the caller's identity in
metadata, and a `buffer` filter after it holds the request until the body's reply (with
the headers skipped the router would otherwise forward them before the decision). slogate
does not run this way; this bootstrap says what the mechanism saves per request at each body
size, in the same run as everything else, before anyone builds it into the sidecar.
"""

from __future__ import annotations

from typing import Any

from extproc.request.contract import EXT_PROC_FILTER

IDENTITY_NAMESPACE = "slogate.identity"
_BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
_HEADER_TO_METADATA = (
    "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config"
)


def one_message(config: dict[str, Any], max_body_bytes: int) -> None:
    """Rewrite an EXT_PROC_ONLY bootstrap (camelCase JSON) in place to the recipe."""
    for listener in config["staticResources"]["listeners"]:
        for chain in listener["filterChains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typedConfig"]
                filters = manager.get("httpFilters")
                if filters is None:
                    continue
                at = next(i for i, f in enumerate(filters) if f["name"] == EXT_PROC_FILTER)
                processor = filters[at]["typedConfig"]
                processor["processingMode"]["requestHeaderMode"] = "SKIP"
                processor.setdefault("metadataOptions", {})["forwardingNamespaces"] = {
                    "untyped": [IDENTITY_NAMESPACE]
                }
                identity = {
                    "name": "envoy.filters.http.header_to_metadata",
                    "typedConfig": {
                        "@type": _HEADER_TO_METADATA,
                        "requestRules": [
                            {
                                "header": header,
                                "onHeaderPresent": {
                                    "metadataNamespace": IDENTITY_NAMESPACE,
                                    "key": header,
                                    "type": "STRING",
                                },
                                "remove": False,
                            }
                            for header in (":path", ":method", "authorization", "x-request-id")
                        ],
                    },
                }
                hold = {
                    "name": "envoy.filters.http.buffer",
                    "typedConfig": {"@type": _BUFFER, "maxRequestBytes": max_body_bytes},
                }
                filters[at : at + 1] = [identity, filters[at], hold]
