"""`slogate preflight`'s verdicts: each check's pass / fail / cannot-check from values
already measured. No I/O: tooling.preflight.probes measures, tooling.preflight.run runs and
prints. Every verdict carries the value it was judged on, so an operator sees how close
a pass was.

What "no data" means, check by check (decided here, not by accident):
- scrape interval: no target exporting slogate's series is a FAIL (Prometheus does not
  watch slogate at all, which the checklist exists to catch).
- zone latency: engines without a zone, or a pool with one zone, CANNOT be checked; an
  engine that answered no probe makes its zone's median unknown: CANNOT for that pool.
- alert rules: a shipped alert that Prometheus has not loaded is a FAIL.
- last L3: no L3 in the window with less than the window's history is CANNOT (the history
  is reported); with the whole window held, a FAIL.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

MAX_SCRAPE_INTERVAL_S = 15.0  # the field's checklist: scrape at least every 15 s
MAX_ZONE_SPREAD = 0.15  # zones' median latencies within 15% of each other
L3_WINDOW_S = 31 * 86400.0  # a long-context test that trips L3 at least once a month


class Verdict(Enum):
    PASS = "pass"
    FAIL = "fail"
    CANNOT = "cannot-check"


@dataclass(frozen=True)
class CheckResult:
    check: str  # scrape_interval, zone_latency, alert_rules, drill, preset, last_l3
    subject: str  # what it was checked on: a pool, a target, "prometheus"
    verdict: Verdict
    measured: str  # the value judged, in words with units
    detail: str = ""

    def line(self) -> str:
        text = f"{self.verdict.value:<12} {self.check:<15} {self.subject:<10} {self.measured}"
        return f"{text} ({self.detail})" if self.detail else text


def exit_code(results: Iterable[CheckResult], strict: bool = False) -> int:
    """1 when a check failed (or, strict, could not be checked), else 0: a rollout gate."""
    bad = {Verdict.FAIL, Verdict.CANNOT} if strict else {Verdict.FAIL}
    return 1 if any(r.verdict in bad for r in results) else 0


def scrape_interval(
    found_s: Mapping[str, float | None], limit_s: float = MAX_SCRAPE_INTERVAL_S
) -> CheckResult:
    """Every target exporting slogate's series ("job/instance" -> its scrape interval; None:
    Prometheus did not say)."""
    if not found_s:
        return CheckResult(
            "scrape_interval",
            "prometheus",
            Verdict.FAIL,
            "no target exports slogate_breaker_level",
            "Prometheus does not scrape a slogate sidecar",
        )
    unknown = sorted(target for target, interval in found_s.items() if interval is None)
    if unknown:
        return CheckResult(
            "scrape_interval",
            "prometheus",
            Verdict.CANNOT,
            f"no interval for {', '.join(unknown)}",
            "Prometheus before 2.29 does not report it",
        )
    intervals_s = {target: interval or 0.0 for target, interval in found_s.items()}
    worst = max(intervals_s, key=lambda target: intervals_s[target])
    measured = ", ".join(f"{t} {s:g} s" for t, s in sorted(intervals_s.items()))
    verdict = Verdict.PASS if intervals_s[worst] <= limit_s else Verdict.FAIL
    detail = "" if verdict is Verdict.PASS else f"{worst} over {limit_s:g} s"
    return CheckResult("scrape_interval", "prometheus", verdict, measured, detail)


def zone_spread(medians_ms: Mapping[str, float]) -> float:
    """How far apart the zones are: the slowest median over the fastest, minus one."""
    fastest = min(medians_ms.values())
    return max(medians_ms.values()) / fastest - 1.0 if fastest > 0 else float("inf")


def zone_latency(
    pool: str,
    samples_ms: Mapping[str, Sequence[float]],
    unzoned: int = 0,
    limit: float = MAX_ZONE_SPREAD,
) -> CheckResult:
    """One pool: each zone's probe latencies (every engine of the zone together) -> their
    medians within `limit` of each other. `unzoned`: engines that have no zone."""
    note = f"{unzoned} engine(s) without a zone" if unzoned else ""
    if len(samples_ms) < 2:
        return CheckResult(
            "zone_latency",
            pool,
            Verdict.CANNOT,
            f"{len(samples_ms)} zone(s)",
            note or "engines need a zone: policy pools.*.zones or --zones FILE",
        )
    empty = sorted(zone for zone, values in samples_ms.items() if not values)
    if empty:
        return CheckResult(
            "zone_latency", pool, Verdict.CANNOT, f"no probe answered in {', '.join(empty)}"
        )
    medians = {zone: statistics.median(values) for zone, values in samples_ms.items()}
    spread = zone_spread(medians)
    measured = (
        ", ".join(f"{zone} {ms:.1f} ms" for zone, ms in sorted(medians.items()))
        + f"; spread {spread * 100:.1f}%"
    )
    verdict = Verdict.PASS if spread <= limit else Verdict.FAIL
    if verdict is Verdict.FAIL:
        note = "; ".join(filter(None, [f"over {limit * 100:g}%", note]))
    return CheckResult("zone_latency", pool, verdict, measured, note)


def alert_rules(shipped: Iterable[str], loaded: Iterable[str]) -> CheckResult:
    """The shipped rules file's alert names against those Prometheus has loaded."""
    wanted, present = set(shipped), set(loaded)
    missing = sorted(wanted - present)
    measured = f"{len(wanted) - len(missing)} of {len(wanted)} loaded"
    if missing:
        return CheckResult(
            "alert_rules", "prometheus", Verdict.FAIL, measured, f"missing {', '.join(missing)}"
        )
    return CheckResult("alert_rules", "prometheus", Verdict.PASS, measured)


