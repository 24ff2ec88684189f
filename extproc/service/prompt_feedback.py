"""Settled usage fed back into prompt counting: the per-key corrections and their metrics.

What lives here: `PromptFeedback`, the OutcomeSink that hands each settled request's
engine-reported `prompt_tokens` and the count it was admitted on to
`extproc.request.tokens.corrections.PromptCorrections`, counts the under-counted ones per tenant
(`slogate_prompt_undercounts_total`) and shows each tenant's largest correction
(`slogate_prompt_correction`). A key that crosses into correction is logged once with its id.
"""

from __future__ import annotations

import logging

from admission.decision import RequestOutcome
from extproc.request.tokens.corrections import PromptCorrections
from extproc.service.metrics import SidecarMetrics

log = logging.getLogger("slogate.counting")


class PromptFeedback:
    def __init__(self, corrections: PromptCorrections, metrics: SidecarMetrics) -> None:
        self._corrections = corrections
        self._metrics = metrics

    def record(self, outcome: RequestOutcome) -> None:
        decision = outcome.decision
        engine = outcome.prompt_tokens
        if engine is None or not decision.exact or not decision.meters_tokens:
            return  # no usage, or a byte-bound count (over the real one by design)
        key = decision.caller
        before = self._corrections.factor(key.key_id)
        counted = round(decision.prompt_tokens / decision.prompt_correction)
        if self._corrections.observe(key.key_id, counted, engine):
            self._metrics.prompt_undercounts(key.tenant_label).inc()
        after = self._corrections.factor(key.key_id)
        if after != before:
            if before == 1.0:
                log.warning(
                    "key %s (tenant %s): the engine counts %.2fx its prompts; counting them so",
                    key.key_id,
                    key.tenant,
                    after,
                )
            self._metrics.prompt_correction(key.tenant_label).set(after)
