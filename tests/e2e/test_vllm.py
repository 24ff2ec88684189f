"""Through the real Envoy and sidecar to a real vLLM (the CPU build, a tiny model made here).

One stack for the module (tests/support/vllm.py): vLLM behind the default pool with a
10,240-token KV cache, 16 batch slots and priority scheduling; the long and fallback pools
simulated. What is checked is what only a real engine can show: its answers, usage and
errors as they really are, its metrics as the breaker reads them, its cache filling up.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policy.loader import load_policy
from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import (
    admin_status,
    recorded_ttft_s,
    settled,
    slogate,
    time_first_output,
    wait_for,
)
from tests.support.vllm import Stream, words
from tooling.stack.local import LocalStack

pytestmark = pytest.mark.vllm


def engine_metrics(stack: LocalStack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return scrape(f"{stack.pool_url('default')}/metrics")


def tenant_tokens(stack: LocalStack, tenant: str) -> float:
    return metric(scrape(stack.metrics_url), "slogate_tenant_tokens_total", tenant=tenant)


def status(stack: LocalStack) -> dict[str, Any]:
    done = slogate(stack, "status", "--json")
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


def outstanding(stack: LocalStack, tenant: str) -> int:
    done = slogate(stack, "keys", "--json", "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    return sum(int(k.get("outstanding", 0)) for k in json.loads(done.stdout)["keys"])


def test_the_ready_line_and_policy_carry_what_vllm_reports(vllm_stack: LocalStack) -> None:
    facts = vllm_stack.engine_facts["default"]
    assert facts.kv_capacity_tokens == 80 * 128 == facts.blocks * facts.block_size
    assert facts.max_model_len == 8192 and "deepseek-v4" in facts.models
    assert "10,240 tokens" in vllm_stack.ready_line()
    assert vllm_stack.sidecar_policy_path is not None
    pool = load_policy(vllm_stack.sidecar_policy_path).pools["default"]
    assert (pool.kv_capacity_tokens, pool.max_num_seqs) == (10_240, 16)


def test_vllm_answers_and_its_usage_settles_the_budget(vllm_stack: LocalStack) -> None:
    stack = vllm_stack
    before, engine_before = settled(stack), engine_metrics(stack)
    charged_before = tenant_tokens(stack, "demo-standard")

    reply = post(stack.url, CHAT, chat_body(words(300, 1), max_tokens=24))
    assert reply.status == 200, reply.body
    assert reply.headers["x-slogate-pool"] == "default"
    answer = reply.json()
    # vLLM's own answer, vLLM-only fields included, passed through untouched.
    assert answer["system_fingerprint"].startswith("vllm-")
    assert "prompt_token_ids" in answer and "kv_transfer_params" in answer
    plain = answer["usage"]

    stream = Stream(
        stack.listen_port,
        chat_body(words(200, 2), max_tokens=16, stream_options={"include_usage": True}),
        "sk-demo-standard",
    )
    events = stream.read_all()
    assert stream.response.status == 200
    usage_events = [e for e in events if e.get("usage")]
    assert len(usage_events) == 1 and usage_events[0]["choices"] == []  # vLLM's final chunk
    streamed = usage_events[0]["usage"]

    after, engine_after = settled(stack), engine_metrics(stack)
    for kind, field, engine_name in (
        ("prompt", "prompt_tokens", "vllm:prompt_tokens_total"),
        ("completion", "completion_tokens", "vllm:generation_tokens_total"),
    ):
        delta = metric(after, "slogate_tokens_total", pool="default", kind=kind) - metric(
            before, "slogate_tokens_total", pool="default", kind=kind
        )
        assert delta == plain[field] + streamed[field], kind
        engine = metric(engine_after, engine_name) - metric(engine_before, engine_name)
        assert delta == engine, kind
    total = plain["total_tokens"] + streamed["total_tokens"]
    assert wait_for(lambda: tenant_tokens(stack, "demo-standard") - charged_before == total)
    assert outstanding(stack, "demo-standard") == 0


def test_a_stream_that_did_not_ask_for_usage_settles_without_seeing_it(
    vllm_stack: LocalStack,
) -> None:
    stack = vllm_stack
    before, engine_before = settled(stack), engine_metrics(stack)
    events = Stream(
        stack.listen_port,
        chat_body(words(100, 3), max_tokens=20, ignore_eos=True),
        "sk-demo-batch",
    ).read_all()
    assert events and not any("usage" in e and e["usage"] for e in events)
    assert not any(e.get("choices") == [] for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    after, engine_after = settled(stack), engine_metrics(stack)
    completion = metric(after, "slogate_tokens_total", kind="completion") - metric(
        before, "slogate_tokens_total", kind="completion"
    )
    generated = metric(engine_after, "vllm:generation_tokens_total") - metric(
        engine_before, "vllm:generation_tokens_total"
    )
    # The usage slogate asked vLLM for (and hid): 20 tokens, though fewer content events
    # may carry text (a token that ends mid-character decodes to "").
    assert completion == generated == 20


# Each API streamed, a prompt long enough that vLLM's prefill takes a while on this CPU.
FIRST_OUTPUT_CASES = {
    "chat": (CHAT, chat_body(words(2500, 71), max_tokens=4)),
    "completions": ("/v1/completions", {"prompt": words(2500, 72), "max_tokens": 4}),
    "responses": ("/v1/responses", {"input": words(2500, 73), "max_output_tokens": 4}),
    "messages": (
        "/v1/messages",
        {"max_tokens": 4, "messages": [{"role": "user", "content": words(2500, 74)}]},
    ),
}


@pytest.mark.parametrize("api", list(FIRST_OUTPUT_CASES))
def test_each_api_s_ttft_is_vllm_s_time_to_its_first_token(
    vllm_stack: LocalStack, api: str
) -> None:
    """What the sidecar records (the breaker's and the controller's TTFT) lies between
    vLLM's own time to the first token (counted from its later arrival) and the client's
    time to the first output event; a Responses stream's first bytes (`response.created`)
    came before both."""
    stack = vllm_stack
    path, body = FIRST_OUTPUT_CASES[api]
    client: list[float | None] = []
    engine: list[float] = []
    ttft = "vllm:time_to_first_token_seconds"

    def send() -> None:
        before = engine_metrics(stack)
        stream = {"model": "deepseek-v4", **body, "ignore_eos": True}
        client.append(time_first_output(stack.listen_port, path, stream, "sk-demo-critical")[0])
        counted = metric(before, f"{ttft}_count")
        assert wait_for(lambda: metric(engine_metrics(stack), f"{ttft}_count") > counted)
        engine.append(metric(engine_metrics(stack), f"{ttft}_sum") - metric(before, f"{ttft}_sum"))

    recorded_s = recorded_ttft_s(stack, send, "slogate_upstream_ttft_seconds", pool="default")
    (client_s,), (engine_s,) = client, engine
    assert client_s is not None
    # Milliseconds both ways: Envoy's timings are whole ms. Measured here (2,500 tokens,
    # vLLM / sidecar / client, s): Responses 0.186 / 0.216 / 0.221, and 0.193 / 0.020 /
    # 0.227 when the sidecar timed the first byte.
    seen = {"vllm": engine_s, "sidecar": recorded_s, "client": client_s}
    assert engine_s - 0.005 <= recorded_s <= client_s + 0.005, seen


def test_slogate_status_reports_what_vllm_metrics_say(vllm_stack: LocalStack) -> None:
    stack = vllm_stack
    prompt = words(600, 4)
    for _ in range(2):  # the second one hits the prefix cache
        assert post(stack.url, CHAT, chat_body(prompt, max_tokens=4)).status == 200

    def matches() -> bool:
        engine = engine_metrics(stack)
        rows = [e for e in status(stack).get("engines", []) if e["pool"] == "default"]
        if len(rows) != 1:
            return False
        row = rows[0]
        hits = metric(engine, "vllm:prefix_cache_hits_total")
        queries = metric(engine, "vllm:prefix_cache_queries_total")
        return (
            row["engine"] == "vllm"
            and row["firstTokens"] == metric(engine, "vllm:time_to_first_token_seconds_count")
            and row.get("running") == metric(engine, "vllm:num_requests_running")
            and row.get("waiting") == metric(engine, "vllm:num_requests_waiting")
            and row.get("kvCacheUsage") == metric(engine, "vllm:kv_cache_usage_perc")
            and hits > 0
            and row.get("prefixCacheHitRate") == pytest.approx(hits / queries)
        )

    # The policy scrapes every second; an idle engine's metrics stay put between reads.
    assert wait_for(matches, timeout_s=15), (status(stack), engine_metrics(stack))


def _engine_row(stack: LocalStack) -> dict[str, Any]:
    """The default pool's engine as `slogate status --json` shows it (from this process)."""
    rows = [e for e in admin_status(stack).get("engines", []) if e["pool"] == "default"]
    return rows[0] if rows else {}


