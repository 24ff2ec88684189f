"""What the pool (and an endpoint picker behind slogate) is told about an admitted request
(extproc.service.replies.upstream_headers): the objective is the caller's tenant's when the
policy names one, else its tier's, under both the inference extension's header names and
llm-d's; every header it sets is one the sidecar owns (a client's copy never survives)."""

from __future__ import annotations

from admission.decision import CountKind, RoutingDecision
from extproc.request.contract import (
    FAIRNESS_HEADER,
    LLM_D_FAIRNESS_HEADER,
    LLM_D_OBJECTIVE_HEADER,
    OBJECTIVE_HEADER,
    SIDECAR_SET_HEADERS,
)
from extproc.service.replies import upstream_headers
from policy.loader import parse_policy


def headers_for(key: str) -> dict[str, str]:
    policy = parse_policy(
        {
            "tenants": {
                "defaults": {"tier": "standard"},
                "classes": {"gold": {"tier": "critical", "inference_objective": "gold-chat"}},
                "list": {"acme": "gold", "plain": {}},
            },
            "keys": [
                {"key": "sk-acme", "tenant": "acme"},
                {"key": "sk-acme-batch", "tenant": "acme", "tier": "sheddable"},
                {"key": "sk-plain", "tenant": "plain"},
            ],
        }
    )
    caller = policy.key_for(key)
    assert caller is not None
    decision = RoutingDecision(
        request_id="rid",
        caller=caller,
        pool="default",
        bucket=policy.buckets[0],
        prompt_tokens=10,
        max_tokens=10,
        estimate=CountKind.EXACT,
        stream=False,
    )
    return upstream_headers(decision)


def test_the_objective_is_the_tenants_else_the_tiers() -> None:
    acme = headers_for("sk-acme")
    assert acme[OBJECTIVE_HEADER] == acme[LLM_D_OBJECTIVE_HEADER] == "gold-chat"
    assert acme[FAIRNESS_HEADER] == acme[LLM_D_FAIRNESS_HEADER] == "acme"
    # A key of another tier than its tenant's: the tenant's objective carries the tenant's
    # priority, so the key names its own tier's.
    assert headers_for("sk-acme-batch")[OBJECTIVE_HEADER] == "slogate-sheddable"
    assert headers_for("sk-plain")[LLM_D_OBJECTIVE_HEADER] == "slogate-standard"


def test_every_header_set_is_the_sidecars_own() -> None:
    assert set(headers_for("sk-acme")) <= set(SIDECAR_SET_HEADERS)
