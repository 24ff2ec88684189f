"""LoopHistogram / LoopCounter: prometheus_client's exposition, their own lock-free
observation; the same samples as prometheus_client's own types for the same values."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from extproc.service.loop_metrics import LoopCounter, LoopHistogram

BOUNDS = (0.025, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_the_loop_types_expose_what_prometheus_clients_own_do() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    histograms = (
        LoopHistogram("t_seconds", "t", ["pool"], buckets=BOUNDS, registry=ours),
        Histogram("t_seconds", "t", ["pool"], buckets=BOUNDS, registry=theirs),
    )
    counters = (
        LoopCounter("n", "n", ["pool"], registry=ours),
        Counter("n", "n", ["pool"], registry=theirs),
    )
    draw = random.Random(39)
    # Every bound itself (le is inclusive), between them, above the last, and infinity.
    values = [*BOUNDS, 0.0, 7.5, float("inf")] + [draw.uniform(0, 6) for _ in range(500)]
    for value in values:
        pool = draw.choice(("default", "long"))
        for histogram in histograms:
            histogram.labels(pool).observe(value)
        for counter in counters:
            counter.labels(pool).inc(value if value != float("inf") else 1)
    assert _samples(ours) == _samples(theirs)


def test_the_loop_types_keep_prometheus_clients_errors() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("e", "e", ["pool"], registry=registry)
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("default").inc(-1)
    with pytest.raises(ValueError):
        counter.inc()  # the labelled parent itself
    histogram = LoopHistogram("h", "h", ["pool"], buckets=BOUNDS, registry=registry)
    with pytest.raises(ValueError):
        histogram.observe(1.0)
