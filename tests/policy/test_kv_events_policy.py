"""A pool's `kv_events`: off by default, vLLM's defaults with true, each field checked."""

from __future__ import annotations

import pytest

from policy._fleet import parse_pools
from policy._reader import PolicyError
from policy.domain import ChatTemplate, KvEvents


def pool(kv_events: object) -> KvEvents | None:
    return parse_pools({"p": {"endpoints": ["h:8000"], "kv_events": kv_events}}, "pools")[
        "p"
    ].kv_events


def test_off_by_default_and_on_with_vllms_defaults() -> None:
    assert parse_pools({"p": {"endpoints": ["h:8000"]}}, "pools")["p"].kv_events is None
    assert pool(False) is None
    assert pool(True) == KvEvents(port=5557, replay_port=None)


def test_fields() -> None:
    config = pool(
        {
            "port": 6000,
            "replay_port": 6001,
            "relative_ports": True,
            "topic": "kv",
            "max_blocks": 1000,
            "tokenizer": "/models/tokenizer.json",
            "chat_template": "chatml",
        }
    )
    assert config == KvEvents(
        6000, 6001, True, "kv", 1000, "/models/tokenizer.json", ChatTemplate.CHATML
    )
    assert config.ports(8000) == (14000, 14001)
    assert KvEvents(port=5557, replay_port=5558).ports(8000) == (5557, 5558)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"port": 0}, "kv_events.port: expected a port"),
        ({"port": 5557, "replay_port": 5557}, "kv_events.replay_port: must differ"),
        ({"max_blocks": 0}, "kv_events.max_blocks: must be > 0"),
        ({"chat_template": "llama"}, "kv_events.chat_template: expected one of"),
        ({"prot": 1}, "kv_events.prot: unknown field"),
        ("yes", "kv_events: expected a mapping"),
    ],
)
def test_bad_fields_are_named(raw: object, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        pool(raw)
