"""What the `slogate` subcommands share: the default policy and admin address, the
--policy argument, a foreground command's stop signal and the vLLM check."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from tooling.shipped_files import example_policy

# The example policy inside the package, not a path relative to the working directory:
# `slogate up` run from anywhere finds it (an installed slogate its own copy, a checkout
# deploy/policy.example.yaml).
DEFAULT_POLICY = example_policy()
DEFAULT_ADMIN = "127.0.0.1:50052"
# --policy's default, as --help shows it. argparse passes a string default through `type`
# when the option is absent, which is where the example is looked up and the choice said.
_EXAMPLE_DEFAULT = "the example policy shipped with slogate"

log = logging.getLogger("slogate.cli")


class Signalled:
    """Set by SIGTERM or SIGINT: a foreground command then stops its children itself
    (Python's default SIGTERM would end it without running its `finally`, orphaning them)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum: int, frame: object) -> None:
        self.stopping = True


def policy_path(value: str) -> Path:
    """--policy's value; without one, the shipped example, with a line saying which file:
    a stack started on the demo policy by mistake should not look like a configured one."""
    if value != _EXAMPLE_DEFAULT:
        return Path(value)
    log.info("no --policy given: using the example policy shipped with slogate, %s", DEFAULT_POLICY)
    return DEFAULT_POLICY


def policy_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        type=policy_path,
        default=_EXAMPLE_DEFAULT,
        help="policy YAML file (default: %(default)s, deploy/policy.example.yaml)",
    )


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
