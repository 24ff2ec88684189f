"""One region of the regions lab, run inside its network namespace.

What lives here: the command `python -m tooling.stack.region_host --policy P --work-dir D
--region NAME`, which starts a `LocalStack` (the region's Redis, simulated pools, sidecar,
Envoy) on the documented ports, with Envoy's listener and the sidecar's /metrics on every
interface of the namespace (its edge veth, where the load generator reaches it, and its WAN
veth, where peers' crossing traffic arrives), prints `region ready: {json}` and stops it on
SIGTERM or SIGINT. On SIGUSR1 it squeezes its pools (the sidecar's policy rewritten with
`--squeeze-slots` batch slots per pool and a waiting room of `--squeeze-waiting`, reloaded
by SIGHUP) and prints `region squeezed`: the lab saturates one region's pool for its last
phase without running the earlier ones on a small pool. tooling.benchmarks.regions starts
one per namespace with `ip netns exec`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from policy.loader import load_policy
from policy.schema import BudgetStoreKind
from tooling.stack.local import LocalStack, StackPorts

ANY = "0.0.0.0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.stack.region_host")
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--squeeze-slots", type=int, default=4, help="on SIGUSR1: per pool")
    parser.add_argument("--squeeze-waiting", type=int, default=4, help="on SIGUSR1")
    args = parser.parse_args(argv)
    stop, squeeze = threading.Event(), threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: squeeze.set())
    pools = {name: 0 for name in load_policy(args.policy).pools}
    stack = LocalStack(
        args.policy,
        args.work_dir,
        StackPorts(pools=pools),  # the documented ports: the namespace is the region's own
        args.time_scale,
        budget_store=BudgetStoreKind.REDIS,
        sidecar_log_args=("--metrics-host", ANY),
        region=args.region,
        listen_host=ANY,
    )
    stack.start()
    try:
        ready = {
            "region": args.region,
            "listen": stack.listen_port,
            "metrics": stack.metrics_port,
            "redis": stack.redis_port,
        }
        print(f"region ready: {json.dumps(ready)}", flush=True)
        while not stop.wait(0.2):
            if squeeze.is_set():
                squeeze.clear()
                squeeze_pools(stack, args.squeeze_slots, args.squeeze_waiting)
                print("region squeezed", flush=True)
            dead = stack.failed()
            if dead is not None:
                print(f"{dead.name} exited:\n{dead.log_text()[-3000:]}", flush=True)
                return 1
    finally:
        stack.stop()
    return 0


def squeeze_pools(stack: LocalStack, slots: int, waiting: int, timeout_s: float = 20.0) -> None:
    """Every pool down to `slots` batch slots and the waiting room to `waiting` requests per
    pool and tier, in the sidecar's policy (its engines keep theirs: the sidecar admits
    less than they could serve); back once the sidecar says it reloaded."""
    assert stack.sidecar_policy_path is not None and stack.sidecar is not None
    path = stack.sidecar_policy_path
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    for pool in raw["pools"].values():
        pool["max_num_seqs"] = slots
    raw["waiting_room"] = {**(raw.get("waiting_room") or {}), "max_waiting": waiting}
    before = stack.sidecar.log_text().count("policy reloaded")
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    stack.sidecar.signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout_s
    while stack.sidecar.log_text().count("policy reloaded") <= before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sidecar did not reload its policy in {timeout_s} s")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
