"""The round-trip census's reading of MONITOR (tooling/benchmarks/round_trips.py); the census
itself runs in `slogate bench decisions`."""

from __future__ import annotations

from tooling.benchmarks.round_trips import (
    PER_REQUEST,
    client_commands,
    command_name,
    script_names,
    split,
)

MONITORED = (
    "+OK\r\n"
    '+1796463004.346291 [0 127.0.0.1:40890] "EVALSHA" "5a63" "3" "slogate:{k}:state" "-1"\r\n'
    '+1796463004.346300 [0 lua] "TIME"\r\n'
    '+1796463004.346310 [0 lua] "HMGET" "slogate:{k}:state" "requests"\r\n'
    '+1796463004.576213 [0 127.0.0.1:40918] "ZADD" "slogate:{fleet}:replicas" "1.5" "a\\"b"\r\n'
)


def test_only_what_clients_sent_counts_as_a_round_trip() -> None:
    assert client_commands(MONITORED) == [
        ["EVALSHA", "5a63", "3", "slogate:{k}:state", "-1"],
        ["ZADD", "slogate:{fleet}:replicas", "1.5", 'a\\"b'],
    ]


def test_scripts_are_named_by_their_sha() -> None:
    names = script_names()
    assert set(PER_REQUEST) <= set(names.values())  # every per-request script is known
    sha = next(s for s, name in names.items() if name == "reserve.lua")
    assert command_name(["EVALSHA", sha, "3"], names) == "EVALSHA reserve.lua"
    assert command_name(["zadd", "k"], names) == "ZADD"


def test_what_each_request_makes_is_told_from_the_loops() -> None:
    counts = {"EVALSHA reserve.lua": 100, "EVALSHA kv_expire.lua": 4, "ZADD": 2, "MONITOR": 1}
    assert split(counts, requests=100, seconds=2.0) == {
        "per_request": {"body decision: budget reserve (EVALSHA reserve.lua)": 1.0},
        "periodic_per_s": {"EVALSHA kv_expire.lua": 2.0, "ZADD": 1.0},
    }
