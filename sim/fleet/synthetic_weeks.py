"""A synthetic traffic record of weeks of daily traffic with a weekly shape, seeded.

What lives here: `TenantShape` (what one tenant sends per minute at a time of day and week),
`WEEKLY_TENANTS` (a bank's business hours, a school's 09:00 class ramp, a night batch
tenant, a steady one), `synthetic_weeks` (the record's entries, drawn directly: no fleet is
played, so three weeks take seconds), `expected_tokens_per_minute` (the demand they are
drawn around: the noise floor of any forecast's error on them), `expected_multiple` (a
calendar event's multiple they are drawn around) and `write_record` (those
entries as a traffic record directory, the files `slogate serve` writes, for
`slogate forecast --record` and the tests).

The shape, in UTC: weekday business-hours peaks, low nights, quiet weekends; on weekdays
the class's demand rises to 8x in the five minutes before 09:00 and holds the class's hour;
a holiday (one weekday) looks like a weekend day for the business tenants. Arrivals are
Poisson per minute at the shape's rate; token counts are drawn per request.
"""

from __future__ import annotations

import datetime as dt
import gzip
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from extproc.service.traffic_read import TrafficEntry
from extproc.service.traffic_record import RECORD_VERSION, TRAFFIC_FILES

DAY_S = 86400
# Monday 2026-11-02 00:00 UTC: the record starts on a Monday, so its weeks read naturally.
MONDAY_S = dt.datetime(2026, 11, 2, tzinfo=dt.UTC).timestamp()


@dataclass(frozen=True, slots=True)
class Moment:
    """Where a minute falls: hour of day (fractional), weekday (Monday 0), a holiday."""

    hour: float
    weekday: int
    holiday: bool

    @property
    def working_day(self) -> bool:
        return self.weekday < 5 and not self.holiday


def _business(m: Moment) -> float:
    """A bank: 12 requests a minute through business hours, ramps around them, 1 at night,
    2 through a quiet weekend (or holiday) day."""
    if not m.working_day:
        return 2.0 if 9 <= m.hour < 18 else 0.8
    if 9 <= m.hour < 17:
        return 12.0
    if 7 <= m.hour < 9:
        return 1.0 + 11.0 * (m.hour - 7) / 2
    if 17 <= m.hour < 19:
        return 12.0 - 11.0 * (m.hour - 17) / 2
    return 1.0


def _class_start(m: Moment) -> float:
    """A school: 1.5 a minute through the working day, 8x from the five minutes before 09:00
    (rising across them) through the class's hour; 0.2 at night and on days off."""
    if not m.working_day or not 7 <= m.hour < 17:
        return 0.2
    if 8 + 55 / 60 <= m.hour < 9:  # the ramp: 1x -> 8x over the five minutes before
        return 1.5 * (1 + 7 * (m.hour - (8 + 55 / 60)) * 12)
    if 9 <= m.hour < 10:
        return 12.0
    return 1.5


def _night_batch(m: Moment) -> float:
    """Batch work: 8 a minute from 00:00 to 06:00 every day, 1 otherwise (a daily shape)."""
    return 8.0 if m.hour < 6 else 1.0


def _steady(m: Moment) -> float:
    """No season at all: 4 a minute, day and night."""
    return 4.0


@dataclass(frozen=True, slots=True)
class TenantShape:
    tenant: str
    tier: str
    rate_per_minute: Callable[[Moment], float]
    prompt_tokens: float  # the median prompt
    completion_tokens: float  # the median completion


WEEKLY_TENANTS: tuple[TenantShape, ...] = (
    TenantShape("bank", "critical", _business, 900, 250),
    TenantShape("school", "critical", _class_start, 600, 300),
    TenantShape("batch", "batch", _night_batch, 2000, 500),
    TenantShape("steady", "standard", _steady, 700, 200),
)


MAX_TOKENS = 1024  # every request's completion limit
_PROMPT_SIGMA = 0.6
_COMPLETION_SIGMA = 0.5


def _moment(minute: int, first_weekday: int, holidays: frozenset[int]) -> Moment:
    day = minute // 1440
    return Moment((minute % 1440 + 0.5) / 60, (first_weekday + day) % 7, day in holidays)


