"""Simulated arrivals: who sends what, when, and how fast, reproducible for a seed.

What lives here: `Arrival` (one request as a workload describes it), `poisson_arrivals`
(a stream of them, with a rate curve), `quantile_draw`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policy.domain import ApiKey


@dataclass(frozen=True, slots=True)
class RecordedAnswer:
    """What the real engine did with a recorded request (sim.fleet.replay): seconds from its
    arrival to its first byte and to its end, and the status Envoy logged."""

    duration_s: float
    ttft_s: float | None
    status: int


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    key: ApiKey
    prompt_tokens: int  # what the engine holds and reports
    max_tokens: int
    stream: bool = True  # False: a JSON answer, judged by its whole time (breaker.objectives)
    crafted: bool = False  # random letters instead of words (sim.fleet.prompts)
    # The size of the texts the sidecar's counter is given (None: the prompt's own). Set
    # lower than prompt_tokens, it models a count that is off, e.g. the fitted estimate
    # that random letters fooled tenfold: the engine still holds prompt_tokens.
    counted_prompt_tokens: int | None = None
    # A chat of its own texts (sim.fleet.conversations: history resent, a shared system prompt),
    # each text's token count, and how many leading texts are the conversation's head;
    # empty: texts of `counted` tokens from the prompt library, none shared.
    texts: tuple[str, ...] = ()
    text_tokens: tuple[int, ...] = ()
    conversation_texts: int = 1
    # Each text's role in the chat (system, user, assistant); empty: each a user message.
    roles: tuple[str, ...] = ()
    # The output tokens it will generate (a replayed record's real usage); None: drawn
    # from the latency model's output lengths.
    output_tokens: int | None = None
    # A replayed record's real timing and status: admitted, it ends when the real one did
    # (None: the simulated engine's latency decides).
    answer: RecordedAnswer | None = None

    def chat_roles(self, texts: int) -> tuple[str, ...]:
        """The roles of the request's `texts` messages."""
        return self.roles if len(self.roles) == texts else ("user",) * texts

    @property
    def counted(self) -> int:
        return (
            self.prompt_tokens if self.counted_prompt_tokens is None else self.counted_prompt_tokens
        )


def poisson_arrivals(
    key: ApiKey,
    rate_per_s: float,
    start_s: float,
    end_s: float,
    prompt_tokens: Sequence[int],
    max_tokens: int,
    seed: int,
    shape: Sequence[tuple[float, float]] = (),
    stream_share: float = 1.0,
    crafted: bool = False,
    output_tokens: Sequence[int] = (),
) -> list[Arrival]:
    """Poisson arrivals with uniformly drawn prompt lengths, reproducible for a seed.

    `shape`: (time, factor) points; the rate at time t is rate_per_s x the factor linearly
    interpolated between them (a daily curve, a ramp). Drawn by thinning: candidates at the
    peak rate, each kept with probability factor / peak. `stream_share`: the fraction of
    requests that stream (most OpenAI clients do not); drawn apart, so the times and sizes
    stay those of the same seed at any share. `crafted`: random-letter prompts.

    `prompt_tokens`: [low, high], drawn uniformly; or a quantile table of more points at
    evenly spaced probabilities (0, 1/(n-1), ... 1), drawn by inverse CDF, linear between
    points (an empirical distribution: `slogate workload fit`). `output_tokens`: such a
    table for the tokens each request generates (drawn apart, like the streamed share);
    empty: the latency model draws them.
    """
    rng = np.random.default_rng(seed)
    streams = np.random.default_rng(seed + 7_919)
    times = [float(t) for t, _ in shape]
    factors = [float(f) for _, f in shape]
    peak = max(factors, default=1.0)
    if peak <= 0 or rate_per_s <= 0:
        return []
    outputs = np.random.default_rng(seed + 15_485_863)
    arrivals: list[Arrival] = []
    now_s = start_s
    while True:
        now_s += float(rng.exponential(1.0 / (rate_per_s * peak)))
        if now_s >= end_s:
            return arrivals
        if len(prompt_tokens) == 2:
            prompt = int(rng.integers(prompt_tokens[0], prompt_tokens[1] + 1))
        else:
            prompt = quantile_draw(prompt_tokens, float(rng.random()))
        if shape and rng.random() * peak > float(np.interp(now_s, times, factors)):
            continue
        stream = stream_share >= 1.0 or float(streams.random()) < stream_share
        output = quantile_draw(output_tokens, float(outputs.random())) if output_tokens else None
        arrivals.append(
            Arrival(
                now_s, key, prompt, max_tokens, stream=stream, crafted=crafted, output_tokens=output
            )
        )


def quantile_draw(table: Sequence[int], u: float) -> int:
    """The value at probability `u` of a quantile table (points at evenly spaced
    probabilities 0 ... 1, linear between them)."""
    points = np.linspace(0.0, 1.0, len(table))
    return round(float(np.interp(u, points, [float(v) for v in table])))


def own_draws(seed: int, arrival: Arrival, *stream: int) -> np.random.Generator:
    """A request's own random generator, seeded by the arrival itself (and `stream`: which
    draws), so the same request draws the same in runs that differ only in other tenants'
    traffic."""
    return np.random.default_rng([seed, round(arrival.at_s * 1e6), arrival.prompt_tokens, *stream])
