"""What a policy change does to recorded traffic: `slogate policy diff OLD NEW --traffic`'s
comparison, from two replays of the same record (sim.replay.replayed_requests).

What lives here: `compare` (two replays -> one row per tenant and tier: requests,
admitted, refused by reason, routed per pool, P99 TTFT, SLO attainment, goodput, and how
many requests met another fate), `check_guards` (the limits a CI pipeline holds a change
to) and `impact_markdown` (the changes first, for a pull-request comment). Pure: nothing
here replays, reads or writes; both replays must come from the same entries and seed, so
that request i is the same arrival in both and an untouched tenant shows no change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policy.quantiles import quantile
from sim.replay import ReplayedRequest, ReplayedRequests

CRITICAL = "critical"


def _side(rows: Sequence[ReplayedRequest], duration_s: float) -> dict[str, Any]:
    """One tenant and tier under one policy."""
    admitted = [r for r in rows if r.outcome == "admitted"]
    ttfts = [r.ttft_s for r in admitted if r.ttft_s is not None]
    met = [r for r in rows if r.slo_met]
    return {
        "requests": len(rows),
        "admitted": len(admitted),
        "refused": dict(sorted(Counter(r.reason for r in rows if r.outcome != "admitted").items())),
        "routed": dict(sorted(Counter(r.pool for r in admitted).items())),
        "p99_ttft_s": round(quantile(ttfts, 0.99), 3) if ttfts else None,
        "slo_attainment": round(len(met) / len(rows), 4) if rows else None,
        "goodput_tokens_per_s": round(sum(r.output_tokens for r in met) / duration_s, 1),
    }


def _fate(request: ReplayedRequest) -> tuple[str, str, str]:
    return request.outcome, request.reason, request.pool


def _p99_growth(old: dict[str, Any], new: dict[str, Any]) -> float | None:
    before, after = old["p99_ttft_s"], new["p99_ttft_s"]
    if before is None or after is None or before <= 0:
        return None  # nothing served under one of them: no growth to speak of
    return after / before - 1


def compare(old: ReplayedRequests, new: ReplayedRequests) -> list[dict[str, Any]]:
    """One row per (tenant, tier) seen under either policy, the changed first (most
    requests with another fate, then the largest P99 TTFT change), then the unchanged."""
    if len(old.requests) != len(new.requests):
        raise ValueError("the two replays are not of the same entries")
    groups: dict[tuple[str, str], tuple[list[ReplayedRequest], list[ReplayedRequest]]] = {}
    moved: Counter[tuple[str, str]] = Counter()
    for before, after in zip(old.requests, new.requests, strict=True):
        was, became = (before.tenant, before.tier), (after.tenant, after.tier)
        groups.setdefault(was, ([], []))[0].append(before)
        groups.setdefault(became, ([], []))[1].append(after)
        if _fate(before) != _fate(after) or was != became:
            moved[was] += 1
            if became != was:
                moved[became] += 1
    rows: list[dict[str, Any]] = []
    for (tenant, tier), (olds, news) in groups.items():
        row_old, row_new = _side(olds, old.duration_s), _side(news, new.duration_s)
        growth = _p99_growth(row_old, row_new)
        rows.append(
            {
                "tenant": tenant,
                "tier": tier,
                "changed": row_old != row_new,
                "requests_with_another_fate": moved[(tenant, tier)],
                "p99_ttft_growth": None if growth is None else round(growth, 4),
                "old": row_old,
                "new": row_new,
            }
        )
    rows.sort(
        key=lambda r: (
            not r["changed"],
            -r["requests_with_another_fate"],
            -abs(r["p99_ttft_growth"] or 0.0),
            r["tenant"],
            r["tier"],
        )
    )
    return rows


@dataclass(frozen=True, slots=True)
class Guards:
    """`max_critical_loss`: the share of its admitted requests a tenant with critical
    traffic may lose (all its tiers together, so a tier move counts by what it is admitted);
    `max_p99_growth`: how much a tenant's P99 TTFT may grow, per tier (relative)."""

    max_critical_loss: float = 0.01
    max_p99_growth: float = 0.20