def _long(seed: int, max_tokens: int) -> dict[str, Any]:
    # ignore_eos: the random model would sometimes stop early; these run to their limit
    # (and slogate, seeing it, holds their whole footprint).
    return chat_body(words(2500, seed), max_tokens=max_tokens, ignore_eos=True)


def _envoy_timeouts(stack: LocalStack) -> list[str]:
    """Envoy's non-zero timeout counters: which wait ran out (the sidecar's message timeout,
    ext_proc's `message_timeouts`, or the route's, `upstream_rq_timeout`)."""
    url = f"http://127.0.0.1:{stack.admin_port}/stats?filter=timeout|ext_proc"
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return [line for line in lines if not line.endswith(": 0")]


def _held(stack: LocalStack) -> tuple[float, float]:
    """(counted KV tokens slogate holds on the default pool, its learned footprint ratio)."""
    now = scrape(stack.metrics_url)
    return (
        metric(now, "slogate_kv_in_flight_tokens", pool="default"),
        metric(now, "slogate_kv_footprint_ratio", pool="default"),
    )


def test_kv_admission_fills_the_real_cache_and_learns_its_footprint(
    vllm_stack: LocalStack,
) -> None:
    """Six ~4.6k-token requests (2.5k prompt + 2.1k max_tokens, run to the limit) at once
    against 10,240 tokens: two fit the standard tier's 95%. The rest wait, then are
    refused; vLLM's cache never overflows (no preemption), and the ratio slogate learns
    from vLLM's usage falls from 1.0 toward what vLLM holds (prompts and the tokens so far).
    What slogate holds, what vLLM holds and the breaker's scrape are read as soon as the
    two run, before the refused answers are awaited; the learned ratio after. The two's
    2,100 tokens took 5-6 s here (1.5k-token runs had ended before the checks read them on
    a quieter machine), and the refused answers came up to ~5 s after their 0.5 s wait
    while the two's prefill starved the machine."""
    stack = vllm_stack
    # An empty pool to start from: an earlier request's hold is given back only when its
    # access-log entry arrives (batched), and one still held would leave room for one.
    assert wait_for(lambda: _held(stack)[0] == 0, timeout_s=30), _held(stack)
    assert wait_for(
        lambda: metric(engine_metrics(stack), "vllm:num_requests_running") == 0, timeout_s=30
    )
    preempted = metric(engine_metrics(stack), "vllm:num_preemptions_total")
    prompts_before = metric(engine_metrics(stack), "vllm:prompt_tokens_total")
    streams: list[Stream] = []
    running: list[Stream] = []  # admitted, with their first token
    failed: list[BaseException] = []
    lock = threading.Lock()
    over = threading.Event()

    def send(i: int) -> None:
        try:
            stream = Stream(stack.listen_port, _long(10 + i, 2100), "sk-demo-standard")
            with lock:
                streams.append(stream)
            if stream.response.status == 200 and stream.wait_first_content() is not None:
                with lock:
                    running.append(stream)
        except BaseException as error:  # said by the assertion below, not lost in a thread
            failed.append(error)

    def watch(seen: Callable[[], bool]) -> threading.Event:
        """Reads `seen` over and over in a thread of its own from now until it holds (the
        event is set) or the test is over. vLLM's API server, which serves its /metrics
        and which the breaker scrapes, is starved by its own engine while the two run: a
        read took up to ~4.5 s, and the two generate for 5-6 s; a read already under way
        when they start is the one most likely to come back while they run."""
        held = threading.Event()

        def poll() -> None:
            while not over.is_set():
                with contextlib.suppress(Exception):  # a starved endpoint timed out
                    if seen():
                        held.set()
                        return
                time.sleep(0.05)

        threading.Thread(target=poll, daemon=True).start()
        return held

    # vLLM runs the two, and its usage gauge (it follows its steps) shows their two 2.5k
    # prompts of 10,240, in one reading ...
    running_and_usage = (0.0, 0.0)

    def filled() -> bool:
        nonlocal running_and_usage
        now = engine_metrics(stack)
        reading = (
            metric(now, "vllm:num_requests_running"),
            metric(now, "vllm:kv_cache_usage_perc"),
        )
        # Usage alone says both are in: one prompt is ~0.44 of the cache. (The running
        # gauge beside it once read 0 while usage read both: the two gauges are set at
        # different moments of vLLM's starved API server.)
        if reading[1] >= 0.45:
            running_and_usage = reading
            return True
        return False

    vllm_saw_them = watch(filled)
    # ... and the breaker's scrape saw them (the admin status, within a scrape or two).
    # (Its kvCacheUsage is not asserted: on this machine it read 0.0 beside running 2
    # once; vLLM's own gauge above is the cache's fill.)
    # Seen running, or — vLLM's gauges lag while its own engine starves its API server —
    # by their first tokens in the TTFT histogram the breaker scrapes (a counter: it
    # cannot be missed between two scrapes).
    first_before = float(_engine_row(stack).get("firstTokens", 0.0))

    def breaker_sees_them() -> bool:
        row = _engine_row(stack)
        return row.get("running") == 2 or float(row.get("firstTokens", 0.0)) >= first_before + 2

    breaker_saw_them = watch(breaker_sees_them)
    # What slogate held at its fullest, read from its /metrics over and over: the client's
    # own threads are starved too, and read the two as running after they had ended once.
    most_held = [0.0]

    def held_most() -> bool:
        most_held[0] = max(most_held[0], _held(stack)[0])
        return False  # keep reading until the test is over

    watch(held_most)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: len(running) >= 2 or bool(failed), timeout_s=90), streams
        for t in threads:
            t.join(90)
        # Waited for after the two have ended: a reading already under way while they ran
        # comes back seconds late from vLLM's starved API server.
        was_filled = vllm_saw_them.wait(timeout=15)
        usage = running_and_usage[1]
        seen_running = breaker_saw_them.wait(timeout=20)
        assert not failed, failed
        admitted = [s for s in streams if s.response.status == 200]
        refused = [s for s in streams if s.response.status != 200]
        # Two at once, the others refused — or, rightly, admitted once the two had ended:
        # measured, one body reached the sidecar 5.5 s late (the two's prefill starved the
        # machine), found the pool empty and ran. slogate's fullest hold says two at once.
        statuses = [s.response.status for s in streams]
        assert len(streams) == 6 and len(admitted) >= 2 and len(refused) >= 2, statuses
        counted = most_held[0]
        for s in refused:
            # slogate's own answer, never Envoy's 504: the waits end while vLLM's prefill
            # of the two starves the machine (replies.WAIT_REPLY_MARGIN_MS).
            reason = s.response.getheader("x-slogate-reason")
            assert s.response.status == 503, (s.response.status, reason, s.response.read())
            assert reason in ("queue_timeout", "kv_cache_full")
            assert json.loads(s.response.read())["error"]["code"] == "overloaded"
        assert 2 * 4500 < counted <= 0.95 * 10_240
        assert seen_running, _engine_row(stack)
        if was_filled:
            # What vLLM really holds per counted token while the two run (it grows as
            # they generate; the ratio is judged against it after they may have ended).
            real = usage * 10_240 / counted

            def toward_real() -> bool:
                _, ratio = _held(stack)
                return ratio < 0.99 and abs(ratio - real) < abs(1.0 - real)

            def fell_within_what_they_held() -> bool:
                _, ratio = _held(stack)
                return 2 * 2500 / counted <= ratio < 0.99

            if real < 0.95:
                assert wait_for(toward_real, timeout_s=20), (_held(stack), engine_metrics(stack))
            else:
                # The one reading came back as the two ended (vLLM's starved API server, a
                # clean-clone CI once: usage 0.9+ of what they were counted for): near 1.0 it
                # cannot tell a learned ratio from 1.0. Judged instead: the ratio fell from
                # 1.0, and not below what their two prompts alone held.
                assert wait_for(fell_within_what_they_held, timeout_s=20), (
                    real,
                    _held(stack),
                )
        else:
            # vLLM's API server, starved by its own engine, answered no read of its usage
            # gauge while the two ran (CI, once: not one in 20 s; the breaker's scrapes
            # neither, so there was no reading to learn a footprint from, and none is
            # judged). That both ran is vLLM's prompt counter, read after; that they held
            # the cache at once is slogate's fullest hold, asserted above.
            ran = metric(engine_metrics(stack), "vllm:prompt_tokens_total") - prompts_before
            assert ran >= 2 * 2000, (ran, running_and_usage)
            print(f"vLLM's usage gauge never read the fill; prompt tokens run: {ran:.0f}")
        assert metric(engine_metrics(stack), "vllm:num_preemptions_total") == preempted
    finally:
        over.set()
        for t in threads:
            t.join(90)
        for s in streams:
            s.close()  # the clients hang up: vLLM aborts what still runs, slogate releases
    assert wait_for(
        lambda: metric(engine_metrics(stack), "vllm:num_requests_running") == 0, timeout_s=30
    )
    assert wait_for(lambda: _held(stack)[0] == 0, timeout_s=30), _held(stack)


