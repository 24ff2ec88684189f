"""The engines behind the local stack's pools, and the policy file the sidecar reads for them.

What lives here: starting and restarting a pool's engines for `tooling.stack.local.LocalStack`
(one simulated engine, `sim.server.pool`, per endpoint the pool lists; or `vllm_count` real vLLMs,
tooling.stack.vllm_engine, whose reported KV capacity and batch slots become the pool's), and
`write_runtime_policy`: the given policy with each pool's endpoints set to the engines
actually started, plus what the stack was asked for (Redis store, replicas, traffic record).
Each function takes the LocalStack, reads its settings and records what it started in its
tables; tooling.stack.local is imported for type checking only: at run time local imports
this module, never the other way round.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from extproc.runtime.processes import ManagedProcess, python_module
from policy.domain import Pool
from policy.schema import Policy
from tooling.stack.vllm_engine import VllmEngine

if TYPE_CHECKING:
    from tooling.stack.local import LocalStack

HOST = "127.0.0.1"


def served_names(policy: Policy) -> tuple[str, ...]:
    """The model names every pool answers to: the policy's model and its L3 fallback."""
    names = (policy.model_name, *([policy.fallback_model] if policy.fallback_model else []))
    return tuple(dict.fromkeys(names))


def start_sim_pool(
    stack: LocalStack, pool: Pool, models: tuple[str, ...]
) -> list[tuple[str, ManagedProcess]]:
    """One simulated engine per endpoint of `pool`, each with its share of the pool's
    KV cache and batch slots (what it then reports in its metrics)."""
    names = [arg for name in models for arg in ("--served-model-name", name)]
    count = len(pool.endpoints)
    shares: list[str] = []
    if pool.kv_capacity_tokens is not None:
        shares += ["--kv-capacity-tokens", str(pool.kv_capacity_tokens // count)]
    if pool.max_num_seqs is not None:
        shares += ["--max-num-seqs", str(max(1, pool.max_num_seqs // count))]
    started = []
    for index, (_, endpoint_port) in enumerate(pool.endpoints):
        first = stack.ports.pools.get(pool.name, endpoint_port)
        port = first if index == 0 else (endpoint_port if first else 0)
        argv = python_module(
            "sim.server.pool",
            "--name", f"{stack.region}-{pool.name}" if stack.region else pool.name,
            "--host", HOST,
            "--port", str(port),
            "--seed", str(index),
            "--time-scale", str(stack.time_scale),
            # The pools count prompts as vLLM does, so a crafted prompt costs them its
            # real size, not a quarter of its bytes.
            "--tokenizer", "deepseek",
            # As the policy says the engines schedule (slogate then writes priorities).
            "--scheduling-policy", "priority" if pool.priority_scheduling else "fcfs",
            *shares,
            *names,
        )  # fmt: skip
        name = f"pool-{pool.name}" if index == 0 else f"pool-{pool.name}-{index}"
        proc = ManagedProcess(name, argv, stack.work_dir).start()
        stack.processes.append(proc)
        stack.engine_procs.setdefault(pool.name, []).append(proc)
        started.append((pool.name, proc))
    return started


def restart_sim_engine(stack: LocalStack, pool: str, index: int) -> ManagedProcess:
    """Stop the pool's `index`th simulated engine if it runs, and start it again on its
    port (a new process: empty cache, its metrics from zero)."""
    old = stack.engine_procs[pool][index]
    old.stop()
    argv = list(old.argv)
    argv[argv.index("--port") + 1] = str(stack.engine_ports[pool][index])
    proc = ManagedProcess(f"{old.name}-again", argv, stack.work_dir).start()
    proc.wait_for_line(r"listening on http://")
    stack.processes[stack.processes.index(old)] = proc
    stack.engine_procs[pool][index] = proc
    return proc


def start_real_engines(stack: LocalStack, policy: Policy, pool: Pool) -> None:
    """`vllm_count` real vLLMs for `pool`, started side by side, serving the policy's
    model names, scheduling by priority when the pool says its engines do; what they
    report becomes the pool's capacity."""
    first_port = stack.ports.pools.get(pool.name, pool.endpoints[0][1])
    settings = dataclasses.replace(
        stack.vllm,
        served_names=served_names(policy),
        priority_scheduling=pool.priority_scheduling,
    )
    engines = []
    cores = os.cpu_count() or 1
    for index in range(stack.vllm_count):
        port = first_port if index == 0 else 0
        name = f"vllm-{pool.name}" if index == 0 else f"vllm-{pool.name}-{index}"
        own = settings
        if stack.vllm_count > 1 and not settings.cpu_cores:
            # Each engine its own core, as on machines of their own: vLLM binds every engine
            # to the same first core, where the one with more work starved the other (its
            # OpenMP threads spin 5 ms after each parallel region) and picking, following the
            # engine that answers, fed the starving (86 / 10 requests, seconds-long stalls).
            own = dataclasses.replace(settings, cpu_cores=str(index % cores))
        engine = VllmEngine(stack.work_dir, dataclasses.replace(own, port=port), name=name)
        engines.append(engine.launch())
    for engine in engines:
        engine.ready()
        assert engine.process is not None
        stack.processes.append(engine.process)
    stack.engines[pool.name] = engines[0]
    stack.real_engines[pool.name] = engines
    stack.pool_ports[pool.name] = engines[0].port
    stack.engine_ports[pool.name] = [e.port for e in engines]
    facts = [e.facts() for e in engines]
    stack.engine_facts[pool.name] = dataclasses.replace(
        facts[0],
        kv_capacity_tokens=sum(f.kv_capacity_tokens for f in facts),
        blocks=sum(f.blocks for f in facts),
        max_num_seqs=sum(f.max_num_seqs for f in facts),
    )


def restart_real_engine(stack: LocalStack, pool: str, index: int) -> VllmEngine:
    """Stop the pool's `index`th real engine if it runs and start it again on its port
    (~50 s: vLLM's start)."""
    old = stack.real_engines[pool][index]
    old.stop()
    engine = VllmEngine(stack.work_dir, old.settings, name=f"{old.name}-again", port=old.port)
    engine.start()
    assert engine.process is not None and old.process is not None
    stack.processes[stack.processes.index(old.process)] = engine.process
    stack.real_engines[pool][index] = engine
    return engine


def write_runtime_policy(stack: LocalStack) -> Path:
    """The policy file the sidecar reads: the given one with each pool's endpoints set to
    the simulated engines started for it, so engine metrics are scraped from the real
    ones."""
    raw = yaml.safe_load(stack.policy_path.read_text(encoding="utf-8")) or {}
    given = raw.get("pools") or {}
    # Only the endpoints move: every other pool setting (kv_capacity_tokens) is kept.
    raw["pools"] = {
        name: {**(given.get(name) or {}), "endpoints": [f"{HOST}:{p}" for p in ports]}
        for name, ports in stack.engine_ports.items()
    }
    for name, facts in stack.engine_facts.items():  # a real engine: what it reports
        if not stack.admit_engine_capacity:
            break
        raw["pools"][name]["kv_capacity_tokens"] = facts.kv_capacity_tokens
        raw["pools"][name]["max_num_seqs"] = facts.max_num_seqs
    if stack.engine_facts:
        # vLLM's CPU build starves its own API server while it prefills on two cores
        # (/health and /metrics answered 1-5 s late): a 1 s probe would call it dead.
        health = (raw.setdefault("engines", {}) or {}).setdefault("health", {})
        health.setdefault("probe_timeout_s", 10.0)
    budget = raw.setdefault("budget", {}) or {}
    raw["budget"] = budget
    if stack.budget_store is not None:
        budget["store"] = stack.budget_store.value
    if stack.redis is not None:
        budget["redis_url"] = f"redis://{HOST}:{stack.redis_port}"
    if stack.replicas > 1:
        budget["replicas"] = stack.replicas  # until the heartbeats say better
    if stack.record_dir is not None:
        record = raw.get("traffic_record") or {}
        raw["traffic_record"] = {**record, "dir": str(stack.record_dir.resolve())}
    path = stack.work_dir / "policy.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path
