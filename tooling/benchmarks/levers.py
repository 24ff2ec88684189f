"""What the sidecar benchmarks run under: the example policy with a key whose budget never
runs out, and the levers, each the policy with one change, measured beside it.

What lives here: `POLICY`, `BENCH_KEY`, `LEVERS` and `bench_policy`, shared by `bench
overhead`, `bench decision-cost` and `bench workers`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from extproc.shipped import example_policy

POLICY = example_policy()  # deploy/policy.example.yaml, through the package
BENCH_KEY = "sk-bench"


# Levers measured one by one (`--levers`): each is slogate with one policy change, run as one
# more setup beside the others, on the same bodies, in the same rounds.
LEVERS: dict[str, dict[str, Any]] = {
    # A long text counted by one worker instead of cut into one piece per worker.
    "no_split": {"counting": {"split_min_bytes": 0}},
    # Every text counted on the event loop: no hop to a worker thread, but the loop blocks.
    "count_on_loop": {
        "counting": {
            "inline_max_bytes": 16 * 2**20,
            "inline_unicode_max_bytes": 16 * 2**20,
            "split_min_bytes": 0,
        }
    },
    # Only text up to 2 KiB counted on the event loop, the rest by the worker threads: the
    # default before fastokens. (Measured as `inline_64k` against it when that was the
    # change: bench/results/overhead-levers-fastokens.)
    "count_in_threads": {"counting": {"inline_max_bytes": 2048, "inline_unicode_max_bytes": 2048}},
    # No message counts kept: a chat's history counted again every turn.
    "no_count_cache": {"counting": {"cache_entries": 1}},
    # The same exact counts from tiktoken's BPE instead of fastokens (the engine until now).
    "tiktoken": {"counting": {"engine": "tiktoken"}},
    # The default pool's two engines balanced by Envoy, not picked: no prompt hashed into
    # blocks, no scores (what picking costs is the default against this).
    "no_picking": {
        "pools": {
            "default": {
                "endpoints": ["127.0.0.1:18001", "127.0.0.1:18004"],
                "kv_capacity_tokens": 1048576,
                "max_num_seqs": 256,
                "picker": "envoy",
            }
        }
    },
    # Sixteen engines to score instead of two.
    "picking_16": {
        "pools": {
            "default": {
                "endpoints": [f"127.0.0.1:{18100 + i}" for i in range(16)],
                "kv_capacity_tokens": 1048576,
                "max_num_seqs": 256,
            }
        }
    },
    # The long pool (prompts past 32k) of two engines, picked among (the example's has one):
    # the baseline of kv_events at 32k.
    "long_picked": {
        "pools": {
            "long": {
                "endpoints": ["127.0.0.1:18002", "127.0.0.1:18005"],
                "kv_capacity_tokens": 1048576,
                "max_num_seqs": 256,
            }
        }
    },
    # Both pools' engines publish KV events (engines.cached_blocks): each chat rendered with
    # DeepSeek's template and tokenized whole, its blocks of 16 keyed, every engine's longest
    # cached prefix looked up (the bench feeds each engine one stored block first, so that
    # they publish: decision_cost.publish_events).
    "kv_events": {
        "pools": {
            "default": {
                "endpoints": ["127.0.0.1:18001", "127.0.0.1:18004"],
                "kv_capacity_tokens": 1048576,
                "max_num_seqs": 256,
                "kv_events": True,
            },
            "long": {
                "endpoints": ["127.0.0.1:18002", "127.0.0.1:18005"],
                "kv_capacity_tokens": 1048576,
                "max_num_seqs": 256,
                "kv_events": True,
            },
        }
    },
    # A candidate policy identical to the policy judged beside it on every request (shadow
    # mode, policy.candidate): what judging costs when nothing differs. The candidate is the
    # bench policy itself (policy.yaml, written beside the lever's file).
    "candidate_same": {"candidate": {"file": "policy.yaml"}},
    # Every request's shape recorded (traffic_record, sample_rate 1.0): what keeping the
    # traffic record on costs. Its files go beside the lever's policy file.
    "record_all": {"traffic_record": {"dir": "traffic", "sample_rate": 1.0}},
    # One ext_proc message per request (data_path.messages: one): the body alone, the
    # headers as metadata; the front Envoy is built from this policy (overhead.front_envoy).
    "one_message": {"data_path": {"messages": "one"}},
    # Non-streamed JSON usage read by Envoy's json_to_metadata instead of the Lua tap, which
    # then runs on streams only (data_path.usage_tap: native;
    # tooling.render.envoy_config.usage_tap).
    "native_usage_tap": {"data_path": {"usage_tap": "native"}},
}


def bench_policy(work: Path, changes: Mapping[str, Any] | None = None) -> Path:
    """The example policy plus a key whose budget is checked on every request but never
    runs out: the benchmark measures the cost of deciding, not the cost of refusing; with
    `changes` (a lever) merged into its sections."""
    raw = yaml.safe_load(POLICY.read_text())
    for section, values in (changes or {}).items():
        raw[section] = {**(raw.get(section) or {}), **values}
    # The bench's Envoy sends every pool's requests to one fake upstream: the endpoints the
    # policy lists do not listen, and probing them would call every engine dead (the breaker
    # then sheds everything at L3, no_engines, and the bench measures refusals).
    engines = raw.get("engines") or {}
    engines["health"] = {**(engines.get("health") or {}), "probes": False}
    raw["engines"] = engines
    huge = 10**12
    raw["keys"].append(
        {
            "key": BENCH_KEY,
            "tenant": "bench",
            "tier": "standard",
            "limits": {
                "requests_per_minute": huge,
                "tokens_per_minute": huge,
                "tokens_per_hour": huge,
                "concurrent_requests": huge,
            },
        }
    )
    if changes and "candidate" in changes:
        bench_policy(work)  # the candidate it names: the policy without the lever
    tag = hashlib.sha1(json.dumps(changes, sort_keys=True).encode()).hexdigest()[:8]
    path = work / (f"policy-{tag}.yaml" if changes else "policy.yaml")
    path.write_text(yaml.safe_dump(raw))
    return path