def test_the_tiers_priority_reaches_vllm(vllm_stack: LocalStack) -> None:
    """vLLM runs lower priorities first. Load sent to the engine directly at priority 1 (a
    standard request's) fills its cache and queues; a sheddable request (2) and, just after
    it, a critical one (0) come through slogate: the critical one gets its first token
    first. The load bypasses slogate because slogate's own admission never lets the
    engine queue."""
    stack = vllm_stack
    engine_port = stack.pool_ports["default"]
    load = []
    for i in range(5):
        body = {**_long(40 + i, 2000), "priority": 1}
        load.append(Stream(engine_port, body, None))
    try:
        assert wait_for(
            lambda: metric(engine_metrics(stack), "vllm:num_requests_waiting") >= 2, timeout_s=30
        ), engine_metrics(stack)
        small = chat_body(words(50, 5), max_tokens=8)
        sheddable = Stream(stack.listen_port, small, "sk-demo-batch")
        time.sleep(0.3)
        critical = Stream(
            stack.listen_port, chat_body(words(50, 6), max_tokens=8), "sk-demo-critical"
        )
        critical_s = critical.wait_first_content()
        if critical_s is None:  # say what came back instead (it flaked: no event at all)
            answer = critical.response
            seen = {
                "status": answer.status,
                "reason": answer.getheader("x-slogate-reason"),
                "pool": answer.getheader("x-slogate-pool"),
                "after_s": round(time.monotonic() - critical.started, 2),
                "body": (critical._buffer + answer.read())[:500],
                "engine": _engine_row(stack),
                "held": _held(stack),
                "envoy": _envoy_timeouts(stack),
            }
            raise AssertionError(f"the critical request got no content: {seen}")
        # The sheddable one is still behind the load when the critical one has its token.
        assert sheddable.first_content_s is None
        sheddable.close()
        critical.close()
    finally:
        for s in load:
            s.close()
    assert wait_for(
        lambda: metric(engine_metrics(stack), "vllm:num_requests_running") == 0, timeout_s=30
    )


