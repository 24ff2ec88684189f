"""The targets the committed Istio, Envoy Gateway and endpoint-picker examples are rendered
with (`make k8s`), and small readers of the rendered manifests."""

from __future__ import annotations

from typing import Any

from tooling.render.mesh import MeshTarget

SERVICES = {
    "default": ("vllm-default", 8000),
    "long": ("vllm-long", 8000),
    "fallback": ("vllm-fallback", 8000),
}
ISTIO = MeshTarget(pool_services=SERVICES, skip_routes=("status",))
ENVOY_GATEWAY = MeshTarget(
    pool_services={k: v for k, v in SERVICES.items() if k != "long"},
    inference_pools={"long": "long-context"},
)
ENDPOINT_PICKER = MeshTarget(
    endpoint_pickers={"default": "vllm-default", "long": "vllm-long"},
    pool_selectors={"default": {"app": "vllm-default"}, "long": {"app": "vllm-long"}},
    gateway_labels={},
    tls_secret="slogate-tls",
)


def by_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind)


def ms(duration: str) -> int:
    return round(float(duration.removesuffix("s")) * 1000)
