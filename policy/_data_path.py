"""The `data_path:` section: how Envoy and the sidecar exchange each request and read each
response (the per-request work on the hot path, not what is decided).

What lives here: `DataPathConfig`, its two switches and their reader. The bootstrap that
acts on them is tooling.render.envoy_config; the sidecar's side is extproc.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from policy._reader import PolicyError, Section


class ExtProcMessages(StrEnum):
    # Request headers and the buffered body each in their own ext_proc message.
    TWO = "two"
    # The body alone, with the caller's identity in metadata: one gRPC message per request
    # (ENVOY-NOTES, "One ext_proc message per request").
    ONE = "one"


class UsageTap(StrEnum):
    # The Lua filter (extproc/usage_tap.lua) reads usage out of every response body.
    LUA = "lua"
    # Envoy's json_to_metadata reads JSON bodies under 1 MB; the Lua reads the rest (streams:
    # sse_to_metadata cannot count events nor strip the usage event; tooling.render.envoy_config
    # .usage_tap).
    NATIVE = "native"


@dataclass(frozen=True, slots=True)
class DataPathConfig:
    messages: ExtProcMessages = ExtProcMessages.TWO
    usage_tap: UsageTap = UsageTap.LUA


E = TypeVar("E", bound=StrEnum)


def _choice(sec: Section, name: str, kind: type[E], default: E) -> E:
    raw = sec.get(name, str, default.value)
    try:
        return kind(raw)
    except ValueError:
        known = ", ".join(repr(v.value) for v in kind)
        raise PolicyError(f"{sec.child(name)}: expected one of {known}, got {raw!r}") from None


def parse_data_path(sec: Section) -> DataPathConfig:
    config = DataPathConfig(
        messages=_choice(sec, "messages", ExtProcMessages, ExtProcMessages.TWO),
        usage_tap=_choice(sec, "usage_tap", UsageTap, UsageTap.LUA),
    )
    sec.close()
    return config
