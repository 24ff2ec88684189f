"""A workload's `faults:` as read: every kind, and the mistakes each is refused for."""

from __future__ import annotations

import pytest

from tooling.loadtest.faults import load_faults


def test_every_kind_of_fault_is_read_in_time_order() -> None:
    faults = load_faults(
        [
            {"at_s": 30, "for_s": 5, "pause": "redis"},
            {"at_s": 20, "for_s": 5, "stop": "redis"},
            {"at_s": 10, "restart": "redis"},
            {"at_s": 5, "kill": "sidecar"},
            {"at_s": 1, "for_s": 2, "pool": "default", "latency_ms": 400},
        ]
    )
    assert [f.at_s for f in faults] == [1, 5, 10, 20, 30]
    assert faults[0].settings == {"latency_ms": 400.0}
    assert (faults[3].stop, faults[3].for_s) == ("redis", 5.0)
    assert (faults[4].pause, faults[4].for_s) == ("redis", 5.0)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"at_s": 1, "stop": "redis"}, "needs for_s"),
        ({"at_s": 1, "for_s": 3, "pause": "sidecar"}, "one of pool"),
        ({"at_s": 1, "for_s": 3, "stop": "redis", "kill": "sidecar"}, "one of pool"),
        ({"at_s": 1, "for_s": 3, "pool": "default"}, "what to inject"),
        ({"at_s": 1, "colour": "red", "kill": "sidecar"}, "unknown field colour"),
    ],
)
def test_a_fault_that_says_too_little_or_too_much_is_refused(
    item: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_faults([item])
