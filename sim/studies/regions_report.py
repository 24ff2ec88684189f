"""Regions in the simulator: the sweep over link delays and report intervals, and its
table (bench/results/regions-sim.*). The phases: sim.studies.regions; crossing:
sim.studies.regions_crossing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sim.studies.regions import DELAYS_S, INTERVALS_S, death, play
from sim.studies.regions_crossing import crossing
from sim.studies.regions_setup import RegionsSetup, lab_setup


def sweep(
    base: RegionsSetup,
    delays_s: Sequence[float] = DELAYS_S,
    intervals_s: Sequence[float] = INTERVALS_S,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """(a)-(c) at every link delay and report interval; the death at the base's."""
    rows = []
    for delay_s in delays_s:
        for interval_s in intervals_s:
            setup = dataclasses.replace(base, delay_s=delay_s, interval_s=interval_s)
            rows.append(play(setup))
            progress(f"  {delay_s * 1000:.0f} ms one way, reports every {interval_s:g} s: done")
    lab = lab_setup(base.seed)
    report = {
        "setup": dataclasses.asdict(base),
        "rows": rows,
        "death": death(base),
        "lab_setup": dataclasses.asdict(lab),
        "lab": play(lab),
        "crossing": crossing(base),
    }
    progress("  the region's death and the lab's setup: done")
    return report


