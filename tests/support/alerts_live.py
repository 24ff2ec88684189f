"""The alerts, live: a local stack on the Redis store, a real Prometheus scraping it every
second with the shipped rules' time scaled down (tooling.render.alert_rules), and the
`alerts-live` workload played against it with its faults (tests/e2e/test_prometheus.py).

What lives here: the run's policy (what makes the faults reachable on a small machine),
starting the pair, playing the workload, and reading back from Prometheus when each alert
was firing. No assertion lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from policy.schema import BudgetStoreKind
from sim.fleet.prompts import library
from sim.fleet.workload_files import WORKLOADS, load_workload, policy_document
from tests.support.stack import example_policy, random_ports
from tooling.loadtest.faults import StackFaults, load_faults
from tooling.loadtest.shots import CHAT, Shot, play
from tooling.render.alert_rules import write_scaled_rules
from tooling.stack.local import LocalStack
from tooling.stack.prometheus_api import PrometheusApi
from tooling.stack.prometheus_server import PrometheusServer, stack_jobs

ALERT_WORKLOAD = WORKLOADS / "alerts-live.yaml"
TIME_SCALE = 0.05  # the simulated pools' and the workload's (its file says so)
# The shipped rules' `for:` and windows at 1/60: a `for: 15m` holds 15 s, a `[5m]` rate
# reads 5 s, but no window under 10 s: ten 1 s scrapes keep a rate steady through a fault.
RULES_FACTOR = 1 / 60
MIN_WINDOW_S = 10.0
SCRAPE_INTERVAL_S = 1.0

# What the run's policy changes from deploy/policy.example.yaml, and why: each fault must
# make its condition true within seconds and false again after it.
#  - the default pool's KV cache small (24k tokens over its two engines; example: 1M): the
#    critical tier alone (never shed, never slowed by the controller) holds ~30k tokens of
#    ~2k-token requests when they are 3 s late, so the latency fault fills the pool, KV
#    admission refuses and critical requests wait. Its batch slots (32) stay above that: at
#    12 they bound it first and held each engine's KV at ~75% (3 requests in 8k), below the
#    85% the KV alert reads; at 40k tokens the breaker's shedding of the lower tiers kept
#    the pool at ~85% and the refusals under 10%;
#  - the breaker reads a 10 s window and enters/leaves levels within seconds (example:
#    60 s window, 30 s holds, 60 s cooldown), so its signals follow each fault and its
#    level steps back down after it;
#  - the engines scraped every second, stale after 5 s;
#  - redis_timeout_ms 100 (example: 10): on 2 shared cores a starved Redis call passed
#    10 ms now and then and flapped slogate_redis_up outside any fault; with a hung Redis
#    it is what the decision that retries it waits.
# The rules' own thresholds (P99/SLO 1, KV 85%, 1% 5xx, L2, 10% refused, 5% of latency) are
# the shipped ones; the critical wait bound is the policy's, below.
ALERT_RUN_POLICY: dict[str, Any] = {
    "pools": {"default": {"kv_capacity_tokens": 24000, "max_num_seqs": 32}},
    "budget": {"redis_timeout_ms": 100},
    # The critical wait bound: 0.25 s (example: 1 s). The waiting room serves critical first,
    # so on this small pool its P99 wait peaked at 0.5-2 s only in bursts.
    "waiting_room": {"alert_critical_p99_wait_s": 0.25},
    "breaker": {
        "window_s": 10,
        "min_samples": 10,
        "evaluate_interval_s": 1,
        "scrape_interval_s": 1,
        "stale_after_s": 5,
        "controller_interval_s": 2,
        # L3 only on errors (example: also at P99 3x its SLO): at L3 the slow pool's
        # critical requests go to the fallback pool and the others are shed, so the pool
        # empties and the latency fault's KV and capacity alerts end themselves (seen once
        # when a starved machine pushed P99 past 3x).
        "thresholds": {
            "enter_hold_s": [2, 2, 2],
            "cooldown_s": 3,
            "probe_hold_s": 2,
            "l3_p99_over_slo": 100.0,
        },
    },
}


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    for name, value in changes.items():
        if isinstance(value, Mapping) and isinstance(base.get(name), dict):
            _merge(base[name], value)
        else:
            base[name] = copy.deepcopy(value)
    return base


def alert_run_policy() -> dict[str, Any]:
    """The example policy with ALERT_RUN_POLICY's changes and the workload's keys."""
    raw = _merge(example_policy(), ALERT_RUN_POLICY)
    raw.pop("keys", None)
    return policy_document(yaml.safe_load(ALERT_WORKLOAD.read_text()), raw)


def start_prometheus(stack: LocalStack, work_dir: Path) -> PrometheusServer:
    """Prometheus scraping every sidecar and Envoy of `stack` each second, with the shipped
    rules scaled (evaluated each second too)."""
    rules = write_scaled_rules(work_dir / "slogate-rules.scaled.yaml", RULES_FACTOR, MIN_WINDOW_S)
    jobs = stack_jobs([r.metrics_port for r in stack.fleet], [r.admin_port for r in stack.fleet])
    server = PrometheusServer(work_dir / "prometheus", jobs, [rules], SCRAPE_INTERVAL_S)
    server.start()
    try:
        server.wait_for_targets(60.0)
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class FaultWindow:
    """A scheduled fault, in unix seconds."""

    what: str
    from_s: float
    to_s: float


@dataclass
class AlertRun:
    stack: LocalStack
    prometheus: PrometheusServer
    quiet_at_s: float = 0.0  # unix seconds: the quiet stack was looked at then
    start_s: float = 0.0  # unix seconds: the workload's second 0
    end_s: float = 0.0  # unix seconds: every request answered
    faults: list[FaultWindow] = field(default_factory=list)
    shots: list[Shot] = field(default_factory=list)

    @property
    def api(self) -> PrometheusApi:
        return self.prometheus.api()


def start_alert_stack(work_dir: Path) -> LocalStack:
    policy_path = work_dir / "alerts-live-policy.yaml"
    policy_path.write_text(yaml.safe_dump(alert_run_policy()))
    return LocalStack(
        policy_path,
        work_dir,
        random_ports(),
        TIME_SCALE,
        budget_store=BudgetStoreKind.REDIS,  # so that Redis health is a real signal
    ).start()


def play_alert_workload(run: AlertRun) -> None:
    """The workload with its faults, open-loop, until every request is answered."""
    raw = yaml.safe_load(ALERT_WORKLOAD.read_text())
    workload = load_workload(ALERT_WORKLOAD, alert_run_policy())
    keys = {a.key.tenant: f"sk-{a.key.tenant}" for a in workload.arrivals}
    injector = StackFaults(run.stack, load_faults(raw.get("faults")), TIME_SCALE)

    async def faults_from(start: float) -> None:
        # `start` is the loop's monotonic second 0: the same instant in unix seconds.
        run.start_s = time.time() - (time.monotonic() - start)
        end = start + workload.duration_s * TIME_SCALE
        await asyncio.gather(injector(start), reused_prefix(run.stack.url, start, end))

    run.shots = asyncio.run(
        play(workload.arrivals, run.stack.url, keys, TIME_SCALE, alongside=faults_from)
    ).shots
    run.end_s = time.time()
    run.faults = [
        FaultWindow(w["fault"], run.start_s + w["from_s"], run.start_s + w["to_s"])
        for w in injector.windows
    ]


# The workload's prompts share no prefix (each starts with its own ticket line: see
# tooling.loadtest.shots.messages), so the engines' prefix cache never hits and the hit
# rate's correlation with KV memory has nothing to correlate. Beside them, a chat whose
# first message is the same long one every time, as an application's system prompt is.
REUSED_PREFIX_TOKENS = 2048
REUSED_PREFIX_EVERY_S = 0.5


async def reused_prefix(url: str, start: float, end: float) -> None:
    """From `start` to `end` (monotonic), a short question after the same long first message
    every REUSED_PREFIX_EVERY_S, as the critical tenant; its answers are not judged."""
    system = "".join(library(False).messages(REUSED_PREFIX_TOKENS))
    headers = {"authorization": "Bearer sk-support"}
    sent: list[asyncio.Task[None]] = []

    async def ask(session: aiohttp.ClientSession, n: int) -> None:
        body = {
            "model": "deepseek-v4",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Ticket {n}: where is my order?"},
            ],
            "max_tokens": 16,
        }
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(f"{url}{CHAT}", json=body, headers=headers) as reply:
                await reply.read()

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        n = 0
        while (at := start + n * REUSED_PREFIX_EVERY_S) < end:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            sent.append(asyncio.create_task(ask(session, n)))
            n += 1
        await asyncio.gather(*sent)


def firing_intervals(
    api: PrometheusApi, from_s: float, to_s: float
) -> dict[str, list[tuple[float, float]]]:
    """Per alert name, when it was firing (unix seconds, any of its label sets), read back
    from Prometheus's own ALERTS series at each evaluation."""
    series = api.query_range('ALERTS{alertstate="firing"}', from_s, to_s, SCRAPE_INTERVAL_S)
    times: dict[str, set[float]] = {}
    for s in series:
        times.setdefault(s.labels["alertname"], set()).update(t for t, _ in s.points)
    return {name: _intervals(sorted(ts), SCRAPE_INTERVAL_S) for name, ts in times.items()}


def _intervals(times: Sequence[float], step_s: float) -> list[tuple[float, float]]:
    """Points no more than two steps apart as one [first, last + step) interval."""
    intervals: list[tuple[float, float]] = []
    last = None
    for t in times:
        if last is not None and t - last <= 2 * step_s:
            intervals[-1] = (intervals[-1][0], t + step_s)
        else:
            intervals.append((t, t + step_s))
        last = t
    return intervals


def wait_until_quiet(api: PrometheusApi, timeout_s: float) -> set[str]:
    """Until no alert fires (or `timeout_s`); the names still firing then."""
    deadline = time.monotonic() + timeout_s
    while True:
        firing = {a["labels"]["alertname"] for a in api.alerts() if a["state"] == "firing"}
        if not firing or time.monotonic() >= deadline:
            return firing
        time.sleep(1.0)
