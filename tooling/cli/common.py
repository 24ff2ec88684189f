"""What several `slogate` subcommands share: a foreground command's stop signal, the vLLM
check and the POOL=NAME argument. The --policy and --admin arguments, which `serve` has too,
are extproc.runtime.serve_command's."""

from __future__ import annotations

import argparse
import signal
import sys


class Signalled:
    """Set by SIGTERM or SIGINT: a foreground command then stops its children itself
    (Python's default SIGTERM would end it without running its `finally`, orphaning them)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum: int, frame: object) -> None:
        self.stopping = True


def pool_cluster(value: str) -> tuple[str, str]:
    """POOL=NAME: a pool and the cluster (or InferencePool) of yours in front of it."""
    name, _, cluster = value.partition("=")
    if not name or not cluster:
        raise argparse.ArgumentTypeError(f"expected POOL=CLUSTER, got {value!r}")
    return name, cluster


def vllm_ready() -> bool:
    from tooling.stack.vllm_engine import vllm_available

    if not vllm_available():
        print(
            "slogate: vLLM is not installed here: `make vllm` (pip install -e '.[vllm]' and "
            "python -m tooling.build.vllm_install)",
            file=sys.stderr,
        )
        return False
    return True
