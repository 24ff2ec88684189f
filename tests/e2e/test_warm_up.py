"""Warm before ready (issue 31): no client pays the sidecar's warm-up.

The sidecar counts texts of each kind and runs one decision through its chain before it
reports ready (extproc.runtime.warm_up). Through real Envoy and a real `slogate serve`,
each request's decision time is read as the bucket of slogate_decision_seconds it landed
in (scraped before and after it): the first request of a kind after a start lands no
higher than the typical one, give or take one bucket (all under 1 ms count as one: see
`landed`), or than the run's own 90th percentile (a busy machine slows both), or under
10 ms. Without the warm-up (checked by taking it out) all three kinds failed here: the
first short decision landed in 25-50 ms, the first long one in 100-500 ms, the first
non-ASCII one in 10-25 ms, against under 1 ms to 2 ms for the median and the hundredth.
And the warm-up leaves nothing behind: no decision, hold, in-flight entry or counted
message, in the metrics or the state.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import example_policy, start_stack, write_policy

KEY = "sk-warm-up-test"
REQUESTS = 100
# 5-10 ms, counted from the 1 ms bound (see `landed`): the bucket under the cheapest cost
# the warm-up saves (the first non-ASCII count, 10-25 ms).
WARM_ENOUGH = 3

_SENTENCE = (
    "the gateway counts every prompt before it routes it and charges the budget of "
    "its key while the engines answer requests of many lengths from clients near and far"
)
_WORDS = _SENTENCE.split()
_HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"  # noqa: E501


def _english(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of English (a word and its space are about one token)."""
    return " ".join(rng.choice(_WORDS) for _ in range(tokens))


def _short(rng: random.Random) -> str:
    return f"Say hello to user {rng.randrange(10**9)}: " + _english(rng, 20)


def _long(rng: random.Random) -> str:
    # ~30k tokens (~150 KB): past inline_max_bytes and split_min_bytes, counted by the
    # worker threads.
    return _english(rng, 30_000)


def _non_ascii(rng: random.Random) -> str:
    # ~3,000 CJK characters (~9 KB): past inline_unicode_max_bytes, off the loop.
    return "".join(rng.choice(_HAN) for _ in range(3_000))


# Every request's text differs: a count from the cache would make the later ones cheaper.
KINDS: dict[str, Callable[[random.Random], str]] = {
    "short": _short,
    "long": _long,
    "non_ascii": _non_ascii,
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _policy(path: Path) -> Path:
    raw = example_policy()
    big = {
        "requests_per_minute": 1_000_000,
        "tokens_per_minute": 1_000_000_000,
        "tokens_per_hour": 10_000_000_000,
        "concurrent_requests": 64,
    }
    raw["keys"].append({"key": KEY, "tenant": "warm-up-test", "tier": "critical", "limits": big})
    return write_policy(path, raw)


def _buckets(samples: Samples, phase: str) -> list[tuple[float, float]]:
    """(le, cumulative count) of the phase's decision histogram, lowest bound first."""
    found = [
        (float(dict(labels)["le"]), value)
        for (name, labels), value in samples.items()
        if name == "slogate_decision_seconds_bucket" and ("phase", phase) in labels
    ]
    return sorted(found)


def landed(before: Samples, after: Samples, phase: str) -> int:
    """The bucket the one observation between two scrapes landed in, counted from the
    1 ms bound: every decision under a millisecond is bucket 0. The warm-up is about costs
    of 10-250 ms; what stays in a first decision after it (~0.1-0.3 ms: the first budget
    entry, KV hold and prefix index of the real state, which a warm-up may not touch) is
    1-2 of the histogram's sub-millisecond buckets (0.1, 0.25, 0.5 ms) and no client's
    concern."""
    then = dict(_buckets(before, phase))
    bounds = _buckets(after, phase)
    floor = [le for le, _ in bounds].index(0.001)
    for index, (le, count) in enumerate(bounds):
        if count > then.get(le, 0.0):
            return max(0, index - floor)
    raise AssertionError(f"no {phase} decision was observed between the scrapes")


@pytest.mark.parametrize("kind", list(KINDS))
def test_first_decisions_no_slower_than_the_hundredth(kind: str, tmp_path: Path) -> None:
    make_text = KINDS[kind]
    rng = random.Random(kind)
    texts = [make_text(rng) for _ in range(REQUESTS)]  # built before the clock matters
    stack = start_stack(tmp_path, _policy(tmp_path / "policy.yaml"))
    try:
        url = stack.metrics_url
        start = scrape(url)
        # The warm-up is not a client decision: nothing of it is counted.
        assert metric(start, "slogate_decisions_total") == 0
        assert metric(start, "slogate_decision_seconds_count") == 0
        per_phase: dict[str, list[int]] = {"request_headers": [], "request_body": []}
        before = start
        for text in texts:
            reply = post(stack.url, CHAT, chat_body(text), key=KEY)
            assert reply.status == 200, reply.body[:300]
            after = scrape(url)
            for phase, landed_in in per_phase.items():
                landed_in.append(landed(before, after, phase))
            before = after
    finally:
        stack.stop()
    for phase, landed_in in per_phase.items():
        ranked = sorted(landed_in)
        typical, tail = ranked[len(ranked) // 2], ranked[int(len(ranked) * 0.9)]
        first = landed_in[:3]
        hundredth = landed_in[-1]
        shown = (
            f"{kind} {phase}: buckets of the first {first}, median {typical}, "
            f"90th percentile {tail}, 100th {hundredth}"
        )
        print(shown)
        # One bucket of resolution: a decision near a bound lands on either side of it.
        # The run's own 90th percentile: a machine busy with other work slows some of the
        # run's decisions, the first ones among them (two xdist workers: the first three
        # long ones landed in [3, 2, 3] against a median of 1 while the other worker
        # started a stack). And 5-10 ms (bucket 3) passes whatever the run: the warm-up is
        # about 10-250 ms, and what it saves never lands under 10 ms (see the docstring).
        assert max(first) <= max(typical + 1, hundredth + 1, tail, WARM_ENOUGH), shown
