"""`slogate bench prefix-vllm`: llm-d's precise-prefix case scaled down to two real vLLMs.

The shape of llm-d's published case (customers each with a long shared system prompt, short
questions under it, the shared prompts needing about three quarters of the fleet's KV cache,
load rising in steps) on two vLLM CPU engines with small KV caches that publish their KV
events, slogate and Envoy in front. The same seeded arrivals go through three arms in one
run: Envoy's round robin (`picker: envoy`), slogate's approximate prefix index (`picker:
slogate`, no `kv_events`) and its exact one fed by the engines' events (`kv_events:` on,
`relative_ports`). Between arms both engines' prefix caches are reset (vLLM's dev-mode
`POST /reset_prefix_cache`) and each arm's prompts carry the arm's number, so no arm finds
another's blocks, in the engines or in slogate's approximate index.

Per arm and step: requests and output tokens completed a second, the clients' TTFT (p90,
mean), the prefix hit rate by vLLM's own counters (`vllm:prefix_cache_hits_total` /
`..._queries_total`, scraped at each step's end) and by the answers' `cached_tokens`, and
how the requests split between the engines (`vllm:request_success_total`). KV admission is
off (the pool has no `kv_capacity_tokens`): it counts each prompt whole, shared prefix
included, and would queue the same requests in every arm; what is compared is the pick.
Writes bench/results/prefix-vllm.{md,json}.

What lives here: the live run against the local stack (`run`): the arms (`ARMS`), the
policy reloaded for each, the engines' caches reset and the pool settled between them, the
arrivals played open loop and the counters scraped. The case and its arrivals are in
prefix_workload, the step summaries, tables and files in prefix_report (both pure).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import os
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from extproc.service import admin_client
from extproc.shipped import example_policy
from tooling.benchmarks.engine_counters import engine_counters
from tooling.benchmarks.prefix_report import COUNTERS, summarize, table, write
from tooling.benchmarks.prefix_workload import Arrival, Shape, arrivals, system_prompt
from tooling.stack.local import LocalStack, StackPorts
from tooling.stack.vllm_engine import VllmSettings, engine_home

# PUB and replay ports: each engine's HTTP port plus these (two engines on one host).
EVENT_PORTS_AFTER = (1, 2)


@dataclass(frozen=True)
class Arm:
    """How the pool picks in one arm: its `picker`, whether it follows the engines' KV
    events, and `engines.picking` fields set for it (the policy's otherwise)."""

    name: str
    picker: str
    kv_events: bool = False
    picking: tuple[tuple[str, float], ...] = ()


ARMS = {
    "round-robin": Arm("round robin", "envoy"),
    "approximate": Arm("approximate", "slogate"),
    "precise": Arm("precise", "slogate", kv_events=True),
    # Not a default arm: what the exact prefix does with the conversation pull off (each
    # question here is a conversation of its own, so its rendezvous engine is a coin toss)
    # and the bounded load loosened from 1.25x to 2x the mean.
    "precise-prefix-led": Arm(
        "precise, prefix-led",
        "slogate",
        kv_events=True,
        picking=(("affinity_weight", 0.0), ("load_bound", 2.0)),
    ),
}
DEFAULT_ARMS = ("round-robin", "approximate", "precise")


def _engine_counters(url: str) -> dict[str, float]:
    return engine_counters(url, COUNTERS, timeout_s=30)


def _sidecar_total(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def _sidecar_samples(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The sidecar's samples of `names`, keyed `name{engine,kind}`."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                labels = ",".join(
                    sample.labels[k] for k in ("engine", "kind") if k in sample.labels
                )
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


_INDEX_METRICS = ("slogate_kv_index_blocks", "slogate_kv_index_events_total")


def _reset_prefix_caches(urls: list[str], timeout_s: float = 60.0) -> None:
    """Each engine's prefix cache emptied (it refuses while requests still hold blocks)."""
    for url in urls:
        deadline = time.monotonic() + timeout_s
        while True:
            request = urllib.request.Request(f"{url}/reset_prefix_cache", method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                if json.loads(response.read()).get("success"):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} would not reset its prefix cache")
            time.sleep(1.0)


def _reload(stack: LocalStack, arm: Arm, kv_events: dict[str, Any]) -> None:
    assert stack.sidecar_policy_path is not None
    raw = yaml.safe_load(stack.sidecar_policy_path.read_text())
    pool = raw["pools"]["default"]
    pool["picker"] = arm.picker
    pool.pop("kv_events", None)
    if arm.kv_events:
        pool["kv_events"] = kv_events
    engines = raw.setdefault("engines", {}) or {}
    raw["engines"] = engines
    engines["picking"] = dict(arm.picking)
    stack.sidecar_policy_path.write_text(yaml.safe_dump(raw))

    reply = asyncio.run(admin_client.reload_policy(stack.admin_address, stack.admin_token_file))
    if not reply.ok:
        raise RuntimeError(reply.error)


def _settle(stack: LocalStack, timeout_s: float = 120.0) -> None:
    """The pool at L0 with every engine serving: no arm starts on another's aftermath."""

    async def status() -> Any:
        from extproc.adminpb import admin_pb2 as pb

        channel, stub = admin_client.stub(stack.admin_address)
        try:
            return await stub.Status(pb.StatusRequest(), timeout=10)
        finally:
            await channel.close()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = asyncio.run(status())
        level = next(b.level for b in reply.breakers if b.pool == "default")
        states = [e.state for e in reply.engines if e.pool == "default"]
        if level == 0 and states and all(state == "serving" for state in states):
            return
        time.sleep(1.0)


def _ask(port: int, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat: status, TTFT, usage (the last event's)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    started = time.monotonic()
    first: float | None = None
    status = 0
    usage: dict[str, Any] = {}
    error = ""
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={
                "authorization": "Bearer sk-demo-critical",
                "content-type": "application/json",
            },
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
            usage = chunk.get("usage") or usage
            if first is None and any(
                (c.get("delta") or {}).get("content") for c in chunk.get("choices", [])
            ):
                first = time.monotonic() - started
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as cut:
        error = f"{type(cut).__name__}: {cut}"
        status = status if status != 200 else 0
    finally:
        conn.close()
    details = usage.get("prompt_tokens_details") or {}
    return {
        "status": status,
        "ttft_s": None if first is None else round(first, 4),
        "output_tokens": usage.get("completion_tokens"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "error": error[:200],
    }


def _play(
    stack: LocalStack, shape: Shape, plan: list[Arrival], arm: int
) -> tuple[list[dict[str, Any]], list[list[dict[str, float]]], float]:
    """Send `plan` (open loop: each at its time, not waiting for answers); the shots, each
    engine's counters at the start and each step's end (the last once all answered), and
    the seconds from the last step's end until every answer was in."""
    urls = stack.engine_urls("default")
    counters: list[list[dict[str, float]]] = [[_engine_counters(u)] for u in urls]
    shots: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def send(arrival: Arrival) -> None:
        body = {
            "model": "deepseek-v4",
            "messages": [
                {"role": "system", "content": system_prompt(shape, arrival.customer, arm)},
                {"role": "user", "content": arrival.question},
            ],
            "max_tokens": shape.answer_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sent = time.monotonic() - start
        shot = _ask(stack.listen_port, body)
        with lock:
            shots.append(
                {
                    **shot,
                    "step": arrival.step,
                    "customer": arrival.customer,
                    "start_s": round(sent, 3),
                    "end_s": round(time.monotonic() - start, 3),
                }
            )

    def scrape_at_step_ends() -> None:
        for step in range(len(shape.rates) - 1):
            time.sleep(max(0.0, start + (step + 1) * shape.step_s - time.monotonic()))
            for engine, url in zip(counters, urls, strict=True):
                engine.append(_engine_counters(url))

    scraper = threading.Thread(target=scrape_at_step_ends, daemon=True)
    scraper.start()
    with ThreadPoolExecutor(max_workers=128) as pool:
        for arrival in plan:
            time.sleep(max(0.0, start + arrival.at_s - time.monotonic()))
            pool.submit(send, arrival)
        time.sleep(max(0.0, start + len(shape.rates) * shape.step_s - time.monotonic()))
        last_step_end = time.monotonic()
    drain = time.monotonic() - last_step_end
    scraper.join()
    for engine, url in zip(counters, urls, strict=True):
        engine.append(_engine_counters(url))
    return sorted(shots, key=lambda s: s["start_s"]), counters, round(drain, 1)


def _arm(
    stack: LocalStack,
    shape: Shape,
    plan: list[Arrival],
    number: int,
    arm: Arm,
    kv_events: dict[str, Any],
) -> dict[str, Any]:
    _settle(stack)
    _reset_prefix_caches(stack.engine_urls("default"))
    _reload(stack, arm, kv_events)
    time.sleep(3.0)  # a changed kv_events resubscribes within a second
    events_before = _sidecar_total(stack.metrics_url, "slogate_kv_events_total")
    index_before = _sidecar_samples(stack.metrics_url, _INDEX_METRICS)
    shots, counters, drain = _play(stack, shape, plan, number)
    events = _sidecar_total(stack.metrics_url, "slogate_kv_events_total") - events_before
    index_after = _sidecar_samples(stack.metrics_url, _INDEX_METRICS)
    # The exact index as the arm left it: blocks held per engine (a gauge), and the blocks
    # stored, removed, cleared and dropped over the arm (counters).
    index = {
        name: value if name.startswith("slogate_kv_index_blocks") else
        value - index_before.get(name, 0.0)
        for name, value in index_after.items()
    }  # fmt: skip
    whole = [
        {k: engine[-1][k] - engine[0][k] for k in COUNTERS} for engine in counters
    ]  # fmt: skip
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in whole)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in whole)
    return {
        "arm": arm.name,
        "picker": arm.picker,
        "kv_events": arm.kv_events,
        "picking": dict(arm.picking),
        "steps": summarize(shape, shots, counters),
        "vllm_hit_rate": round(hits / queries, 4) if queries else None,
        "per_engine": [int(d["vllm:request_success_total"]) for d in whole],
        "drain_s": drain,
        "kv_event_batches": events,
        "kv_index": index,
        "load_average": round(os.getloadavg()[0], 2),
        "failures": [s["error"] for s in shots if s["status"] != 200][:5],
        "shots": shots,
    }


def _policy(work: Path) -> Path:
    raw = yaml.safe_load(example_policy().read_text())
    for bucket in raw["buckets"]:
        bucket["kv_weight"] = 1.0  # a transformer's KV per token does not grow with context
    # The keys are not what is measured: no request-rate limit refuses them.
    unlimited = {"requests_per_minute": 1_000_000, "concurrent_requests": 1_000}
    raw["tiers"] = {tier: {**limits, **unlimited} for tier, limits in raw["tiers"].items()}
    # The CPU engines starve the sidecar on a small machine (see tests/support/vllm.py).
    raw["request"]["message_timeout_ms"] = 10_000
    # Neither the breaker nor KV admission is under test: each would treat the arms alike.
    raw["breaker"]["thresholds"]["enter_hold_s"] = [600, 600, 600]
    pool = raw["pools"]["default"]
    pool.pop("kv_capacity_tokens", None)
    pool.pop("max_num_seqs", None)
    path = work / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run(out_dir: Path, shape: Shape, arms: tuple[str, ...] = DEFAULT_ARMS) -> dict[str, Any]:
    """`arms`: keys of ARMS, played in this order."""
    work = Path(tempfile.mkdtemp(prefix="slogate-prefix-vllm-"))
    ports = StackPorts(0, 0, 0, 0, 0, {"default": 0, "long": 0, "fallback": 0})
    settings = VllmSettings(
        kv_blocks=shape.kv_blocks,
        max_model_len=4096,
        kv_events_after_port=EVENT_PORTS_AFTER,
        dev_mode=True,
    )
    stack = LocalStack(
        _policy(work), work, ports, engine="vllm", vllm_count=2, vllm=settings,
        admit_engine_capacity=False,
    )  # fmt: skip
    kv_events = {
        "port": EVENT_PORTS_AFTER[0],
        "replay_port": EVENT_PORTS_AFTER[1],
        "relative_ports": True,
        "chat_template": "chatml",
        "tokenizer": str(engine_home() / "tiny-model" / "tokenizer.json"),
    }
    plan = arrivals(shape)
    stack.start()
    try:
        # Each engine's first requests pay its warm-up, not the first arm.
        _reload(stack, ARMS["round-robin"], kv_events)
        warm = Shape(**{**asdict(shape), "rates": (1.0,), "step_s": 6.0, "seed": 1})
        _play(stack, warm, arrivals(warm), 0)
        played = [
            _arm(stack, shape, plan, n, ARMS[key], kv_events) for n, key in enumerate(arms, 1)
        ]
    finally:
        stack.stop()
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "shape": {**asdict(shape), "prefix_share_of_kv": round(shape.prefix_share(), 3)},
        "requests_per_arm": len(plan),
        "arms": played,
    }
    write(out_dir, report)
    print(table(report))
    return report
