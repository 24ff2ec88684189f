"""Each tenant's demand forecast, refitted from the traffic record on a schedule, off the
request path.

What lives here: `ForecastHolder` (the forecast the quota controller asks: a
forecast.outlook.Outlook whose answers come from the last refit; none yet, it answers None),
`refit_elsewhere` (one refit in a child process: it reads the record and fits) and
`ForecastRefitter` (the loop: a refit every `forecast.refit_interval_s` while the policy
enables it, the result installed on the event loop, the forecast's metrics kept current;
the same refit learns the multiples of the business calendar's `learn: true` events from
the same record entries, set on the quotas-ahead seat, budget.ahead.AheadSeat).
What must not: the fit itself (forecast.seasonal, forecast.refit) or the controller's use
of it.

Why a process: statsmodels' fits hold the interpreter lock for ~0.1-0.2 s a tenant (~1 s
for a few tenants over three weeks, more with more), and reading a week of record is ~1 s
more; in a thread beside the event loop every request would wait behind them (as the
policy's build did: extproc.runtime.policy_build). A fresh child per refit (spawned, not
forked: the sidecar's gRPC and its threads must not be copied), niced and in a session of
its own for the same reasons as the policy builder; what comes back is the Refit, pickled
(a few kilobytes a tenant). A refit that fails or takes longer than REFIT_TIMEOUT_S is
counted and logged; the last forecast stays until a refit succeeds. (Spawning starts
multiprocessing's resource tracker once: one small idle child beside the sidecar from its
first refit on. Each `serve --workers` worker refits for itself.)
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path

from budget.ahead import AheadSeat
from extproc.service.forecast_metrics import ForecastMetrics
from extproc.service.traffic_read import read_traffic
from forecast.outlook import Expected
from forecast.refit import Refit, RefitSettings, history_window, refit
from forecast.seasonal import DAY_S
from forecast.seasonal_outlook import SeasonalOutlook
from policy._ahead import AheadConfig
from policy._forecast import ForecastConfig
from policy.schema import Policy

log = logging.getLogger("slogate.forecast")

REFIT_TIMEOUT_S = 600.0
EXPORT_INTERVAL_S = 30.0  # the forecast demand's gauges follow the clock this often
_NICENESS = 10
_PROBLEMS_KEPT = 5


class RefitFailed(RuntimeError):
    pass


class ForecastHolder:
    """The last refit's forecast, as the quota controller's outlook (forecast.outlook)."""

    def __init__(self) -> None:
        self.outlook: SeasonalOutlook | None = None
        self.last: Refit | None = None

    def install(self, done: Refit) -> None:
        self.last = done
        self.outlook = SeasonalOutlook(done.forecasts)

    def clear(self) -> None:
        self.outlook = None
        self.last = None

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        outlook = self.outlook
        return None if outlook is None else outlook.expected(tenant, now_s, at_s)


def settings_of(config: ForecastConfig) -> RefitSettings:
    return RefitSettings(
        history_days=config.history_days,
        bin_s=float(config.bin_s),
        held_back_days=config.held_back_days,
        # To the next refit and a day beyond it: a failed refit or two leaves a forecast.
        ahead_s=config.refit_interval_s + DAY_S,
        max_tenants=config.max_tenants,
    )


def record_directory(policy: Policy) -> Path | None:
    """The traffic record's directory, as the recorder resolves it (the policy's folder)."""
    record = policy.traffic_record
    return None if record is None else Path(policy.source).parent / record.directory


def refit_from_record(
    directory: Path,
    settings: RefitSettings,
    weights: Mapping[str, float],
    now_s: float,
    calendar: AheadConfig | None = None,
) -> Refit:
    """What the child does: read the record's window, fit every tenant, learn the
    calendar's `learn: true` events."""
    start_s, end_s = history_window(now_s, settings)
    read = read_traffic([directory], from_s=start_s, to_s=end_s)
    problems = tuple(read.problems[:_PROBLEMS_KEPT])
    return refit(read.entries, now_s, settings, weights, problems, calendar)


def _child(
    answer: Connection,
    directory: Path,
    settings: RefitSettings,
    weights: dict[str, float],
    now_s: float,
    calendar: AheadConfig | None,
) -> None:
    os.setsid()  # out of the sidecar's session (autogroup): see the module's docstring
    os.nice(_NICENESS)
    try:
        answer.send(("ok", refit_from_record(directory, settings, weights, now_s, calendar)))
    except Exception:
        answer.send(("failed", traceback.format_exc(limit=5)))
    finally:
        answer.close()