@pytest.mark.parametrize(
    ("body", "status_code", "error_type"),
    [
        # 100 + 8,200 tokens: inside slogate's limits, past the engine's 8,192.
        (chat_body(words(100, 7), max_tokens=8200), 400, "BadRequestError"),
        (chat_body("hello", model="no-such-model"), 404, "NotFoundError"),
    ],
    ids=["over max model len", "unknown model"],
)
def test_vllm_errors_reach_the_client_and_refund(
    vllm_stack: LocalStack, body: dict[str, Any], status_code: int, error_type: str
) -> None:
    stack = vllm_stack
    charged = tenant_tokens(stack, "demo-standard")
    before = settled(stack)
    reply = post(stack.url, CHAT, body)
    assert reply.status == status_code, reply.body
    error = reply.json()["error"]
    assert error["type"] == error_type and error["message"], error
    assert reply.headers["content-type"].startswith("application/json")
    after = settled(stack)
    assert metric(after, "slogate_access_log_entries_total", kind="routed") > metric(
        before, "slogate_access_log_entries_total", kind="routed"
    )
    assert tenant_tokens(stack, "demo-standard") == charged  # refunded: nothing charged
    assert outstanding(stack, "demo-standard") == 0


def test_calibrating_vllm_gives_a_model_the_simulator_plays(
    vllm_stack: LocalStack, tmp_path: Path
) -> None:
    from sim.server.calibration import latency_config

    out = tmp_path / "measured.yaml"
    done = subprocess.run(
        [
            sys.executable, "-m", "tooling.cli.main", "calibrate",
            "--url", f"default={vllm_stack.pool_url('default')}",
            "--model", "deepseek-v4", "--requests", "5", "--per-size", "2",
            "--max-context", "4096", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    measured = load_policy(out)
    fit = measured.latency_models["default"]
    assert 0 < fit.base_latency_ms < 1000 and fit.prefill_ms_per_1k_tokens > 0
    played = latency_config(fit, measured.buckets)
    assert played.base_latency_ms == fit.base_latency_ms
    sim = subprocess.run(
        [
            sys.executable, "-m", "tooling.cli.main", "simulate", "--workload", "burst-10x",
            "--latency-from", str(out), "--duration-s", "10", "--out-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr[-3000:]
    report = json.loads((tmp_path / "simulate-burst-10x.json").read_text())
    critical = report["static_best"]["report"]["tiers"]["critical"]
    # Played on the measured engine: no first token sooner than its empty-load TTFT.
    assert critical["p99_ttft_s"] >= fit.base_latency_ms / 1000
