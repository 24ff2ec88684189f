"""`slogate loadtest`'s faults: a workload's `faults:` schedule, read, applied to a local
stack, and marked on the shots alive during one."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from tooling.loadtest.shots import Shot
from tooling.stack.local import LocalStack


@dataclass(frozen=True)
class Fault:
    """One entry of a workload's `faults:` (workload seconds): a pool's latency or errors
    for a while (`pool` + `latency_ms` / `error_rate` / `error_status`, `for_s`), a
    SIGKILLed sidecar (`kill: sidecar`, restarted by the stack's supervisor), Redis
    stopped and started again at once (`restart: redis`, with the Redis store), Redis
    away for a while (`stop: redis` for `for_s`, then started again empty on its port: its
    clients are refused at once), or Redis hung (`pause: redis` for `for_s`: SIGSTOP, then
    SIGCONT; its clients wait for their timeouts)."""

    at_s: float
    for_s: float = 0.0
    pool: str | None = None
    settings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    kill: str | None = None
    restart: str | None = None
    stop: str | None = None
    pause: str | None = None


_POOL_FAULT = {"latency_ms", "error_rate", "error_status"}


def load_faults(raw: object) -> list[Fault]:
    """A workload's `faults:` list, checked (an unknown field is an error)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("faults: expected a list")
    faults = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"faults[{i}]: expected a mapping")
        unknown = (
            set(item) - {"at_s", "for_s", "pool", "kill", "restart", "stop", "pause"} - _POOL_FAULT
        )
        if unknown:
            raise ValueError(f"faults[{i}]: unknown field {sorted(unknown)[0]}")
        settings = {k: float(v) for k, v in item.items() if k in _POOL_FAULT}
        fault = Fault(
            float(item["at_s"]),
            float(item.get("for_s", 0.0)),
            item.get("pool"),
            settings,
            item.get("kill"),
            item.get("restart"),
            item.get("stop"),
            item.get("pause"),
        )
        kinds = [fault.pool, fault.kill, fault.restart, fault.stop, fault.pause]
        if (
            sum(kind is not None for kind in kinds) != 1
            or (fault.kill not in (None, "sidecar"))
            or (fault.restart not in (None, "redis"))
            or (fault.stop not in (None, "redis"))
            or (fault.pause not in (None, "redis"))
        ):
            raise ValueError(
                f"faults[{i}]: one of pool, kill: sidecar, restart / stop / pause: redis"
            )
        if fault.pool is not None and (not settings or fault.for_s <= 0):
            raise ValueError(f"faults[{i}]: a pool fault needs for_s and what to inject")
        if (fault.stop or fault.pause) and fault.for_s <= 0:
            raise ValueError(f"faults[{i}]: stop / pause: redis needs for_s (how long)")
        faults.append(fault)
    return sorted(faults, key=lambda f: f.at_s)


class StackFaults:
    """Applies a fault schedule to a LocalStack, keeping its sidecars supervised; records
    each fault's window (real seconds after the start) for the report."""

    def __init__(self, stack: LocalStack, faults: Sequence[Fault], time_scale: float) -> None:
        self.stack = stack
        self.faults = faults
        self.time_scale = time_scale
        self.windows: list[dict[str, Any]] = []

    async def __call__(self, start: float) -> None:
        supervising = asyncio.create_task(self._supervise())
        try:
            for fault in self.faults:
                delay = start + fault.at_s * self.time_scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                began = time.monotonic() - start
                ended = await self._apply(fault, start)
                self.windows.append(
                    {"fault": _describe(fault), "from_s": began, "to_s": ended - start}
                )
            await asyncio.sleep(0)
        finally:
            supervising.cancel()

    async def _apply(self, fault: Fault, start: float) -> float:
        """Inject; returns when (monotonic) the fault is over."""
        if fault.pool is not None:
            body = {**fault.settings, "duration_s": fault.for_s * self.time_scale}
            if "error_status" in body:
                body["error_status"] = int(body["error_status"])
            async with aiohttp.ClientSession() as session:
                for engine in self.stack.engine_urls(fault.pool):  # a pool's fault: all of it
                    async with session.post(f"{engine}/fault", json=body) as r:
                        r.raise_for_status()
            return time.monotonic() + fault.for_s * self.time_scale
        if fault.kill == "sidecar":
            victim = self.stack.sidecar
            assert victim is not None and victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            for _ in range(600):  # until the supervisor has started the new one (<= 60 s)
                if self.stack.sidecar is not victim and self.stack.sidecar is not None:
                    break
                await asyncio.sleep(0.1)
            return time.monotonic() + 1.0  # and a second for Envoy to reconnect
        if fault.stop == "redis":
            assert self.stack.redis is not None
            await asyncio.to_thread(self.stack.redis.stop)
            # Started again when its time is up, while later faults wait their turn (the
            # schedule is sorted; one that falls inside this window starts after it).
            await asyncio.sleep(fault.for_s * self.time_scale)
            await asyncio.to_thread(self.stack.restart_redis)  # its stop is a no-op now
            return time.monotonic()
        if fault.pause == "redis":
            assert self.stack.redis is not None and self.stack.redis.pid is not None
            pid = self.stack.redis.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.for_s * self.time_scale)
            finally:  # never leave it hung (stopping the stack would wait for it)
                os.kill(pid, signal.SIGCONT)
            return time.monotonic()
        await asyncio.to_thread(self.stack.restart_redis)
        return time.monotonic() + 1.0

    async def _supervise(self) -> None:
        while True:
            await asyncio.to_thread(self.stack.supervise)
            await asyncio.sleep(0.2)


def _describe(fault: Fault) -> str:
    if fault.pool is not None:
        what = ", ".join(f"{k} {v:g}" for k, v in fault.settings.items())
        return f"pool {fault.pool}: {what} for {fault.for_s:g} s at {fault.at_s:g} s"
    if fault.kill is not None:
        return f"SIGKILL {fault.kill} at {fault.at_s:g} s"
    if fault.stop is not None:
        return f"{fault.stop} stopped for {fault.for_s:g} s at {fault.at_s:g} s"
    if fault.pause is not None:
        return f"{fault.pause} hung for {fault.for_s:g} s at {fault.at_s:g} s"
    return f"restart {fault.restart} at {fault.at_s:g} s"


def mark_faults(shots: Sequence[Shot], windows: Sequence[Mapping[str, Any]]) -> None:
    """A shot alive during a fault's window is `during_fault`."""
    for shot in shots:
        shot.during_fault = any(shot.alive_during(w["from_s"], w["to_s"]) for w in windows)
