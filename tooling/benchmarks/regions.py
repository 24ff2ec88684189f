"""`slogate bench regions`: two or three regions in network namespaces, a WAN between them.

What lives here: the scenario, on the lab (tooling.benchmarks.regions_lab), its load
(regions_load) and its readings (regions_readings):

(a) one global tenant spending from every region at once at `over` x its global tokens per
    minute: global overshoot = tokens admitted fleet-wide per minute / the limit, measured
    after a burst that empties the buckets (a bucket holds a minute of its limit);
(b) the tenant moves to one region: seconds until that region holds >= 90% of the limit
    (its lease share), and its admitted rate over the rest of the phase;
(c) one region's WAN veth down for ~2 x lease_s, then up: what it admitted while cut off,
    its ledger states meanwhile, and the reconciliation (the global ledger's usage against
    the sum of the regions' settled usage, and both against what clients were served);
(d) one region's pool saturated (few batch slots, a small waiting room): the share of its
    sheddable requests that crossed to a peer and their added time to first byte against
    the same requests sent to that peer directly; critical requests stayed local.

The sidecar's region side comes from other work (the lease agent: branches leases and
region-agent; crossing: branch crossing). A measurement whose part this sidecar lacks (no
`slogate_region_*` metric of it) is written "not available (needs <branch>)", never
guessed. The pure summaries (`summarise_*`) are apart from the I/O. Why a relay and not
netem: tooling.stack.delay_link.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tooling.benchmarks.regions_lab import (
    SQUEEZE_SLOTS,
    SQUEEZE_WAITING,
    LabRegion,
    LabShape,
    RegionLab,
)
from tooling.benchmarks.regions_load import Load
from tooling.benchmarks.regions_readings import (
    Sample,
    has_metric,
    labelled,
    mean_share_sum,
    median_ms,
    overshoot,
    read_global_usage,
    seconds_to_share,
    states_seen,
)
from tooling.benchmarks.reports import write_report
from tooling.stack.netns import netns_unavailable
from tooling.stack.regions import (
    GLOBAL_KEY,
    region_names,
)

SHEDDABLE_KEY = "sk-demo-batch"
CRITICAL_KEY = "sk-demo-critical"
NEEDS_AGENT = "not available (needs leases, region-agent)"
NEEDS_CROSSING = "not available (needs crossing)"


# -- the scenario --------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    phase: str
    measurement: str
    value: str
    note: str = ""


def _why_not(skipped: Mapping[str, float], rtts: Mapping[str, float]) -> str:
    """The saturated region's reasons not to cross and its measured round trips."""
    said = ""
    counted = {k: v for k, v in sorted(skipped.items()) if v}
    if counted:
        said += "; not crossed: " + ", ".join(f"{k} {v:g}" for k, v in counted.items())
    if rtts:
        said += "; round trips: " + ", ".join(
            f"{k} {v * 1000:.0f} ms" for k, v in sorted(rtts.items())
        )
    return said


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


