"""A tenant's demand over time, from the traffic record: what a seasonal fit learns from.

What lives here: `RecordedRequest` (the few fields of a traffic record entry this needs,
extproc.service.traffic_read.TrafficEntry has them), `request_tokens` (one request's weighted
tokens) and `demand_series` (entries -> per tenant, per bin: weighted tokens per minute and
requests per minute). No I/O: the entries come from the caller.

Weighted tokens are the budgets' unit (admission.budget_step): tokens x the context bucket's
cost weight. A request counts its settled usage (prompt + completion) where the engine
reported it; otherwise what its budget reserved, or would have: the counted prompt plus every
completion's limit. A refused request is demand too (what the tenant asked for), counted the
same way; a refusal before counting (no prompt) counts as a request of no tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


class RecordedRequest(Protocol):
    @property
    def t(self) -> float: ...  # arrival, Unix seconds
    @property
    def tenant(self) -> str | None: ...
    @property
    def bucket(self) -> str | None: ...
    @property
    def prompt(self) -> int | None: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def usage_prompt(self) -> int | None: ...
    @property
    def usage_completion(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class DemandSeries:
    """One tenant's demand in consecutive bins of `bin_s` seconds from `start_s`."""

    tenant: str
    start_s: float
    bin_s: float
    tokens_per_minute: tuple[float, ...]  # weighted
    requests_per_minute: tuple[float, ...]

    @property
    def end_s(self) -> float:
        return self.start_s + self.bin_s * len(self.tokens_per_minute)

    def bins_per_day(self) -> int:
        return round(86400 / self.bin_s)


def request_tokens(entry: RecordedRequest, weight: float) -> float:
    """One request's weighted tokens (see the module's docstring)."""
    if entry.usage_prompt is not None and entry.usage_completion is not None:
        return (entry.usage_prompt + entry.usage_completion) * weight
    if entry.prompt is None:
        return 0.0
    prompt = entry.usage_prompt if entry.usage_prompt is not None else entry.prompt
    return (prompt + max(entry.n, 1) * entry.max_tokens) * weight


def demand_series(
    entries: Iterable[RecordedRequest],
    *,
    bin_s: float,
    start_s: float,
    end_s: float,
    cost_weight: Callable[[str | None], float] | Mapping[str, float] | None = None,
) -> dict[str, DemandSeries]:
    """Per tenant, the demand of [start_s, end_s) in bins of `bin_s` (the last partial bin
    is dropped: its rate would read low). A bin with no request is 0: a quiet night is
    demand too. Entries without a tenant are left out. `cost_weight`: a bucket's cost weight
    (a mapping by bucket name, or a function); absent or unknown: 1."""
    if bin_s <= 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    bins = max(0, math.floor((end_s - start_s) / bin_s))
    weigh = _weigher(cost_weight)
    tokens: dict[str, list[float]] = {}
    requests: dict[str, list[float]] = {}
    for entry in entries:
        tenant = entry.tenant
        if tenant is None or not start_s <= entry.t < end_s:
            continue
        index = int((entry.t - start_s) // bin_s)
        if index >= bins:
            continue
        if tenant not in tokens:
            tokens[tenant] = [0.0] * bins
            requests[tenant] = [0.0] * bins
        tokens[tenant][index] += request_tokens(entry, weigh(entry.bucket))
        requests[tenant][index] += 1.0
    per_minute = 60.0 / bin_s
    return {
        tenant: DemandSeries(
            tenant,
            start_s,
            bin_s,
            tuple(v * per_minute for v in tokens[tenant]),
            tuple(v * per_minute for v in requests[tenant]),
        )
        for tenant in sorted(tokens)
    }


def _weigher(
    cost_weight: Callable[[str | None], float] | Mapping[str, float] | None,
) -> Callable[[str | None], float]:
    if cost_weight is None:
        return lambda bucket: 1.0
    if callable(cost_weight):
        return cost_weight
    weights = dict(cost_weight)
    return lambda bucket: weights.get(bucket, 1.0) if bucket is not None else 1.0
