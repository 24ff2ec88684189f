"""`slogate bench listeners`' arithmetic and page (tooling.benchmarks.listeners): the ratio it
chooses the pod's listener by is the median of each round's pair, not a ratio of the arms'
medians (which may come from different rounds)."""

from __future__ import annotations

from tooling.benchmarks.listeners import SHOWN, paired_ratios, table


def _row(scale: float) -> dict[str, float]:
    return {key: 100.0 * scale for key, _ in SHOWN} | {"non_2xx": 1.0}


def test_the_ratio_is_the_median_of_the_rounds_pairs() -> None:
    # A noisy machine: each round ran at its own speed. Paired, the rounds say 1.1, 0.8 and
    # 0.9 (median 0.9); the arms' medians (2.0 and 1.6) would say 0.8.
    runs = {
        "tcp": [_row(1.0), _row(2.0), _row(3.0)],
        "unix": [_row(1.1), _row(1.6), _row(2.7)],
    }
    ratios = paired_ratios(runs)
    assert {round(v, 6) for v in ratios.values()} == {0.9}
    summary = {arm: _row(1.0) for arm in runs}
    page = table(summary, ratios, runs)
    assert "| sidecar CPU µs/req (16 conns) | 100 | 100 | 0.900 |" in page
    assert "| non-2xx (all rounds) | 3 | 3 | |" in page