async def scenario(lab: RegionLab) -> tuple[list[Row], dict[str, Any]]:
    shape = lab.shape
    load = Load(lab, time.monotonic())
    rows: list[Row] = []
    facts: dict[str, Any] = {}
    stop = asyncio.Event()
    watcher = asyncio.create_task(load.watch(stop))
    try:
        texts = [await load.metrics_text(r) for r in lab.regions]
        agent = all(has_metric(t, "slogate_region_ledger_state") for t in texts)
        crossing = all(has_metric(t, "slogate_region_crossed") for t in texts)
        facts.update(region_agent=agent, crossing=crossing)
        if agent:  # every region leased before the clock starts (at most 20 s)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                last = {s.region: s.state for s in load.samples[-len(lab.regions) :]}
                if all(last.get(r.name) == "leased" for r in lab.regions):
                    break
                await asyncio.sleep(0.25)
        for region in lab.regions:  # the path answers before it is measured
            # A global tenant's first request in a region is refused until the region's
            # next report gets it a share (budget_region_share, Retry-After): retried.
            for _ in range(40):
                await load.one("warm", region, GLOBAL_KEY, 16)
                if load.shots[-1].status != 429:
                    break
                await asyncio.sleep(0.5)
        facts["warm"] = {s.region: s.status for s in load.shots if s.phase == "warm"}

        limit = shape.tokens_per_minute
        weight = shape.request_tokens + 20  # the prompt's ~20 tokens (chat template included)
        rate = shape.over * limit / 60.0 / weight  # fleet-wide requests a second
        regions = lab.regions

        def spread(k: int) -> tuple[LabRegion, str]:
            return regions[k % len(regions)], GLOBAL_KEY

        # (a) every region at once. A burst first: buckets hold a minute of their limit,
        # which a burst empties, so the window after it measures the refill.
        burst = math.ceil(1.2 * limit / weight)
        await load.offer("a-burst", burst / 2.0, 2.0, spread, shape.request_tokens)
        await asyncio.sleep(1.0)
        a_start = load.now()
        await load.offer("a", rate, shape.spread_s, spread, shape.request_tokens)
        a_end = load.now()
        # (b) the tenant moves to one region.
        target = regions[0]
        b_start = load.now()
        await load.offer(
            "b", rate, shape.move_s, lambda k: (target, GLOBAL_KEY), shape.request_tokens
        )
        b_end = load.now()
        # (c) one region cut off from the WAN for ~2 x lease_s, then healed.
        cut = regions[1]
        cut_s = 2 * shape.lease_s
        heal_s = max(3.0, 6 * shape.report_interval_s)
        c_start = load.now()
        lab.cut(cut)
        await load.offer("c-cut", rate, cut_s, spread, shape.request_tokens)
        lab.heal(cut)
        c_heal = load.now()
        await load.offer("c-healed", rate, heal_s, spread, shape.request_tokens)
        await load.settle()
        await asyncio.sleep(2 * shape.report_interval_s + 2.0)  # settled, then reported
        sent_cut = [s for s in load.shots if s.phase == "c-cut" and s.region == cut.name]
        while_cut = sum(s.tokens for s in sent_cut if s.status == 200)
        rows.append(
            Row(
                "c",
                f"tokens {cut.name} admitted while cut off ({cut_s:g} s)",
                str(while_cut),
                f"{sum(s.status == 200 for s in sent_cut)} of {len(sent_cut)} requests; "
                f"{while_cut / (cut_s / 60) / limit:.2f} of the global limit per minute; "
                f"lease_s {shape.lease_s:g}, then its fallback (the share it last held)",
            )
        )
        states = states_seen(load.samples, cut.name, c_start, c_heal + heal_s)
        rows.append(
            Row(
                "c",
                f"{cut.name}'s ledger states, cut to healed",
                " -> ".join(states) if agent else NEEDS_AGENT,
            )
        )
        latest: dict[str, Sample] = {}
        for region in regions:
            got = await load.sample(region)
            if got is not None:
                latest[region.name] = got
        served = sum(s.tokens for s in load.shots if s.key == GLOBAL_KEY and s.status == 200)
        usages = [latest[r.name].usage for r in regions if r.name in latest]
        regions_usage = sum(u for u in usages if u is not None) if agent and usages else None
        by_region = read_global_usage(lab.ledger_url, "demo-global") if agent else None
        global_usage = None if by_region is None else sum(by_region.values())
        rows.append(
            Row("c", "tokens clients were served (the global tenant, whole run)", str(served))
        )
        rows.append(
            Row(
                "c",
                "sum of the regions' settled usage (slogate_region_usage_tokens_total)",
                _fmt(regions_usage, 0) if regions_usage is not None else NEEDS_AGENT,
            )
        )
        rows.append(
            Row(
                "c",
                "the global ledger's usage after the heal",
                _fmt(global_usage, 0) if global_usage is not None else NEEDS_AGENT,
                "equal to the regions' sum: nothing double-counted",
            )
        )
        facts["reconciliation"] = {
            "served": served,
            "regions_usage": regions_usage,
            "global_usage": global_usage,
            "global_by_region": by_region,
            "regions_by_region": {n: latest[n].usage for n in latest},
        }

        # (d) one region's pool saturated: sheddable may cross, critical stays.
        sat, peer = lab.saturated, regions[0]
        long_tokens = 3000
        lab.squeeze(sat)
        d_start = load.now()
        await asyncio.gather(
            load.offer(
                "d-sheddable",
                1.8,
                shape.saturate_s,
                lambda k: (sat, SHEDDABLE_KEY),
                long_tokens,
                True,
            ),
            load.offer(
                "d-critical",
                0.3,
                shape.saturate_s,
                lambda k: (sat, CRITICAL_KEY),
                long_tokens,
                True,
            ),
            load.offer(
                "d-control",
                0.3,
                shape.saturate_s,
                lambda k: (peer, SHEDDABLE_KEY),
                long_tokens,
                True,
            ),
        )
        await load.settle()
        sat_page = await load.metrics_text(sat)
        skipped = labelled(sat_page, "slogate_region_crossing_skipped_total", "reason")
        rtts = labelled(sat_page, "slogate_region_link_rtt_seconds", "peer")
        facts["crossing_seen"] = {"skipped": skipped, "link_rtt_s": rtts}
        shed = [s for s in load.shots if s.phase == "d-sheddable"]
        crossed = [s for s in shed if s.status == 200 and s.served not in (None, sat.name)]
        local = [s for s in shed if s.status == 200 and s.served == sat.name]
        refused = [s for s in shed if s.status != 200]
        control = [s for s in load.shots if s.phase == "d-control" and s.status == 200]
        crit = [s for s in load.shots if s.phase == "d-critical"]
        crit_ok = [s for s in crit if s.status == 200]
        crit_local = [s for s in crit_ok if s.served == sat.name]
        crossed_ttft = median_ms([s.ttft_s for s in crossed if s.ttft_s is not None])
        control_ttft = median_ms([s.ttft_s for s in control if s.ttft_s is not None])
        rows.append(
            Row(
                "d",
                f"sheddable requests at {sat.name} that crossed",
                f"{len(crossed)}/{len(shed)}" if crossing else NEEDS_CROSSING,
                f"served at {sat.name}: {len(local)}, refused: {len(refused)} "
                f"({', '.join(sorted({s.error or str(s.status) for s in refused})) or '-'}); "
                f"{sat.name}'s pool: {SQUEEZE_SLOTS} batch slots, waiting room {SQUEEZE_WAITING}"
                f"{_why_not(skipped, rtts)}",
            )
        )
        added = (
            None if crossed_ttft is None or control_ttft is None else crossed_ttft - control_ttft
        )
        rows.append(
            Row(
                "d",
                "added time to first byte of a crossed request (median, vs sent to the peer)",
                _fmt(added, 1, " ms")
                if crossing and added is not None
                else (NEEDS_CROSSING if not crossing else "no crossed request"),
                f"control: {len(control)} sheddable requests sent to {peer.name} directly, "
                f"median {_fmt(control_ttft, 1, ' ms')}",
            )
        )
        rows.append(
            Row(
                "d",
                f"critical requests at {sat.name} served there",
                f"{len(crit_local)}/{len(crit_ok)}",
                f"{len(crit) - len(crit_ok)} of {len(crit)} refused",
            )
        )
        # (a) and (b), read once every answer is in (a request counts when it is answered).
        ratio = overshoot(load.shots, a_start, a_end, limit)
        held = mean_share_sum(load.samples, a_start, a_end)
        offered = shape.over
        rows.append(
            Row(
                "a",
                "global overshoot (admitted fleet-wide per minute / limit)",
                _fmt(ratio) if agent else NEEDS_AGENT,
                f"offered {offered:g}x over {shape.spread_s:g} s from {len(regions)} regions"
                + (f"; the regions' shares summed to {held:.2f} on average" if held else "")
                + (
                    ""
                    if agent
                    else f"; measured without leases: {ratio:.2f}x (each region "
                    "enforces the whole limit)"
                ),
            )
        )

        took = seconds_to_share(load.samples, target.name, b_start, 0.9)
        second_half = overshoot(load.shots, (b_start + b_end) / 2, b_end, limit)
        rows.append(
            Row(
                "b",
                f"seconds until {target.name} holds >= 90% of the limit",
                (_fmt(took, 1, " s") if took is not None else "never in the phase")
                if agent
                else NEEDS_AGENT,
                f"all traffic moved to {target.name} at {offered:g}x the limit",
            )
        )
        rows.append(
            Row(
                "b",
                f"{target.name}'s admitted rate / limit, second half of the phase",
                _fmt(second_half) if agent else NEEDS_AGENT,
                "" if agent else f"measured without leases: {second_half:.2f}",
            )
        )

        facts["phases_s"] = {
            "a": [round(a_start, 1), round(a_end, 1)],
            "b": [round(b_start, 1), round(b_end, 1)],
            "c": [round(c_start, 1), round(c_heal, 1)],
            "d": [round(d_start, 1), round(load.now(), 1)],
        }
    finally:
        stop.set()
        await watcher
        await load.close()
    rows.sort(key=lambda row: row.phase)  # (a) and (b) were read last
    facts["shots"] = [asdict(s) for s in load.shots]
    facts["samples"] = [asdict(s) for s in load.samples]
    return rows, facts