def check_guards(rows: Sequence[dict[str, Any]], guards: Guards) -> list[dict[str, Any]]:
    """Each guard a change trips: which tenant, what, from what to what, against what."""
    tripped: list[dict[str, Any]] = []
    critical = {r["tenant"] for r in rows if r["tier"] == CRITICAL and r["old"]["requests"]}
    for tenant in sorted(critical):
        before = sum(r["old"]["admitted"] for r in rows if r["tenant"] == tenant)
        after = sum(r["new"]["admitted"] for r in rows if r["tenant"] == tenant)
        loss = (before - after) / before if before else 0.0
        if loss > guards.max_critical_loss:
            tripped.append(
                {
                    "guard": "max_critical_loss",
                    "tenant": tenant,
                    "tier": CRITICAL,
                    "old": before,
                    "new": after,
                    "change": round(-loss, 4),
                    "limit": guards.max_critical_loss,
                    "message": f"critical tenant {tenant} loses {before - after} of its "
                    f"{before} admitted requests ({loss:.1%}; at most "
                    f"{guards.max_critical_loss:.1%} may be lost)",
                }
            )
    for row in rows:
        growth = row["p99_ttft_growth"]
        if growth is not None and growth > guards.max_p99_growth:
            before, after = row["old"]["p99_ttft_s"], row["new"]["p99_ttft_s"]
            tripped.append(
                {
                    "guard": "max_p99_growth",
                    "tenant": row["tenant"],
                    "tier": row["tier"],
                    "old": before,
                    "new": after,
                    "change": growth,
                    "limit": guards.max_p99_growth,
                    "message": f"tenant {row['tenant']} ({row['tier']}): P99 TTFT {before} s → "
                    f"{after} s (+{growth:.1%}; at most +{guards.max_p99_growth:.0%})",
                }
            )
    return tripped


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "—"


def _cell(before: Any, after: Any, show: Any = str) -> str:
    if before == after:
        return show(before)
    return f"{show(before)} → {show(after)}"


def _by_name(before: dict[str, int], after: dict[str, int]) -> str:
    """Per name (reason, pool): the unchanged as they are, the changed as before → after."""
    if before == after:
        return _counts(before)
    parts = []
    for name in sorted({*before, *after}):
        b, a = before.get(name, 0), after.get(name, 0)
        parts.append(f"{name} {b}" if a == b else f"{name} {b} → {a}")
    return ", ".join(parts)


def _number(value: Any) -> str:
    return "—" if value is None else str(value)


def _table_row(row: dict[str, Any]) -> str:
    old, new = row["old"], row["new"]
    cells = [
        row["tenant"],
        row["tier"],
        _cell(old["requests"], new["requests"]),
        _cell(old["admitted"], new["admitted"]),
        _by_name(old["refused"], new["refused"]),
        _by_name(old["routed"], new["routed"]),
        _cell(old["p99_ttft_s"], new["p99_ttft_s"], _number),
        _cell(old["slo_attainment"], new["slo_attainment"], _number),
        _cell(old["goodput_tokens_per_s"], new["goodput_tokens_per_s"], _number),
        str(row["requests_with_another_fate"]),
    ]
    return "| " + " | ".join(cells) + " |"


_HEADER = [
    "| tenant | tier | requests | admitted | refused (by reason) | routed (by pool) "
    "| P99 TTFT s | SLO attainment | goodput tok/s | another fate |",
    "|---|---|---:|---:|---|---|---:|---:|---:|---:|",
]


def impact_markdown(
    rows: Sequence[dict[str, Any]], tripped: Sequence[dict[str, Any]], guards: Guards
) -> str:
    """The guards' verdict, the changed rows (old → new), then the unchanged, collapsed."""
    lines: list[str] = []
    if tripped:
        lines.append(f"**{len(tripped)} guard(s) tripped:**")
        lines += [f"- {t['message']}" for t in tripped]
    else:
        lines.append(
            f"Guards hold: no critical tenant loses more than {guards.max_critical_loss:.1%} "
            f"of its admitted requests, no tenant's P99 TTFT grows more than "
            f"{guards.max_p99_growth:.0%}."
        )
    lines.append("")
    changed = [r for r in rows if r["changed"]]
    same = [r for r in rows if not r["changed"]]
    if changed:
        lines += [f"{len(changed)} tenant/tier row(s) change:", "", *_HEADER]
        lines += [_table_row(r) for r in changed]
    else:
        lines.append("No tenant's outcomes change.")
    if same:
        lines += [
            "",
            f"<details><summary>{len(same)} row(s) unchanged</summary>",
            "",
            *_HEADER,
            *[_table_row(r) for r in same],
            "",
            "</details>",
        ]
    return "\n".join(lines)
