"""Stacks by ext_proc message mode (policy `data_path.messages`): the data-path and every-path
suites run under both, each mode's stack started once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policy._data_path import ExtProcMessages
from tests.support.stack import EXAMPLE_POLICY, example_policy, start_stack, write_policy
from tooling.stack.local import LocalStack

MODES = [ExtProcMessages.TWO, ExtProcMessages.ONE]
MODE_IDS = [f"{mode.value}-message" for mode in MODES]


def with_messages(raw: dict[str, Any], mode: ExtProcMessages) -> dict[str, Any]:
    """The policy `raw` with its data path's message mode set to `mode`."""
    raw.setdefault("data_path", {})["messages"] = mode.value
    return raw


def start_stack_with(
    tmp: Path, mode: ExtProcMessages, raw: dict[str, Any] | None = None, **options: Any
) -> LocalStack:
    """The stack for `raw` (None: the example policy) in message mode `mode`."""
    if raw is None and mode is ExtProcMessages.TWO:
        return start_stack(tmp, EXAMPLE_POLICY, **options)
    policy = write_policy(tmp / "policy.yaml", with_messages(raw or example_policy(), mode))
    return start_stack(tmp, policy, **options)
