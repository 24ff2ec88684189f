"""A policy for `slogate serve --workers` tests: one key with room for every request, and
the in-process store or a Redis one."""

from __future__ import annotations

from pathlib import Path

import yaml

KEY = "sk-workers"


def write_policy(path: Path, redis_port: int | None) -> Path:
    budget = (
        {
            "store": "redis",
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "redis_timeout_ms": 500,
        }
        if redis_port
        else {}
    )
    policy = {
        "budget": budget,
        "pools": {"default": {"endpoints": ["127.0.0.1:9"], "kv_capacity_tokens": 1_000_000}},
        "breaker": {"scrape_metrics": False},
        "keys": [
            {
                "key": KEY,
                "tenant": "workers",
                "tier": "standard",
                "limits": {"concurrent_requests": 100_000},
            }
        ],
    }
    path.write_text(yaml.safe_dump(policy))
    return path