async def refit_elsewhere(
    directory: Path,
    settings: RefitSettings,
    weights: Mapping[str, float],
    now_s: float,
    timeout_s: float = REFIT_TIMEOUT_S,
    calendar: AheadConfig | None = None,
) -> tuple[Refit, int]:
    """One refit in a child process of its own: the Refit and the child's pid. `calendar`:
    the policy's `ahead:` section, its `learn: true` events learned in the same child."""
    context = multiprocessing.get_context("spawn")
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(
        target=_child,
        args=(sending, directory, settings, dict(weights), now_s, calendar),
        name="slogate-forecast-refit",
        daemon=True,  # never outlives the sidecar
    )
    await asyncio.to_thread(child.start)  # spawning execs a new interpreter: not on the loop
    sending.close()
    try:
        kind, value = await asyncio.wait_for(asyncio.to_thread(receiving.recv), timeout_s)
    except TimeoutError:
        child.kill()  # the recv left in its thread ends with it
        raise RefitFailed(f"the refit took over {timeout_s:.0f} s") from None
    except EOFError:
        raise RefitFailed("the refit process ended without an answer") from None
    except asyncio.CancelledError:
        child.kill()  # the sidecar stops: the refit with it, now
        raise
    await asyncio.to_thread(child.join, 5.0)  # it has answered: it ends now
    if child.is_alive():
        child.kill()
    receiving.close()
    if kind != "ok":
        raise RefitFailed(f"the refit failed:\n{value}")
    assert isinstance(value, Refit)
    return value, child.pid or 0


class ForecastRefitter:
    """Refits on the policy's schedule; installs each result in `holder`, and its learned
    calendar multiples in `ahead` (the planner's outlook follows at its next step)."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        holder: ForecastHolder,
        metrics: ForecastMetrics,
        wall_clock: Callable[[], float] = time.time,
        ahead: AheadSeat | None = None,
    ) -> None:
        self._policy = policy
        self.holder = holder
        self.ahead = ahead
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._last_try_s: float | None = None
        self.refits = 0
        self.failures = 0
        self.last_pid: int | None = None  # the last refit's process, for the tests
        self.tried = asyncio.Event()  # set once a refit has ended, either way

    def due(self, now_s: float) -> bool:
        config = self._policy().forecast
        if not config.enabled:
            return False
        return self._last_try_s is None or now_s - self._last_try_s >= config.refit_interval_s

    async def refit_once(self) -> Refit | None:
        policy = self._policy()
        directory = record_directory(policy)
        if directory is None:  # the loader refuses `enabled` without a record
            return None
        now_s = self._wall_clock()
        self._last_try_s = now_s
        weights = {bucket.name: bucket.cost_weight for bucket in policy.buckets}
        started = time.monotonic()
        try:
            done, self.last_pid = await refit_elsewhere(
                directory, settings_of(policy.forecast), weights, now_s, calendar=policy.ahead
            )
        except (RefitFailed, OSError) as error:
            self.failures += 1
            self._metrics.failed()
            log.warning("forecast refit failed (the last forecast stays): %s", error)
            return None
        took_s = time.monotonic() - started
        self.holder.install(done)
        if self.ahead is not None:
            # What a refit could not learn (no whole occurrence in its window) keeps what
            # an earlier one did; an event no longer `learn: true` is dropped.
            learning = {e.name for e in (policy.ahead.events if policy.ahead else ()) if e.learn}
            kept = {e: m for e, m in self.ahead.learned.items() if e in learning}
            self.ahead.learned = kept | done.learned
            self._metrics.learned(self.ahead.learned)
        self.refits += 1
        self._metrics.refitted(done, took_s)
        for problem in done.problems:
            log.warning("forecast refit: traffic record: %s", problem)
        log.info(
            "forecast refitted: %d tenants from %d requests in %.1f s",
            len(done.forecasts),
            done.entries,
            took_s,
        )
        for event, multiple in sorted(done.learned.items()):
            log.info("calendar event %s: learned multiple %.2f", event, multiple)
        return done

    def export(self) -> None:
        outlook = self.holder.outlook
        if outlook is not None:
            self._metrics.export_demand(outlook, self._wall_clock())

    async def run(self) -> None:
        """Until cancelled: a refit when due, the demand gauges every EXPORT_INTERVAL_S."""
        while True:
            if not self._policy().forecast.enabled and self.holder.last is not None:
                self.holder.clear()  # turned off by a reload: the controller reacts only
                if self.ahead is not None:
                    self.ahead.learned = {}
                    self._metrics.learned({})
            if self.due(self._wall_clock()):
                try:
                    await self.refit_once()
                except Exception:  # never the loop's end: the next one is due in time
                    log.exception("forecast refit failed")
                self.tried.set()
            self.export()
            await asyncio.sleep(EXPORT_INTERVAL_S)