def markdown(shape: LabShape, rows: Sequence[Row], facts: Mapping[str, Any], setup_s: float) -> str:
    delays = ", ".join(
        f"{name} {shape.delay_ms(i):g} ms" for i, name in enumerate(region_names(shape.regions))
    )
    lines = [
        "# Regions lab (`slogate bench regions`)",
        "",
        f"{shape.regions} regions, each in its own network namespace with its stack (Redis, "
        "one simulated engine, sidecar, Envoy); a WAN namespace holds the global ledger's "
        "Redis and a user-space delay relay (no tc netem in this kernel: "
        f"tooling/stack/delay_link.py). One-way delay to the hub: {delays}; between two "
        "regions the sum. The load generator runs in the root namespace, over each region's "
        "edge veth (a partition cuts the region's WAN veth only).",
        "",
        f"Global tenant `demo-global`: {shape.tokens_per_minute} weighted tokens a minute, "
        f"requests of ~{shape.request_tokens + 20} tokens; leases: report every "
        f"{shape.report_interval_s:g} s, lease_s {shape.lease_s:g}, fallback for "
        f"{shape.fallback_for_s:g} s. Sidecar: region agent "
        f"{'present' if facts.get('region_agent') else 'absent'}, crossing "
        f"{'present' if facts.get('crossing') else 'absent'}. Lab started in {setup_s:.0f} s.",
        "",
        "| phase | measurement | value | note |",
        "| --- | --- | --- | --- |",
        *(f"| {r.phase} | {r.measurement} | {r.value} | {r.note} |" for r in rows),
        "",
    ]
    return "\n".join(lines)


def run(out_dir: Path, shape: LabShape, name: str = "regions") -> int:
    why = netns_unavailable()
    if why is not None:
        print(f"slogate bench regions: needs network namespaces: {why}", file=sys.stderr)
        return 2
    import tempfile

    work_dir = Path(tempfile.mkdtemp(prefix="slogate-regions-"))
    began = time.monotonic()
    lab = RegionLab(shape, work_dir)
    try:
        lab.start()
        setup_s = time.monotonic() - began
        print(f"regions lab up in {setup_s:.0f} s (logs {work_dir})", flush=True)
        rows, facts = asyncio.run(scenario(lab))
    except BaseException:
        print(lab.logs()[-8000:], file=sys.stderr)
        raise
    finally:
        lab.close()
    report = {"shape": asdict(shape), "rows": [asdict(r) for r in rows], **facts}
    page = markdown(shape, rows, facts, setup_s)
    write_report(out_dir, name, report, page)
    print(page)
    print(f"total {time.monotonic() - began:.0f} s; results in {out_dir / name}.md", flush=True)
    return 0
