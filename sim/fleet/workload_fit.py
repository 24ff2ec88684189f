"""A workload fitted to a traffic record (`slogate workload fit`): what `slogate simulate`
and `slogate loadtest` play, drawn from the user's own traffic.

What lives here: `fit_workload` (record entries -> a workload document, the schema
sim.fleet.workload_files reads) and `burst_windows`. Per tenant: one stream with its mean
arrival rate and its shape (the rate per `bin_s` bin over the mean: `shape` points at each
bin's start and 1 s before its end, a step that plays each bin at its recorded rate, bursts
included), its prompt and output lengths as quantile tables (every 5%), its streamed share and
its median `max_tokens`; and its burst windows. No I/O: the caller reads the record and writes
the file.

A record longer than a day is folded onto one UTC day (each bin's rate is the mean over the
days that covered it): the workload is a day, its daily shape the record's average day.
Bursts are found on the unfolded timeline: they are written (with their times) but a burst
seen on one day of seven is one seventh as high in the folded shape.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from extproc.service.traffic_read import TrafficEntry

DAY_S = 86_400.0
# A bin whose rate is over BURST_FACTOR x the tenant's median bin rate is part of a burst
# (and holds at least BURST_MIN_REQUESTS, so that a sparse tenant's noise is not one).
BURST_FACTOR = 3.0
BURST_MIN_REQUESTS = 5
QUANTILE_POINTS = 21  # 0%, 5%, ... 100%
RAMP_S = 1.0


def bin_widths(duration_s: float, bin_s: float) -> list[float]:
    """`duration_s` cut into bins of `bin_s`, the last one taking the remainder (so no bin
    is shorter than `bin_s` unless the whole is: a sliver of a bin would make one request a
    spike in the rate)."""
    bins = max(1, math.floor(duration_s / bin_s))
    return [bin_s] * (bins - 1) + [duration_s - (bins - 1) * bin_s]


def _quantile_table(values: Sequence[int]) -> list[int]:
    probabilities = np.linspace(0.0, 1.0, QUANTILE_POINTS)
    return [round(float(v)) for v in np.quantile(np.asarray(values, dtype=float), probabilities)]


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")


def burst_windows(
    times: Sequence[float],
    start_s: float,
    end_s: float,
    bin_s: float,
    factor: float = BURST_FACTOR,
) -> list[dict[str, Any]]:
    """The windows (merged runs of bins) where the rate is over `factor` x the median bin
    rate (the mean where the median is 0), as {start_s, end_s (Unix seconds), rate_per_s,
    factor (over that median)}."""
    widths = np.array(bin_widths(end_s - start_s, bin_s))
    bins = len(widths)
    counts = np.zeros(bins)
    for t in times:
        counts[min(bins - 1, max(0, int((t - start_s) // bin_s)))] += 1
    rates = counts / np.maximum(widths, 1e-9)
    baseline = float(np.median(rates)) or float(counts.sum() / max(end_s - start_s, 1e-9))
    hot = (rates > factor * baseline) & (counts >= BURST_MIN_REQUESTS)
    windows: list[dict[str, Any]] = []
    i = 0
    while i < bins:
        if not hot[i]:
            i += 1
            continue
        j = i
        while j + 1 < bins and hot[j + 1]:
            j += 1
        seconds = float(widths[i : j + 1].sum())
        rate = float(counts[i : j + 1].sum()) / seconds
        windows.append(
            {
                "start_s": start_s + i * bin_s,
                "end_s": start_s + i * bin_s + seconds,
                "rate_per_s": round(rate, 4),
                "factor": round(rate / baseline, 2),
            }
        )
        i = j + 1
    return windows


def fit_workload(
    entries: Sequence[TrafficEntry],
    start_s: float | None = None,
    end_s: float | None = None,
    bin_s: float = 300.0,
    burst_factor: float = BURST_FACTOR,
    name: str = "fitted",
) -> dict[str, Any]:
    """A workload document fitted to the record's entries between start_s and end_s
    (default: the first arrival, and the last rounded up to a whole bin). Entries without
    a tenant (refused before the key was known) are left out; lengths come from those that
    have them (the real usage where the engine answered, else the counted prompt)."""
    by_tenant: dict[str, list[TrafficEntry]] = defaultdict(list)
    for entry in entries:
        if entry.tenant:
            by_tenant[entry.tenant].append(entry)
    if not by_tenant:
        raise ValueError("no recorded request names a tenant")
    times = [e.t for rows in by_tenant.values() for e in rows]
    start = min(times) if start_s is None else start_s
    # Without --to: the last arrival, rounded up to a whole bin.
    end = start + math.ceil((max(times) - start) / bin_s) * bin_s if end_s is None else end_s
    if end <= start:
        raise ValueError("the record spans no time")
    folded = end - start > DAY_S
    day0 = math.floor(start / DAY_S) * DAY_S  # the first record's UTC midnight
    days = (end - start) / DAY_S
    duration_s = DAY_S if folded else end - start
    widths = bin_widths(duration_s, bin_s)
    bins = len(widths)
    # Each bin's factor held from its start to RAMP_S before its end (the shape is linear
    # between points: that second is the ramp to the next bin's factor).
    edges = [(i * bin_s, i * bin_s + max(widths[i] - RAMP_S, widths[i] / 2)) for i in range(bins)]

    tenants: list[dict[str, Any]] = []
    all_bursts: list[list[float]] = []
    burst_tenants: list[str] = []
    for tenant in sorted(by_tenant):
        rows = by_tenant[tenant]
        counts = [0] * bins
        for e in rows:
            offset = (e.t - day0) % DAY_S if folded else e.t - start
            counts[min(bins - 1, max(0, int(offset // bin_s)))] += 1
        cover = days if folded else 1.0
        rates = [c / (w * cover) for c, w in zip(counts, widths, strict=True)]
        mean_rate = len(rows) / (duration_s * cover)
        prompts: list[int] = []
        for e in rows:
            size = e.usage_prompt if e.usage_prompt is not None else e.prompt
            if size is not None:
                prompts.append(size)
        outputs = [e.usage_completion for e in rows if e.usage_completion is not None]
        maxima = [e.max_tokens for e in rows if e.max_tokens > 0]
        stream: dict[str, Any] = {
            "rate_per_s": round(mean_rate, 6),
            "shape": [
                [round(t, 1), round(r / mean_rate, 4)]
                for (first, last), r in zip(edges, rates, strict=True)
                for t in (first, last)
            ],
            "prompt_tokens": _quantile_table(prompts) if prompts else [1, 1],
            "stream_share": round(sum(e.stream for e in rows) / len(rows), 4),
        }
        if outputs:
            stream["output_tokens"] = _quantile_table(outputs)
        stream["max_tokens"] = (
            int(statistics.median(maxima))
            if maxima
            else (max(stream.get("output_tokens", [256])) or 256)
        )
        tier = Counter(e.tier for e in rows if e.tier).most_common(1)
        windows = burst_windows([e.t for e in rows], start, end, bin_s, burst_factor)
        document: dict[str, Any] = {
            "tenant": tenant,
            "tier": tier[0][0] if tier else "standard",
            "streams": [stream],
        }
        if windows:
            document["bursts"] = [
                {
                    "from": _iso(w["start_s"]),
                    "to": _iso(w["end_s"]),
                    "rate_per_s": w["rate_per_s"],
                    "factor": w["factor"],
                }
                for w in windows
            ]
            for w in windows:  # in the workload's time: seconds from its start
                at = (w["start_s"] - day0) % DAY_S if folded else w["start_s"] - start
                until = min(duration_s, at + w["end_s"] - w["start_s"])
                all_bursts.append([round(at, 1), round(until, 1)])
            burst_tenants.append(tenant)
        tenants.append(document)

    workload: dict[str, Any] = {"name": name, "duration_s": round(duration_s, 1)}
    if all_bursts:
        workload["bursts"] = sorted(all_bursts)
        workload["burst_tenants"] = burst_tenants
    workload["fitted"] = {
        "from": _iso(start),
        "to": _iso(end),
        "requests": len(times),
        "bin_s": bin_s,
        "folded_days": round(days, 2) if folded else None,
        "burst_factor": burst_factor,
    }
    workload["tenants"] = tenants
    return workload
