"""`slogate calibrate`: measure OpenAI-compatible endpoints and write their latency model.

What lives here: the measuring (network round trip from TCP connects, then sequential
streaming requests at empty load: `tiny` ones for the base latency and prompts sized into
each context bucket for the prefill slopes) and the report (a `latency_model` section in the
policy format, a table, the spread between pools). The fitting is pure and lives in
`sim.server.calibration`; `slogate simulate --latency-from POLICY` plays the result.

Every prompt starts with a fresh nonce so no prefix cache can shorten a prefill. TTFT is
the time from sending the request to the first `data:` event. Prompt sizes come from the
server's own usage report when it streams one (stream_options.include_usage), otherwise
from the words sent (about one token per filler word).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import yaml

from policy.domain import ContextBucket, LatencyFit
from policy.quantiles import quantile
from sim.server.calibration import Sample, fit_latency, pool_spread

SPREAD_FLAG = 0.15  # the field flags pools more than 15% apart
_FILLER = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "paper",
    "light",
    "green",
    "house",
    "music",
]


class CalibrationError(Exception):
    pass


@dataclass
class Measurement:
    pool: str
    url: str
    rtt_ms: float = 0.0
    tiny: list[Sample] = field(default_factory=list)
    probes: list[Sample] = field(default_factory=list)
    fit: LatencyFit | None = None


def probe_sizes(buckets: Sequence[ContextBucket], max_context: int) -> list[int]:
    """Two prompt sizes inside each bounded bucket (at ~55% and ~90% of its range) that
    fit under `max_context`."""
    sizes: list[int] = []
    for bucket in buckets:
        if bucket.max_tokens is None:
            continue
        upper = min(bucket.max_tokens, max_context) - 8  # leave room for max_tokens and chat
        low = max(bucket.min_tokens, 256)
        if upper <= low:
            continue
        for share in (0.55, 0.9):
            sizes.append(int(low + (upper - low) * share))
    return sizes


def _prompt(words: int) -> str:
    filler = " ".join(_FILLER[i % len(_FILLER)] for i in range(max(0, words)))
    return f"{secrets.token_hex(8)} {filler}"


async def measure_rtt_ms(url: str, count: int = 20) -> float:
    """Median TCP connect time: the network round trip without any server work."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        _, writer = await asyncio.open_connection(host, port)
        times.append((time.perf_counter() - started) * 1000.0)
        writer.close()
        await writer.wait_closed()
    return statistics.median(times)


async def _ttft(
    session: aiohttp.ClientSession, url: str, model: str, words: int, headers: dict[str, str]
) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(words)}],
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first_ms: float | None = None
    prompt_tokens = words + 1
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as reply:
        if reply.status != 200:
            text = (await reply.text())[:300]
            raise CalibrationError(f"{url} answered {reply.status}: {text}")
        async for raw in reply.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            if first_ms is None:
                first_ms = (time.perf_counter() - started) * 1000.0
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            try:
                usage = json.loads(payload).get("usage")
            except ValueError:
                continue
            if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                prompt_tokens = usage["prompt_tokens"]
    if first_ms is None:
        raise CalibrationError(f"{url} sent no stream events")
    return Sample(prompt_tokens, first_ms)


async def measure(
    pool: str,
    url: str,
    model: str,
    buckets: Sequence[ContextBucket],
    tiny_count: int = 100,
    per_size: int = 20,
    max_context: int = 32_768,
    api_key: str | None = None,
    timeout_s: float = 120.0,
) -> Measurement:
    url = url.rstrip("/").removesuffix("/v1")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CalibrationError(f"{url!r}: expected http(s)://host[:port]")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result = Measurement(pool, url)
    result.rtt_ms = await measure_rtt_ms(url)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # One at a time: an idle engine is the point.
        for _ in range(tiny_count):
            result.tiny.append(await _ttft(session, url, model, 1, headers))
        # How many tokens the server counts per filler word, so that probes land inside
        # the buckets they are meant for (tokenizers differ; a server may only estimate).
        gauge = await _ttft(session, url, model, 1001, headers)
        per_word = max(0.1, (gauge.prompt_tokens - result.tiny[-1].prompt_tokens) / 1000.0)
        for size in probe_sizes(buckets, max_context):
            words = max(1, round(size / per_word))
            for _ in range(per_size):
                result.probes.append(await _ttft(session, url, model, words, headers))
    result.fit = fit_latency(result.tiny, result.probes, result.rtt_ms, buckets)
    return result


def p99_ms(samples: Sequence[Sample]) -> float:
    return quantile((s.ttft_ms for s in samples), 0.99)


def report(measurements: Sequence[Measurement], buckets: Sequence[ContextBucket]) -> str:
    """The policy section (YAML) with the measurements as comments above it."""
    fits = {m.pool: m.fit for m in measurements if m.fit is not None}
    lines = [f"# slogate calibrate, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"]
    for m in measurements:
        lines.append(
            f"# {m.pool} = {m.url}: network RTT {m.rtt_ms:.2f} ms; {len(m.tiny)} tiny requests"
            f" (P99 {p99_ms(m.tiny):.1f} ms); {len(m.probes)} probes"
        )
        for bucket in buckets:
            inside = [s for s in m.probes if bucket.contains(s.prompt_tokens)]
            if inside:
                lines.append(
                    f"#   {bucket.name}: empty-load TTFT P99 {p99_ms(inside):.1f} ms over "
                    f"{len(inside)} probes"
                )
    spread = pool_spread(fits)
    for name, value in spread.items():
        flag = "  <-- pools differ by more than 15%" if value > SPREAD_FLAG else ""
        lines.append(f"# spread across pools, {name}: {value * 100:.1f}%{flag}")
    section = {
        "latency_model": {
            pool: {
                "base_latency_ms": fit.base_latency_ms,
                "prefill_ms_per_1k_tokens": fit.prefill_ms_per_1k_tokens,
                "bucket_slopes": dict(fit.bucket_slopes),
            }
            for pool, fit in fits.items()
        }
    }
    return "\n".join(lines) + "\n" + yaml.safe_dump(section, sort_keys=False)
