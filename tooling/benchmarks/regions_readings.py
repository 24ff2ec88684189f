"""The regions lab's readings (`slogate bench regions`): what each request got (`Shot`),
each region's region metrics at a moment (`Sample`), the pure summaries over them, and
the readers of a sidecar's /metrics and of the global ledger's records.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tooling.stack.regions import (
    GLOBAL_KEY,
)


@dataclass(slots=True)
class Shot:
    """One request and what came back."""

    phase: str
    region: str  # where it was sent
    key: str
    sent_s: float  # since the run's start
    status: int = 0  # 0: no answer (a client error)
    latency_s: float = 0.0
    ttft_s: float | None = None  # streamed requests: the first body bytes
    served: str | None = None  # the region whose engine answered (x-sim-pool)
    tokens: int = 0  # prompt + completion of an answered request
    error: str = ""


@dataclass(slots=True)
class Sample:
    """One region's region metrics at one moment."""

    t_s: float
    region: str
    share: float | None
    state: str | None
    usage: float | None
    crossed: float | None


# -- pure summaries ------------------------------------------------------------------------


def admitted_tokens(shots: Sequence[Shot], start_s: float, end_s: float) -> int:
    """Tokens of the global tenant's answered requests sent in [start_s, end_s)."""
    return sum(
        s.tokens
        for s in shots
        if s.key == GLOBAL_KEY and s.status == 200 and start_s <= s.sent_s < end_s
    )


def overshoot(shots: Sequence[Shot], start_s: float, end_s: float, limit_per_min: float) -> float:
    """Tokens admitted fleet-wide per minute over the window / the global limit."""
    minutes = (end_s - start_s) / 60.0
    return admitted_tokens(shots, start_s, end_s) / minutes / limit_per_min


def seconds_to_share(
    samples: Sequence[Sample], region: str, since_s: float, share: float
) -> float | None:
    """Seconds from `since_s` until `region`'s lease share first reached `share`; None: never."""
    for sample in samples:
        if (
            sample.region == region
            and sample.t_s >= since_s
            and sample.share is not None
            and sample.share >= share
        ):
            return sample.t_s - since_s
    return None


def states_seen(samples: Sequence[Sample], region: str, start_s: float, end_s: float) -> list[str]:
    """The ledger states `region` went through in the window, in order (a state repeated
    in a row once)."""
    seen: list[str] = []
    for sample in samples:
        inside = sample.region == region and start_s <= sample.t_s < end_s
        if inside and sample.state and (not seen or seen[-1] != sample.state):
            seen.append(sample.state)
    return seen


def mean_share_sum(samples: Sequence[Sample], start_s: float, end_s: float) -> float | None:
    """The regions' lease shares over the window, each region's mean, summed: how much of
    the global limit the regions held between them (1.0: all of it)."""
    by_region: dict[str, list[float]] = {}
    for sample in samples:
        if start_s <= sample.t_s < end_s and sample.share is not None:
            by_region.setdefault(sample.region, []).append(sample.share)
    if not by_region:
        return None
    return sum(statistics.fmean(shares) for shares in by_region.values())


def median_ms(values: Sequence[float]) -> float | None:
    return round(statistics.median(values) * 1000, 1) if values else None


# -- reading a sidecar ---------------------------------------------------------------------


def read_sample(text: str, t_s: float, region: str, tenant: str) -> Sample:
    """The region metrics of one /metrics page (None where this sidecar has no such metric)."""
    from prometheus_client.parser import text_string_to_metric_families

    share = usage = crossed = None
    state = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "slogate_region_lease_share" and s.labels.get("tenant") == tenant:
                share = s.value
            elif s.name == "slogate_region_usage_tokens_total" and s.labels.get("tenant") == tenant:
                usage = s.value
            elif s.name == "slogate_region_ledger_state" and s.value == 1:
                state = s.labels.get("state")
            elif s.name == "slogate_region_crossed_total":
                crossed = (crossed or 0.0) + s.value
    return Sample(t_s, region, share, state, usage, crossed)


def has_metric(text: str, name: str) -> bool:
    """Whether the page declares the metric (a counter's as `<name>_total`, as
    prometheus_client writes it)."""
    return f"# TYPE {name} " in text or f"# TYPE {name}_total " in text


def labelled(text: str, name: str, label: str) -> dict[str, float]:
    """`name`'s samples on the page by the value of `label` (summed over the others)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and label in s.labels:
                found[s.labels[label]] = found.get(s.labels[label], 0.0) + s.value
    return found


def read_global_usage(redis_url: str, tenant: str) -> dict[str, float] | None:
    """Each region's usage of `tenant` as the global ledger stores it (its last report's
    cumulative usage; the leases' global_usage is their sum); None where this checkout has
    no global ledger (branch leases). Read from the ledger's own records
    (budget.global_ledger: `<PREFIX>:tenant:<tenant>`, region -> a MessagePack record)."""
    try:
        from budget import global_ledger
    except ImportError:
        return None
    import msgspec
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5.0)
    try:
        stored: dict[bytes, bytes] = client.hgetall(f"{global_ledger.PREFIX}:tenant:{tenant}")  # type: ignore[assignment]
    finally:
        client.close()
    return {
        region.decode(): float(msgspec.msgpack.decode(record)["usage"])
        for region, record in stored.items()
    }
