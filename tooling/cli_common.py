"""What the `slogate` subcommands share: the default policy and admin address, the
--policy argument, a foreground command's stop signal and the vLLM check."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

DEFAULT_POLICY = Path("deploy/policy.example.yaml")
DEFAULT_ADMIN = "127.0.0.1:50052"


class Signalled:
    """Set by SIGTERM or SIGINT: a foreground command then stops its children itself
    (Python's default SIGTERM would end it without running its `finally`, orphaning them)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum: int, frame: object) -> None:
        self.stopping = True


def policy_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help="policy YAML file")


def vllm_ready() -> bool:
    from tooling.vllm_engine import vllm_available

    if not vllm_available():
        print(
            "slogate: vLLM is not installed here: `make vllm` (pip install -e '.[vllm]' and "
            "python -m tooling.vllm_install)",
            file=sys.stderr,
        )
        return False
    return True