def _n(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _reconciled(cut: dict[str, Any]) -> str:
    text = "exact" if cut["reconciled"] else "NO"
    if cut["duplicates"]:
        text += "; late duplicate " + ("COUNTED" if cut["duplicates_changed_usage"] else "ignored")
    return text


_HEADER = (
    "| one-way delay | interval | (a) max minute / limit | (a) max 10 s / limit | "
    "(a) first minute / limit | (a) mean sum of shares | (b) s to 90% share | "
    "(b) s to 90% admitted | (b) bound s | (c) admitted cut off / held share | "
    "(c) fallback after lease s | (c) on fallback s | (c) leased again after heal s | "
    "(c) ledger = regions | max sum of shares |\n"
    "| --- |" + " --- |" * 14
)


def _line(row: dict[str, Any]) -> str:
    a, b, c = row["a"], row["b"], row["c"]
    return (
        f"| {row['delay_ms']} ms | {row['interval_s']:g} s | "
        f"{_n(a['max_minute_over_limit'], 3)} | {_n(a['max_10s_over_limit'], 3)} | "
        f"{_n(a['first_minute_over_limit'])} | {_n(a['mean_share_sum'], 3)} | "
        f"{_n(b['share_s'], 1)} | {_n(b['admitted_s'], 1)} | {_n(b['bound_s'], 1)} | "
        f"{_n(c['admitted_over_held'])} | {_n(c['fallback_after_s'], 1)} | "
        f"{_n(c['on_fallback_s'], 1)} | {_n(c['leased_again_after_heal_s'], 1)} | "
        f"{_reconciled(c)} | {_n(row['max_share_sum'], 4)} |"
    )


def _lab_lines(report: dict[str, Any]) -> list[str]:
    lab = report["lab_setup"]
    return [
        "",
        "The live lab's setup (`slogate bench regions`: one-way delays "
        f"{report['lab']['delay_ms']} ms for {', '.join(lab['regions'])}, "
        f"{lab['limit_tpm']:,} tokens/min asked {lab['demand_x']:g}x in "
        f"~{sum(lab['prompt_tokens']) // 2 + lab['output_tokens']:,}-token requests, "
        f"reports every {lab['interval_s']:g} s, lease_s {lab['lease_s']:g}, "
        f"fallback_for_s {lab['fallback_for_s']:g}, min_share {lab['min_share']:g}; (a) "
        f"{lab['spread_s'] - 60:g} s after the buckets drained, (b) {lab['moved_s']:g} s, "
        f"(c) {lab['regions'][lab['cut_index']]} cut off for {2 * lab['lease_s']:g} s) in "
        "the simulator, for the lab's table beside it:",
        "",
        _HEADER,
        _line(report["lab"]),
        "",
        "Few large requests (about two a second fleet-wide asked, one admitted) make each "
        "region's ask per report lumpy: the shares enforced sum to "
        f"{report['lab']['a']['mean_share_sum']:.2f} on average in (a), and each region "
        "admits a request only once its bucket has refilled all of it, so over 45 s the "
        f"fleet admits {report['lab']['a']['mean_minute_over_limit']:.2f} of the limit a "
        "minute: expect the lab's (a) well under 1 too.",
    ]


def _crossing_lines(d: dict[str, Any], where: str) -> list[str]:
    load = d["load"]
    rtts = ", ".join(f"{peer} {rtt * 1000:.0f} ms" for peer, rtt in d["link_rtt_s"].items())
    sent = ", ".join(f"{to}: {count}" for to, count in sorted(d["crossed_to"].items()))
    return [
        f"(d) Crossing ({where}; {d['region']}'s pool {load['kv_tokens']:,} KV tokens and "
        f"{load['slots']} batch slots, its waiting room {load['max_waiting']} a tier; "
        f"{load['sheddable_per_s']:g} sheddable and {load['critical_per_s']:g} critical "
        f"requests a second there, {load['own_per_s']:g} sheddable a second of the peers' "
        f"own; {load['duration_s']:g} s read from {load['warm_s']:g} s on): {d['crossed']} "
        f"of {d['region']}'s {d['sheddable']} sheddable requests crossed "
        f"({_n(d['crossed_share'])}; {sent or 'none'}), {d['sheddable_served_locally']} were "
        f"served there, {d['sheddable_refused']} refused; {d['critical_crossed']} of "
        f"{d['critical']} critical requests crossed ({d['critical_served_locally']} served "
        f"there). Time to first byte, median: crossed {_n(d['crossed_ttft_p50_s'])} s, the "
        f"peers' own sheddable {_n(d['peer_own_ttft_p50_s'])} s: "
        f"{_n(d['added_ttft_p50_s'])} s added (round trip to the peer's ingress: {rtts}; the "
        f"rest the peer's queue); {d['region']}'s sheddable served locally waited "
        f"{_n(d['local_sheddable_ttft_p50_s'], 1)} s. Skipped: {d['skipped'] or 'none'}; "
        f"tokens rejected: {d['tokens_rejected'] or 'none'}.",
    ]


def table(report: dict[str, Any]) -> str:
    setup = report["setup"]
    rows = report["rows"]
    lines = [
        f"{len(setup['regions'])} regions ({', '.join(setup['regions'])}), one global tenant "
        f"at {setup['limit_tpm']:,} tokens/min asking {setup['demand_x']:g}x it; lease_s "
        f"{setup['lease_s']:g}, fallback_for_s {setup['fallback_for_s']:g}, min_share "
        f"{setup['min_share']:g}; seed {setup['seed']}.",
        "",
        _HEADER,
        *(_line(row) for row in rows),
    ]
    if "lab" in report:
        lines += _lab_lines(report)
    starting = max(row["starting_share_sum"] for row in rows)
    means = [row["a"]["mean_share_sum"] for row in rows]
    lines += [
        "",
        f"The shares enforced summed to at most {max(r['max_share_sum'] for r in rows):.4f} "
        f"({starting:.4f} before every region had its first lease: a region enforces 0 "
        "until then). The first minute starts from full buckets (one bucket at the global "
        "limit would admit up to 2x its limit in it). Under contention "
        f"the shares enforced sum to {min(means):.2f}-{max(means):.2f} on average, and the "
        "fleet admits about that fraction of the limit: as the regions' asks move, a share "
        "one region gives up is freed at its next report (until then it still enforces it) "
        "and taken by another only at that one's next report.",
    ]
    d = report["death"]
    lines += [
        "",
        f"Region death ({d['delay_ms']} ms, reports every {d['interval_s']:g} s): "
        f"{d['region']} dies; the ledger keeps its share for it, so the others hold "
        f"{_n(d['others_share'])} of the tenant meanwhile (admitting "
        f"{_n(d['others_minute_over_limit'])} of the limit per minute) and get "
        f"its share back {_n(d['back_after_s'], 1)} s after the death (lease_s + "
        f"fallback_for_s = {d['expected_back_s']:g} s), then admit "
        f"{_n(d['others_minute_over_limit_after_back'])} of the limit per minute.",
        "",
        *_crossing_lines(report["crossing"], "80 ms one way, reports every 1 s"),
    ]
    return "\n".join(lines)