def _mean_capped_lognormal(median: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X lognormal with this median: E[X; X < cap] + cap P(X >= cap)."""
    mu = math.log(median)

    def below(z: float) -> float:  # the standard normal's CDF
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma**2 / 2) * below(z - sigma) + cap * (1 - below(z))


def expected_tokens_per_minute(
    shape: TenantShape,
    bin_s: float,
    days: int = 19,
    start_s: float = MONDAY_S,
    holiday_days: Sequence[int] = (9,),
    scale: float = 1.0,
) -> list[float]:
    """What `synthetic_weeks` draws around, per bin: the shape's rate x a request's mean
    tokens. No forecast can beat it but by luck: its error on the drawn demand is the
    record's noise floor."""
    per_request = shape.prompt_tokens * math.exp(_PROMPT_SIGMA**2 / 2) + _mean_capped_lognormal(
        shape.completion_tokens, _COMPLETION_SIGMA, MAX_TOKENS
    )
    first_weekday = dt.datetime.fromtimestamp(start_s, dt.UTC).weekday()
    holidays = frozenset(holiday_days)
    per_bin = round(bin_s / 60)
    minutes = [
        shape.rate_per_minute(_moment(minute, first_weekday, holidays)) * scale * per_request
        for minute in range(days * 1440)
    ]
    return [sum(minutes[i : i + per_bin]) / per_bin for i in range(0, len(minutes), per_bin)]


def expected_multiple(
    shape: TenantShape,
    spans: Sequence[tuple[float, float]],
    days: int = 19,
    start_s: float = MONDAY_S,
    holiday_days: Sequence[int] = (9,),
) -> float:
    """What a calendar event's learned multiple (forecast.calendar.learned_multiple) is
    drawn around on `synthetic_weeks`' record: the shape's expected demand during `spans`
    (whole minutes, Unix seconds) over the equally long windows just before them."""
    minutes = expected_tokens_per_minute(shape, 60.0, days, start_s, holiday_days)

    def demand(from_s: float, to_s: float) -> float:
        return sum(minutes[round((from_s - start_s) / 60) : round((to_s - start_s) / 60)])

    during = sum(demand(start, end) for start, end in spans)
    before = sum(demand(2 * start - end, start) for start, end in spans)
    return during / before


def synthetic_weeks(
    seed: int,
    days: int = 19,
    start_s: float = MONDAY_S,
    holiday_days: Sequence[int] = (9,),
    tenants: Sequence[TenantShape] = WEEKLY_TENANTS,
    scale: float = 1.0,
) -> list[TrafficEntry]:
    """The entries of `days` days from `start_s` (a UTC midnight), by arrival time.
    `holiday_days`: day indexes (from 0) that are holidays (the default: the second week's
    Wednesday). `scale`: every rate multiplied (a smaller record for a test)."""
    rng = np.random.default_rng(seed)
    entries: list[TrafficEntry] = []
    holidays = frozenset(holiday_days)
    first_weekday = dt.datetime.fromtimestamp(start_s, dt.UTC).weekday()
    for shape in tenants:
        rates = np.empty(days * 1440)
        for minute in range(days * 1440):
            moment = _moment(minute, first_weekday, holidays)
            rates[minute] = shape.rate_per_minute(moment) * scale
        counts = rng.poisson(rates)
        total = int(counts.sum())
        minutes = np.repeat(np.arange(days * 1440), counts)
        arrivals = start_s + (minutes + rng.random(total)) * 60.0
        prompts = np.maximum(1, rng.lognormal(math.log(shape.prompt_tokens), _PROMPT_SIGMA, total))
        completions = np.maximum(
            1, rng.lognormal(math.log(shape.completion_tokens), _COMPLETION_SIGMA, total)
        )
        max_tokens = MAX_TOKENS
        for i in range(total):
            prompt = int(prompts[i])
            entries.append(
                TrafficEntry(
                    v=RECORD_VERSION,
                    t=round(float(arrivals[i]), 4),
                    outcome="admitted",
                    id=f"{shape.tenant}-{i}",
                    key=f"k-{shape.tenant}",
                    tenant=shape.tenant,
                    tier=shape.tier,
                    api="chat",
                    prompt=prompt,
                    count="exact",
                    max_tokens=max_tokens,
                    stream=True,
                    pool="default",
                    bucket="short",
                    status=200,
                    usage_prompt=prompt,
                    usage_completion=min(max_tokens, int(completions[i])),
                )
            )
    entries.sort(key=lambda e: e.t)
    return entries


def write_record(entries: Sequence[TrafficEntry], directory: Path, host: str = "synthetic") -> int:
    """`entries` as a traffic record directory: one file per UTC day, named as the
    sidecar names its own. Returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.json.Encoder()
    by_day: dict[str, list[bytes]] = {}
    for entry in entries:
        day = dt.datetime.fromtimestamp(entry.t, dt.UTC).strftime("%Y-%m-%d")
        by_day.setdefault(day, []).append(encoder.encode(entry) + b"\n")
    for day, lines in by_day.items():
        name = f"{TRAFFIC_FILES.prefix}{day}-{host}-0{TRAFFIC_FILES.suffix}"
        with gzip.open(directory / name, "wb", compresslevel=1) as file:
            file.writelines(lines)
    return len(by_day)
