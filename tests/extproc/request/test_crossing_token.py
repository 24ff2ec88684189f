"""The crossing token (extproc.request.crossing_token): minted by the origin, verified by the
region it is sent to; anything else is ignored and counted."""

from __future__ import annotations

import dataclasses

import pytest

from admission.crossing import crossing_pool
from extproc.request.contract import CROSSED_HEADER
from extproc.request.crossing_token import (
    HOME,
    Arrival,
    Crossed,
    CrossingDesk,
    Rejected,
    mint,
    verify,
)
from policy._regions import RegionsConfig
from policy.domain import Tier
from policy.loader import parse_policy
from tests.support.clock import VirtualClock
from tests.support.decisions import caller, decision

SECRET = b"k" * 32
NOW = 1_796_000_000.0
ORIGINS = {"eu": None, "us": None}


def test_a_minted_token_verifies_until_it_expires() -> None:
    token = mint(SECRET, "eu", "req-1.with.dots", NOW + 30)
    assert verify(SECRET, token, NOW, ORIGINS) == Crossed("eu", "req-1.with.dots", int(NOW + 30))
    assert verify(SECRET, token, NOW + 30, ORIGINS) == Crossed(
        "eu", "req-1.with.dots", int(NOW + 30)
    )
    assert verify(SECRET, token, NOW + 31, ORIGINS) is Rejected.EXPIRED


@pytest.mark.parametrize(
    "forged",
    [
        mint(b"x" * 32, "eu", "r", NOW + 30),  # another secret
        mint(SECRET, "eu", "r", NOW + 30).replace("eu.r.", "us.r.", 1),  # another origin
        mint(SECRET, "eu", "r", NOW + 30).replace(".r.", ".s.", 1),  # another request
        mint(SECRET, "eu", "r", NOW + 30).replace(f".{int(NOW + 30)}.", f".{int(NOW + 90)}."),
    ],
)
def test_a_token_changed_in_any_part_is_forged(forged: str) -> None:
    assert verify(SECRET, forged, NOW, ORIGINS) is Rejected.FORGED


@pytest.mark.parametrize("token", ["", "eu", "eu.r.sig", "eu.r.soon.sig", ".r.1.sig"])
def test_a_token_of_the_wrong_shape_is_malformed(token: str) -> None:
    assert verify(SECRET, token, NOW, ORIGINS) is Rejected.MALFORMED


def test_a_token_from_a_region_not_listed_is_refused() -> None:
    token = mint(SECRET, "mars", "r", NOW + 30)
    assert verify(SECRET, token, NOW, ORIGINS) is Rejected.UNKNOWN_ORIGIN


class Counts:
    def __init__(self) -> None:
        self.crossed_to: list[tuple[str, str]] = []
        self.rejected: list[str] = []

    def crossed(self, peer: str, tier: str) -> None:
        self.crossed_to.append((peer, tier))

    def token_rejected(self, reason: str) -> None:
        self.rejected.append(reason)


def regions(this: str) -> RegionsConfig:
    return parse_policy(
        {
            "regions": {
                "this": this,
                "list": {"eu": {"ingress": "127.0.0.1:1"}, "us": {"ingress": "127.0.0.1:2"}},
                "ledger": {"url": "redis://127.0.0.1:1/0"},
            }
        }
    ).regions


def test_the_origin_signs_what_it_sends_the_peer_verifies_it() -> None:
    clock = VirtualClock(NOW)
    counts = Counts()
    eu, us = CrossingDesk(SECRET, clock, counts), CrossingDesk(SECRET, clock, counts)
    local = decision(tier=Tier.SHEDDABLE)
    assert eu.departure(local, "r1", regions("eu")) == {}
    crossed = dataclasses.replace(local, pool=crossing_pool("us"), caller=caller(Tier.SHEDDABLE))
    headers = eu.departure(crossed, "r1", regions("eu"))
    assert counts.crossed_to == [("us", "sheddable")]
    arrival = us.arrival(headers, regions("us"))
    assert arrival == Arrival("eu", may_cross=False)
    # Without a token: this region's own.
    assert us.arrival({}, regions("us")) is HOME
    # A token from this region itself is no peer's: ignored, never sent on.
    assert eu.arrival(headers, regions("eu")) == Arrival(None, may_cross=False)
    # Stale (past token_ttl_s, 30 s): charged here, never sent on, counted.
    clock.advance(31)
    assert us.arrival(headers, regions("us")) == Arrival(None, may_cross=False)
    forged = {CROSSED_HEADER: headers[CROSSED_HEADER][:-1] + "x"}
    assert us.arrival(forged, regions("us")) == Arrival(None, may_cross=False)
    assert counts.rejected == ["unknown_origin", "expired", "forged"]


def test_serve_region_names_the_origin_one_policy_serving_every_region() -> None:
    clock = VirtualClock(NOW)
    counts = Counts()
    as_us = CrossingDesk(SECRET, clock, counts, this="us")
    crossed = dataclasses.replace(decision(), pool=crossing_pool("eu"))
    headers = as_us.departure(crossed, "r1", regions("eu"))
    assert headers[CROSSED_HEADER].startswith("us.r1.")
    as_eu = CrossingDesk(SECRET, clock, counts, this="eu")
    assert as_eu.arrival(headers, regions("eu")) == Arrival("us", may_cross=False)
