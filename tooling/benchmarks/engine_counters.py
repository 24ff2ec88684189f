"""What a live benchmark reads off a vLLM engine: its /metrics counters, summed over labels."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families


def engine_counters(url: str, names: Sequence[str], timeout_s: float = 30.0) -> dict[str, float]:
    """Each named sample of the engine at `url`, summed over its labels (0 when absent)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    values = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values