def last_l3(
    pool: str,
    highest_level: float | None,
    history_s: float,
    retention_s: float | None = None,
    window_s: float = L3_WINDOW_S,
) -> CheckResult:
    """One pool: the highest breaker level (drills included) Prometheus saw over the window,
    how much of the window its series cover, and how long Prometheus keeps data (None: not
    known). An L3 seen passes whatever the history."""
    days = window_s / 86400
    held = (
        f"{history_s / 86400:.2f} d of history"
        if history_s >= 3600
        else f"{history_s / 60:.0f} min of history"
    )
    if highest_level is not None and highest_level >= 3:
        return CheckResult("last_l3", pool, Verdict.PASS, f"L3 within {days:g} d ({held})")
    seen = "no series" if highest_level is None else f"highest L{highest_level:.0f}"
    if retention_s is not None and retention_s < window_s:
        # Prometheus's default keeps 15 d: the month can never be seen whole, here or by
        # the SlogateL3DrillDue alert reading the same window.
        return CheckResult(
            "last_l3",
            pool,
            Verdict.CANNOT,
            f"{seen}; {held}",
            f"Prometheus keeps {retention_s / 86400:g} d, less than {days:g} d",
        )
    if history_s < window_s:
        return CheckResult("last_l3", pool, Verdict.CANNOT, f"{seen}; {held}", f"needs {days:g} d")
    return CheckResult(
        "last_l3",
        pool,
        Verdict.FAIL,
        f"{seen} in {days:g} d",
        "no long-context test or drill tripped L3 this month",
    )


# --- drills (`--drills`): what the gateway did, judged against what the breaker promises


@dataclass(frozen=True)
class HeldStream:
    """A streamed request admitted before the drill, as its client saw it end."""

    status: int
    events: int  # content events received
    finish_reason: str | None  # from the last choice that had one
    done: bool  # `data: [DONE]` arrived

    @property
    def whole(self) -> bool:
        return self.status == 200 and self.done and self.finish_reason is not None


def held_requests(
    pool: str, streams: Sequence[HeldStream], running: int, waiting: int, outliving: int
) -> CheckResult:
    """Every stream started before the drill got its whole answer (the field's "do held
    requests continue after breaker recovery"). `running` / `waiting`: the pool's requests
    at the drill, as the sidecar's status counted them; `outliving`: streams still going
    when the drill ended (those that lived through the whole of it)."""
    whole = sum(1 for s in streams if s.whole)
    measured = (
        f"{whole} of {len(streams)} streams whole; at the drill {running} running, "
        f"{waiting} waiting; {outliving} still streaming when it ended"
    )
    if not streams:
        return CheckResult("drill_held", pool, Verdict.CANNOT, measured, "no stream admitted")
    broken = [s for s in streams if not s.whole]
    detail = (
        ""
        if not broken
        else "cut: " + ", ".join(f"status {s.status} after {s.events} events" for s in broken[:3])
    )
    verdict = Verdict.PASS if not broken else Verdict.FAIL
    return CheckResult("drill_held", pool, verdict, measured, detail)


def recovered(pool: str, served_after_s: float | None, waited_s: float) -> CheckResult:
    """After the drill ended, a standard request was served again (None: not within
    `waited_s`)."""
    if served_after_s is None:
        return CheckResult(
            "drill_recovery", pool, Verdict.FAIL, f"not served within {waited_s:g} s"
        )
    return CheckResult(
        "drill_recovery", pool, Verdict.PASS, f"served {served_after_s:.2f} s after the drill"
    )


@dataclass(frozen=True)
class PresetProbe:
    """One request sent under a drilled level and what came back."""

    tier: str
    long_context: bool  # context above breaker.shedding.LONG_CONTEXT_TOKENS
    status: int
    reason: str  # x-slogate-reason ("" when admitted)
    pool: str  # x-slogate-pool ("" when refused)


def expected_answer(expected: str, fallback_pool: str, tier: str = "standard") -> str:
    """An action of breaker.shedding ("admit", "refuse:tier_shed", "reroute") as the
    client of `tier` should see it (the sheddable tier's refusals are 429s)."""
    if expected.startswith("refuse:"):
        status = 429 if tier == "sheddable" else 503
        return f"{status} shed_{expected.split(':', 1)[1]}"
    if expected == "reroute":
        return f"200 via {fallback_pool}"
    return "200"


def seen_answer(probe: PresetProbe, fallback_pool: str) -> str:
    if probe.status in (429, 503) and probe.reason.startswith("shed_"):
        return f"{probe.status} {probe.reason}"
    if probe.status == 200 and probe.pool == fallback_pool:
        return f"200 via {fallback_pool}"
    return str(probe.status) if probe.status == 200 else f"{probe.status} {probe.reason}".strip()


def preset(
    level: int, pool: str, probes: Sequence[tuple[PresetProbe, str]], fallback_pool: str
) -> CheckResult:
    """A degradation preset (a breaker level's row of the shedding table) under a drill:
    each probe's answer against the one the table gives (its expected action)."""
    rows = []
    wrong = []
    for probe, expected in probes:
        want, got = (
            expected_answer(expected, fallback_pool, probe.tier),
            seen_answer(probe, fallback_pool),
        )
        size = "long" if probe.long_context else "short"
        rows.append(f"{probe.tier}/{size} {got}")
        if want != got:
            wrong.append(f"{probe.tier}/{size}: expected {want}, got {got}")
    if not probes:
        return CheckResult(f"preset_L{level}", pool, Verdict.CANNOT, "no probe sent", "no keys")
    verdict = Verdict.FAIL if wrong else Verdict.PASS
    return CheckResult(f"preset_L{level}", pool, verdict, "; ".join(rows), "; ".join(wrong))
