"""`slogate engine vllm`: a real inference engine (vLLM's CPU build, a tiny model made here)
on loopback, in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tooling.cli.common import Signalled, vllm_ready


def register(sub: argparse._SubParsersAction) -> None:
    engine = sub.add_parser("engine", help="start a real inference engine on loopback")
    engine_sub = engine.add_subparsers(dest="engine", required=True)
    vllm = engine_sub.add_parser(
        "vllm", help="vLLM's CPU build serving a tiny model made here (no download)"
    )
    vllm.add_argument("--port", type=int, default=18001)
    vllm.add_argument(
        "--served-model-name", action="append", default=None, help="default: deepseek-v4"
    )
    vllm.add_argument("--max-model-len", type=int, default=8192)
    vllm.add_argument("--kv-blocks", type=int, default=80, help="KV blocks of 128 tokens")
    vllm.add_argument("--max-num-seqs", type=int, default=16)
    vllm.add_argument(
        "--priority", action="store_true", help="--scheduling-policy priority (lower first)"
    )
    vllm.set_defaults(handler=run_engine)


def run_engine(args: argparse.Namespace) -> int:
    """A real engine in the foreground until Ctrl-C; its log stays in a temp folder."""
    from extproc.runtime.processes import ProcessFailed
    from tooling.stack.vllm_engine import VllmEngine, VllmSettings

    if not vllm_ready():
        return 2
    settings = VllmSettings(
        port=args.port,
        served_names=tuple(args.served_model_name or ["deepseek-v4"]),
        max_model_len=args.max_model_len,
        kv_blocks=args.kv_blocks,
        max_num_seqs=args.max_num_seqs,
        priority_scheduling=args.priority,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="slogate-engine-"))
    engine = VllmEngine(log_dir, settings)
    signals = Signalled()
    print(f"slogate engine: starting vLLM on {settings.port} (about a minute; log {log_dir})")
    started = time.monotonic()
    try:
        engine.start()
    except ProcessFailed as failed:
        print(f"slogate engine: vLLM did not start: {failed}", file=sys.stderr)
        return 1
    print(
        f"slogate engine: {engine.url} ready after {time.monotonic() - started:.0f} s: "
        f"{engine.facts().summary()}",
        flush=True,
    )
    try:
        while not signals.stopping and engine.process is not None and engine.process.running():
            time.sleep(0.5)
    finally:
        engine.stop()
    return 0
