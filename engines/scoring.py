"""Which engine of a pool gets a request: scorers, each in [0, 1], and one picker. Pure.

What lives here: `EngineCandidate` (what a scorer may read of one engine), the four scorers and
`pick`, which weights them (`PickingConfig`) and returns the engines best first. The same
code picks in the sidecar (extproc.request.flow) and in the simulator (sim.fleet.sidecar).

The scorers, and which way each pulls:
- prefix (affinity): the share of the prompt's tokens past its conversation's head whose
  leading blocks the engine was recently sent (engines.prefix.PrefixIndex): its prefix
  cache may still hold them. The head (a shared system prompt, the first question) is left
  out: every engine soon caches a shared system prompt, and each replica's index knows only
  what it sent, so a pull on it would split one chat's turns between replicas; past the
  head, a chat's history is where its earlier turns went. Where the engine publishes its KV
  events (engines.cached_blocks), its match is exact and the same on every replica, and the
  head counts too: a shared prefix cached on one engine only is worth a prefill saved there
  (llm-d's precise case: customers' 6,000-token shared prefixes), and one cached everywhere
  scores every engine alike.
- load (distribution): how free the engine is — the largest of the KV and batch slots this
  sidecar holds on it (exact, the moment it admits) and its scraped KV usage (every
  replica's requests, seconds late).
- affinity (affinity): the conversation's rendezvous engine. Every replica ranks the
  engines by a hash of (conversation key, engine) and gets the same order without talking
  to the others, so the turns of one chat reach one engine through any replica; bounded
  load keeps a popular conversation head from piling onto one engine: an engine with more
  than `load_bound` x its fair share of the requests in flight loses its prefix and
  affinity pull (consistent hashing with bounded loads); an exact match pulls to twice
  that, and past the KV this sidecar holds, which counts a shared prefix per request.
- length (affinity): requests of one context bucket prefer the same engines (rendezvous on
  the bucket's name), so long and short prompts are packed apart.
Ties go to the affinity order, so two replicas with the same view pick alike.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from engines.prefix import PromptBlocks
from policy.schema import PickingConfig

_HRW_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# An exact match's prefix pull is bounded at this x `load_bound` (score: why).
EXACT_BOUND_FACTOR = 2.0


@dataclass(slots=True)
class EngineCandidate:
    """One serving engine as the picker sees it. (Not frozen: one is made per engine per
    request, and a frozen dataclass's init costs twice as much; nothing changes one.)"""

    address: str
    slot: int
    held_tokens: int
    held_sequences: int
    kv_tokens: float | None  # its KV cache (None: unknown)
    sequences: float | None  # its batch slots (None: unknown)
    scraped_kv_usage: float | None = None  # fresh metrics only (None: no data)
    matched_tokens: int = 0  # of the prompt, from the prefix index
    # matched_tokens is what the engine's own KV events say it holds (engines.cached_blocks),
    # not a guess from what this replica sent it.
    exact_prefix: bool = False


class Scores(NamedTuple):  # a tuple: one per engine per request, made cheaply
    address: str
    prefix: float
    load: float
    affinity: float
    length: float
    total: float


def rendezvous(key: int, address: str) -> int:
    """A stable 64-bit weight of (key, engine): the same on every replica and process."""
    value = (key ^ _address_hash(address)) & _MASK
    value = (value ^ (value >> 31)) * _HRW_MIX & _MASK
    value = (value ^ (value >> 29)) * _HRW_MIX & _MASK
    return value ^ (value >> 32)


@lru_cache(maxsize=4096)
def _address_hash(address: str) -> int:
    value = 0xCBF29CE484222325
    for byte in address.encode():
        value = ((value ^ byte) * 0x100000001B3) & _MASK
    return value


def _rank_scores(weights: Sequence[int]) -> list[float]:
    """From each engine's rendezvous weight: 1.0 for the heaviest, falling linearly to 0.0
    for the lightest."""
    if len(weights) == 2:  # the common pool, without a sort
        return [1.0, 0.0] if weights[0] >= weights[1] else [0.0, 1.0]
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    scores = [0.0] * len(weights)
    last = max(1, len(weights) - 1)
    for rank, index in enumerate(order):
        scores[index] = 1.0 - rank / last if len(weights) > 1 else 1.0
    return scores


@lru_cache(maxsize=1024)
def _bucket_ranks(bucket: str, addresses: tuple[str, ...]) -> tuple[float, ...]:
    """The length scorer's ranks: the same for every request of a bucket on one set of
    engines, so worked out once per (bucket, engines)."""
    key = _address_hash(bucket)
    return tuple(_rank_scores([rendezvous(key, address) for address in addresses]))


def load_of(
    candidate: EngineCandidate, pool_held_sequences: int, count: int, most_held: int = 0
) -> float:
    """How full the engine is, 0..1: what slogate holds on it against its capacity (against
    an even share of the pool's requests where its capacity is unknown), or what it reports
    holding, whichever is more; and never less than half its requests in flight against the
    busiest engine's (least-request balancing, exact and instant: the cache fractions alone
    tie while engines are nearly empty, and requests stuck on a hung engine pile up there
    until its probes fail). Its scraped queue is not scored: seconds old, it tilted every
    request picked within one scrape interval the same way."""
    # The largest part kept as `max` over them in this order would (a later part replaces
    # only one strictly greater), without a list per engine per request.
    held = candidate.held_sequences
    load = 0.5 * held / most_held if most_held else 0.0
    kv_tokens, sequences = candidate.kv_tokens, candidate.sequences
    if kv_tokens and (part := candidate.held_tokens / kv_tokens) > load:
        load = part
    if sequences and (part := held / sequences) > load:
        load = part
    if not kv_tokens and not sequences and (part := held / (pool_held_sequences + count)) > load:
        load = part
    usage = candidate.scraped_kv_usage
    if usage is not None and usage > load:
        load = usage
    return min(1.0, load)


def score(
    candidates: Sequence[EngineCandidate],
    blocks: PromptBlocks,
    bucket: str,
    config: PickingConfig,
    weights: Sequence[int] | None = None,
) -> list[Scores]:
    """Every candidate's scores, in the candidates' order. `weights`: each candidate's
    rendezvous weight for the conversation key, when the caller has them already."""
    if weights is None:
        weights = _weights(blocks.key, candidates)
    return [
        Scores(c.address, *parts)
        for c, parts in zip(
            candidates, _score_parts(candidates, blocks, bucket, config, weights), strict=True
        )
    ]


def _score_parts(
    candidates: Sequence[EngineCandidate],
    blocks: PromptBlocks,
    bucket: str,
    config: PickingConfig,
    weights: Sequence[int],
) -> list[tuple[float, float, float, float, float]]:
    """`score` without the addresses: (prefix, load, affinity, length, total) per candidate.

    The pool's bounds, the same for every candidate, are worked out once:
    - saturated: its batch slots or its KV cache full with what this sidecar alone holds
      on it (batch full: its batch slots alone);
    - crowded, what a cached prefix may pull against (consistent hashing with bounded
      loads): as many requests in flight as ceil(`bound` x the fair share), this one
      counted (an idle pool crowds nobody). A hot prefix spills over instead of piling
      onto one engine;
    - over its bound, what the hashed pulls (affinity, length) may pull against, which save
      nothing on the request itself: this request would take the engine past `load_bound`
      x the pool's mean requests in flight (this one counted), unless it holds no more than
      the least busy engine (an idle or evenly loaded pool binds nobody). Not rounded up as
      crowded is: with a few requests in flight, ceil(1.25 x the fair share) let 2 of 2 or
      3 of 4 new conversations pile onto one of two engines by their hashes."""
    count = len(candidates)
    in_flight = [c.held_sequences for c in candidates]
    held = sum(in_flight)
    most = max(in_flight)
    least = min(in_flight)
    affinity = _rank_scores(weights) if blocks.key else [0.0] * count
    length = _bucket_ranks(bucket, tuple([c.address for c in candidates]))
    load_bound = config.load_bound
    crowded_at = math.ceil(load_bound * (held + 1) / count)
    exact_crowded_at = math.ceil(EXACT_BOUND_FACTOR * load_bound * (held + 1) / count)
    over_at = load_bound * ((held + 1) / count)
    head_tokens = blocks.head_tokens
    total_tokens = blocks.total_tokens
    prefix_weight, load_weight = config.prefix_weight, config.load_weight
    affinity_weight, length_weight = config.affinity_weight, config.length_weight
    scored = []
    for i, candidate in enumerate(candidates):
        load = 1.0 - load_of(candidate, held, count, most)
        in_flight_here = candidate.held_sequences
        sequences, kv_tokens = candidate.sequences, candidate.kv_tokens
        batch_full = bool(sequences and in_flight_here >= sequences)
        full = batch_full or bool(kv_tokens and candidate.held_tokens >= kv_tokens)
        # Its batch already full from this sidecar's own count (a request sent there would
        # queue), or over its bounded share: no pull towards it. A cached prefix (it saves
        # the prefill) may pull up to crowded; the hashed pulls only within the bound,
        # the bucket's included (on two engines with one bucket that pull is a constant
        # tilt to one of them, which tied the load's difference of one request).
        if candidate.exact_prefix:
            # An exact match (the engine's own KV events) pulls until the batch is full or
            # the engine is crowded at EXACT_BOUND_FACTOR x the bound: the held KV tokens
            # count a shared prefix once per request where the engine stores it once
            # (llm-d's case scaled: 16 requests of 7,456 tokens "fill" a 120,000-token
            # engine whose real usage is 0.8-0.9, so at 24 req/s the pull dropped at every
            # pick and the hit rate fell from 0.75 to 0.23), and a prefill known to be
            # saved is worth more load than a guessed one. The load score still weighs
            # against it, and a hot prefix still spills past twice the bounded share.
            held_back = batch_full or in_flight_here >= exact_crowded_at
        else:
            held_back = full or in_flight_here >= crowded_at
        bound = full or (in_flight_here > least and in_flight_here + 1 > over_at)
        # An exact match (the engine's own events) counts the conversation's head too.
        matched = candidate.matched_tokens
        beyond = matched - (0 if candidate.exact_prefix else head_tokens)
        prefix = beyond / total_tokens if beyond > 0 and total_tokens and not held_back else 0.0
        # The conversation's head already sent to this engine (its whole head matched): its
        # cache likely holds it, so the conversation's own pull is a prefill saved and is held
        # back only where a cached prefix is (`held_back`). A new conversation's pull stays
        # within the strict bound. (An identical prompt sent again, a regenerate or a retry,
        # is all head: no prefix pull, and with its first copy still held there the strict
        # bound sent it to the other engine's cold cache.)
        holds_head = 0 < head_tokens <= matched
        pull = 0.0 if (held_back if holds_head else bound) else affinity[i]
        packed = 0.0 if bound else length[i]
        total = (
            prefix_weight * prefix
            + load_weight * load
            + affinity_weight * pull
            + length_weight * packed
        )
        scored.append((prefix, load, pull, packed, total))
    return scored


def pick(
    candidates: Sequence[EngineCandidate],
    blocks: PromptBlocks,
    bucket: str,
    config: PickingConfig,
) -> list[str]:
    """The engines for this request, best first (at most `config.choices`): by total to 9
    decimals, ties to the heavier rendezvous weight."""
    if not candidates:
        return []
    if len(candidates) == 1:
        return [candidates[0].address]
    weights = _weights(blocks.key, candidates)
    totals = [parts[4] for parts in _score_parts(candidates, blocks, bucket, config, weights)]
    # Sorted by the totals themselves where no two are within _APART: their 9-decimal
    # roundings are then as strictly ordered as they are (a rounding moves a total by at
    # most half of 1e-9), so the rounding and the weights decide nothing; otherwise by the
    # rounded totals and the weights. (round(x, 9) costs ~0.3 us a total; a NaN is never
    # apart, and takes the rounded way.)
    if len(totals) == 2:  # the common pool: what the stable sort of two does, without it
        if abs(totals[0] - totals[1]) > _APART:
            order = [1, 0] if totals[1] > totals[0] else [0, 1]
        else:
            ranks = _ranks(totals, weights)
            order = [1, 0] if ranks[1] < ranks[0] else [0, 1]
    else:
        order = sorted(range(len(totals)), key=lambda i: -totals[i])
        if not all(abs(totals[a] - totals[b]) > _APART for a, b in itertools.pairwise(order)):
            order = sorted(range(len(totals)), key=_ranks(totals, weights).__getitem__)
    return [candidates[i].address for i in order[: config.choices]]


# Totals further apart than this round to 9 decimals in their own order (see `pick`).
_APART = 1e-8


def _ranks(totals: Sequence[float], weights: Sequence[int]) -> list[tuple[float, int]]:
    return [(-round(t, 9), -w) for t, w in zip(totals, weights, strict=True)]


def _weights(key: int, candidates: Sequence[EngineCandidate]) -> list[int]:
    """Each candidate's `rendezvous` weight for `key`."""
    return [rendezvous(key, c.address) for c in candidates]
