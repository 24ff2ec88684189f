"""Crossing regions through real Envoys: two regions on 127.0.0.1, each its own simulated
pools, Envoy and sidecar (in this process), one global ledger (a real Redis-compatible
server) through which each region's agent tells the other its pools' room, each sidecar
probing the other's ingress for the round trip.

Region a's `default` pool is held at L2 (a breaker drill):
- a sheddable request crosses to b: b's engine serves it, the response says so
  (x-slogate-region: b, x-slogate-pool: default from b's route); a charges its tenant, b
  does not;
- a critical request stays in a;
- with b at L2 too while both still believe the other has room (as reports a second old
  would say: the two views are frozen so), a request a sends there is shed by b, never
  sent back;
- a client's own crossing token is not trusted: the request is a's own, and is shed at L2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from admission.crossing import NoPeers
from admission.regions import PeerRooms
from breaker.levels import BreakerLevel
from budget.leases import PoolRoom
from extproc.request.contract import CROSSED_HEADER, REASON_HEADER, REGION_HEADER
from extproc.runtime.sidecar import Sidecar
from tests.support.http import CHAT, Reply, chat_body, metric, parse, post, scrape
from tests.support.stack import every_decision_ended, example_policy, random_ports, write_policy
from tooling.stack.local import LocalStack, Replica
from tooling.stack.pool_engines import HOST
from tooling.stack.processes import free_port


class StaticRooms:
    def __init__(self, peers: Mapping[str, Mapping[str, PoolRoom]]) -> None:
        self._peers = peers

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        return self._peers


class Relay:
    """The peers' room as the region agent heard it from the global ledger, until the test
    freezes a view of its own."""

    def __init__(self) -> None:
        self.source: PeerRooms = NoPeers()

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        return self.source.peers()


class EnginesAndEnvoy(LocalStack):
    """The local stack without its sidecar process: the test runs the sidecar itself on the
    port Envoy is pointed at."""

    def start_sidecar(self, replica: Replica) -> None:
        replica.grpc_port = replica.grpc_port or free_port(HOST)


def region_policy(
    tmp: Path, this: str, ingress: Mapping[str, int], secret: Path, ledger: str
) -> Path:
    raw: dict[str, Any] = example_policy()
    raw["regions"] = {
        "this": this,
        "list": {name: {"ingress": f"{HOST}:{port}"} for name, port in ingress.items()},
        "ledger": {"url": ledger},
        "crossing": {"enabled": True, "secret_file": str(secret), "max_added_ms": 1000},
    }
    (tmp / this).mkdir()
    return write_policy(tmp / this / "given.yaml", raw)


def samples(sidecar: Sidecar) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return parse(generate_latest(sidecar.metrics.registry).decode())


async def until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Until `check()` holds (access-log entries come batched; probes each second)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


@dataclass
class Region:
    stack: LocalStack
    sidecar: Sidecar
    rooms: Relay

    def served(self) -> float:
        """Requests the region's default pool's engines completed."""
        return sum(
            metric(scrape(f"{url}/metrics"), "vllm:request_success_total")
            for url in self.stack.engine_urls("default")
        )

    def metric(self, name: str, **labels: str) -> float:
        return metric(samples(self.sidecar), name, **labels)

    def settled_all(self) -> bool:
        return every_decision_ended(samples(self.sidecar))

    async def ask(self, key: str, headers: dict[str, str] | None = None) -> Reply:
        body = chat_body("What is the capital of France?", max_tokens=8)
        return await asyncio.to_thread(post, self.stack.url, CHAT, body, key, headers)


@contextlib.asynccontextmanager
async def two_regions(tmp: Path, redis_port: int) -> AsyncIterator[tuple[Region, Region]]:
    secret = tmp / "regions.key"
    secret.write_bytes(os.urandom(32).hex().encode())
    ingress = {"a": free_port(HOST), "b": free_port(HOST)}
    # A database of its own on the session's server: the ledger's keys are the test's.
    ledger = f"redis://{HOST}:{redis_port}/11"
    stacks: dict[str, LocalStack] = {}
    sidecars: list[Sidecar] = []
    try:
        for name in ("a", "b"):
            ports = random_ports()
            ports.listen = ingress[name]
            stack = EnginesAndEnvoy(
                region_policy(tmp, name, ingress, secret, ledger),
                tmp / name,
                ports,
                time_scale=0.05,
                exact_tokenizer=False,
            )
            stacks[name] = stack
            await asyncio.to_thread(stack.start)
        regions = []
        for name in ("a", "b"):
            stack = stacks[name]
            assert stack.sidecar_policy_path is not None
            rooms = Relay()
            sidecar = Sidecar(
                stack.sidecar_policy_path,
                grpc_port=stack.grpc_port,
                metrics_port=None,
                admin_address=None,
                exact_tokenizer=False,
                peer_rooms=rooms,
            )
            rooms.source = sidecar.region
            sidecars.append(sidecar)
            await sidecar.start()
            regions.append(Region(stack, sidecar, rooms))
        yield regions[0], regions[1]
    except BaseException:
        for stack in stacks.values():
            print(stack.logs())
        raise
    finally:
        for sidecar in sidecars:
            await sidecar.stop(grace_s=0.5)
        for stack in stacks.values():
            stack.stop()


async def test_a_saturated_regions_sheddable_traffic_crosses_and_critical_stays(
    tmp_path: Path, redis_port: int
) -> None:
    async with two_regions(tmp_path, redis_port) as (a, b):
        # Each measured the other's ingress (Envoy answers the ping itself) ...
        await until(lambda: a.sidecar.path.links.rtt_s("b") is not None)
        await until(lambda: b.sidecar.path.links.rtt_s("a") is not None)
        assert a.metric("slogate_region_link_rtt_seconds", peer="b") > 0
        a.sidecar.signals.board.drill("default", BreakerLevel.L2, duration_s=600)
        # ... and heard of the other's pools through the global ledger: b's has room; a's
        # is at L2 (its next report says so).
        await until(lambda: a.rooms.peers().get("b", {}).get("default") == PoolRoom(0, False))
        await until(lambda: b.rooms.peers().get("a", {}).get("default") == PoolRoom(2, False))
        served_a, served_b = a.served(), b.served()

        crossed = await a.ask("sk-demo-batch")
        assert crossed.status == 200, crossed.body
        assert crossed.headers[REGION_HEADER] == "b"
        assert crossed.headers["x-slogate-pool"] == "default"  # b's pool route
        assert crossed.json()["usage"]["completion_tokens"] > 0
        await until(a.settled_all)
        await until(b.settled_all)
        assert (a.served(), b.served()) == (served_a, served_b + 1)
        assert a.metric("slogate_region_crossed_total", peer="b", tier="sheddable") == 1
        # Charged once, at the origin: a settled its tokens; b reserved nothing for it.
        tenant = {"tenant": "demo-batch"}
        assert a.metric("slogate_tenant_tokens_total", **tenant) > 0
        assert b.metric("slogate_budget_decisions_total", **tenant) == 0
        assert b.metric("slogate_tenant_tokens_total", **tenant) == 0
        assert b.metric("slogate_decisions_total") == 1  # b decided it: KV, breaker, pool

        stays = await a.ask("sk-demo-critical")
        assert stays.status == 200, stays.body
        assert REGION_HEADER not in stays.headers
        assert a.served() == served_a + 1
        assert a.metric("slogate_region_crossing_skipped_total", reason="not_tolerant") == 1

        # b saturated too while each still believes the other has room (views frozen as a
        # report a second old leaves them): b sheds what a sent rather than send it back.
        b.sidecar.signals.board.drill("default", BreakerLevel.L2, duration_s=600)
        roomy = {"default": PoolRoom(0, False)}
        a.rooms.source, b.rooms.source = StaticRooms({"b": roomy}), StaticRooms({"a": roomy})
        shed = await a.ask("sk-demo-batch")
        assert shed.status == 429, shed.body
        assert shed.headers[REASON_HEADER] == "shed_tier_shed"
        assert b.metric("slogate_region_crossing_skipped_total", reason="already_crossed") == 1
        assert a.metric("slogate_region_crossed_total", peer="b", tier="sheddable") == 2

        # A client's own token: not trusted, counted, the request is a's own and stays.
        forged = await a.ask("sk-demo-batch", {CROSSED_HEADER: "b.x.9999999999.00"})
        assert forged.status == 429 and REGION_HEADER not in forged.headers
        assert a.metric("slogate_region_crossing_tokens_rejected_total", reason="forged") == 1
        assert a.metric("slogate_region_crossed_total", peer="b", tier="sheddable") == 2
        assert b.metric("slogate_decisions_total") == 1
