"""A pool of two engines through the real Envoy: an engine killed, hung or failing is that
engine's problem, not the pool's; a draining engine gets nothing new; a picked engine that
is gone is retried on the other; picking is off where an endpoint picker of the
operator's picks.

The stack runs the example policy (the default pool: two simulated engines) with a breaker
that moves in seconds, so a level the pool must not reach would be reached within a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import (
    drive_until,
    engine_fault,
    example_policy,
    level,
    slogate,
    start_stack,
    wait_for,
    write_policy,
)
from tooling.stack.local import LocalStack

FAST_BREAKER = {
    "window_s": 20.0,
    "min_samples": 10,
    "evaluate_interval_s": 0.5,
    "thresholds": {"enter_hold_s": [2.0, 2.0, 2.0], "cooldown_s": 5.0, "probe_hold_s": 2.0},
}


def engines_policy(tmp: Path, picker: str = "slogate", kv_capacity_tokens: int = 0) -> Path:
    """`kv_capacity_tokens`: the default pool's (its two engines get half each)."""
    raw = example_policy()
    raw["breaker"] = FAST_BREAKER
    raw["pools"]["default"]["picker"] = picker
    if kv_capacity_tokens:
        raw["pools"]["default"]["kv_capacity_tokens"] = kv_capacity_tokens
    unlimited = {"requests_per_minute": 100_000, "concurrent_requests": 1_000}
    raw["tiers"] = {tier: {**limits, **unlimited} for tier, limits in raw["tiers"].items()}
    return write_policy(tmp / "policy.yaml", raw)


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("engines")
    running = start_stack(tmp, engines_policy(tmp), exact_tokenizer=False)
    yield running
    running.stop()


@pytest.fixture
def pair(shared_pair: LocalStack) -> Iterator[LocalStack]:
    """The module's stack as each test must find it — both engines serving and every
    breaker at L0 — and put back after it, passed or failed: one test's failure stays its
    own (issue 37: a restarted engine ejected in the first test failed the next five)."""
    steady(shared_pair)
    yield shared_pair
    put_back(shared_pair)


def steady(stack: LocalStack, timeout_s: float = 60.0) -> None:
    """Wait until both engines serve, then drive light traffic until the breakers' window
    holds no failed answer and they are at L0 (the fast breaker leaves a level in
    `cooldown_s` once the slow answers of a test left the window). A test's 5xx stay in
    the 20 s window after it, and as its older good answers leave the window first, the
    error rate they make climbs and trips L2 (errors) in the next test (seen beside a busy
    loop: 13 s after the failing-engine test, in the drain test; both engines had been out
    lately, so the rule that leaves out the answers of an engine back from the dead did
    not apply — on purpose: a whole pool failing still trips its breaker). The traffic
    makes the rate a number (under `min_samples` answers it is NaN, and old errors would
    count once the next test's answers are added)."""

    def serving() -> bool:
        states = engine_states(stack)
        return len(states) == 2 and set(states.values()) == {"serving"}

    def settled_for_a_window() -> bool:
        # No engine out within the breaker's window: while one was out lately and another
        # goes out, the rule that leaves out the answers of an engine back from the dead
        # stands aside (every engine out lately), and the first one's old failures count
        # again (a clean clone's run: the killed-engine test's errors tripped L2 in the
        # hung-engine test, 18 s after the kill).
        return time.time() - last_engine_change(stack) > FAST_BREAKER["window_s"] + 1.0

    def calm() -> bool:
        return (
            error_rates(stack) == [0.0, 0.0] and level(stack) == 0 and level(stack, "global") == 0
        )

    if not (
        wait_for(serving, timeout_s)
        and wait_for(settled_for_a_window, timeout_s)
        and drive_until(stack, calm, "sk-demo-critical", timeout_s)
    ):
        pytest.fail(
            f"the shared stack is not steady after {timeout_s:.0f} s: engines "
            f"{engine_states(stack)}, breaker default L{level(stack):.0f}, "
            f"global L{level(stack, 'global'):.0f}, error rates (default, global) "
            f"{error_rates(stack)}"
        )


def last_engine_change(stack: LocalStack) -> float:
    """When (unix seconds) the sidecar last logged an engine of the default pool changing
    state (dead, ejected, back); 0 if never. Its log is the one place that says when."""
    assert stack.sidecar is not None
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in stack.sidecar.log_text().splitlines()
        if "slogate.engines:" in line and "pool default" in line and line[:2] == "20"
    ]
    return max(stamps, default=0.0)


def error_rates(stack: LocalStack) -> list[float]:
    """The error rate the default pool's and the global breaker last judged (NaN: fewer
    answers in the window than `min_samples`)."""
    samples = scrape(stack.metrics_url)
    return [
        metric(samples, "slogate_breaker_signal", pool=pool, signal="error_rate")
        for pool in ("default", "global")
    ]


def put_back(stack: LocalStack) -> None:
    """Whatever a test did to the engines, undone: a stopped one continued, faults
    cleared, drains undone, dead ones started again."""
    for proc in stack.engine_procs["default"]:
        if proc.running() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGCONT)
    for url in stack.engine_urls("default"):
        with contextlib.suppress(OSError):  # not running: started again below
            engine_fault(url)
    for address, state in engine_states(stack).items():
        if state == "draining":
            slogate(stack, "drain", "--engine", address, "--undo")
    back_to_two(stack)


@dataclass
class Load:
    """Steady critical and standard chats from a few threads, each answer timed."""

    stack: LocalStack
    threads: int = 4
    answers: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def _run(self, index: int) -> None:
        key = "sk-demo-critical" if index % 2 else "sk-demo-standard"
        turn = 0
        while not self._stop.is_set():
            turn += 1
            body = chat_body(f"load {index} turn {turn}", max_tokens=8)
            try:
                status = post(self.stack.url, CHAT, body, key=key, timeout_s=10).status
            except OSError:
                status = 0  # no answer in time (a request on a hung engine)
            self.answers.append((time.monotonic(), status))
            time.sleep(0.02)  # ~150 requests a second in all: the machine has two cores

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(15)

    def answered_since(self, since: float, count: int, timeout_s: float = 30.0) -> None:
        """Wait until `count` answers came after `since`: a share needs that many to mean
        something, and a loaded machine takes longer than any fixed sleep to give them."""
        assert wait_for(lambda: sum(1 for at, _ in self.answers if at >= since) >= count,
                        timeout_s), f"fewer than {count} answers in {timeout_s:.0f} s"  # fmt: skip

    def served_share(self, since: float, until: float = float("inf")) -> tuple[float, int]:
        window = [status for at, status in self.answers if since <= at <= until]
        return sum(1 for s in window if s == 200) / max(1, len(window)), len(window)


def engine_states(stack: LocalStack, pool: str = "default") -> dict[str, str]:
    samples = scrape(stack.metrics_url)
    return {
        dict(labels)["engine"]: dict(labels)["state"]
        for (name, labels), value in samples.items()
        if name == "slogate_engine_state" and dict(labels)["pool"] == pool and value == 1.0
    }


def picked(stack: LocalStack, address: str) -> float:
    return metric(scrape(stack.metrics_url), "slogate_engine_picked_total", engine=address)


def may_hold(stack: LocalStack) -> str:
    status = slogate(stack, "status").stdout
    row = next(line for line in status.splitlines() if line.startswith("default ") and "/" in line)
    return row.split()[3]  # "KV tokens held / may hold": the capacity after the slash


def addresses(stack: LocalStack) -> list[str]:
    return [f"127.0.0.1:{port}" for port in stack.engine_ports["default"]]


def back_to_two(stack: LocalStack) -> None:
    for index, proc in enumerate(stack.engine_procs["default"]):
        if not proc.running():
            stack.restart_engine("default", index)
    assert wait_for(lambda: set(engine_states(stack).values()) == {"serving"}, 15)


def test_a_killed_engine_is_out_within_seconds_and_the_pool_serves_on(pair: LocalStack) -> None:
    victim, survivor = addresses(pair)
    assert may_hold(pair) == "1048576"
    with Load(pair) as load:
        time.sleep(2.0)
        os.kill(pair.engine_procs["default"][0].pid or 0, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: engine_states(pair).get(victim) == "dead", 10)
        out_s = time.monotonic() - killed
        time.sleep(6.0)  # long enough for the fast breaker to move, were it to
        load.answered_since(killed + out_s + 0.5, 51)
        share, count = load.served_share(killed + out_s + 0.5)
        pool_level = level(pair)
    assert out_s < 5.0
    assert count > 50 and share >= 0.99, (share, count)
    assert pool_level <= 1  # one dead engine of two is not the pool failing
    assert engine_states(pair)[survivor] == "serving"
    assert may_hold(pair) == "524288"  # its room left the pool's admission
    pair.restart_engine("default", 0)
    assert wait_for(lambda: engine_states(pair).get(victim) == "serving", 15)
    assert may_hold(pair) == "1048576"  # and came back with it
    before = picked(pair, victim)
    for turn in range(20):
        post(pair.url, CHAT, chat_body(f"after {turn}", max_tokens=4), key="sk-demo-standard")
    assert picked(pair, victim) > before  # it gets requests again


def test_a_hung_engine_is_out_on_its_probes_timing_out(pair: LocalStack) -> None:
    victim = addresses(pair)[1]
    proc = pair.engine_procs["default"][1]
    with Load(pair) as load:
        time.sleep(1.0)
        os.kill(proc.pid or 0, signal.SIGSTOP)  # accepts connections, never answers
        stopped = time.monotonic()
        try:
            assert wait_for(lambda: engine_states(pair).get(victim) == "dead", 10)
            out_s = time.monotonic() - stopped
            time.sleep(4.0)
            load.answered_since(stopped + out_s + 1.0, 31)
            share, count = load.served_share(stopped + out_s + 1.0)
            pool_level = level(pair)
        finally:
            os.kill(proc.pid or 0, signal.SIGCONT)
    assert out_s < 6.0
    assert count > 30 and share >= 0.99, (share, count)
    assert pool_level <= 1
    assert wait_for(lambda: engine_states(pair).get(victim) == "serving", 15)


def test_an_engine_failing_its_requests_is_ejected_on_its_answers(pair: LocalStack) -> None:
    victim = addresses(pair)[0]
    url = f"http://{victim}"
    with Load(pair) as load:
        time.sleep(1.0)
        engine_fault(url, error_rate=1.0, error_status=500, duration_s=8.0)
        failing = time.monotonic()
        assert wait_for(lambda: engine_states(pair).get(victim) == "dead", 10)
        out_s = time.monotonic() - failing
        time.sleep(4.0)
        load.answered_since(failing + out_s + 0.5, 31)
        share, count = load.served_share(failing + out_s + 0.5)
        pool_level = level(pair)
    engine_fault(url)  # cleared
    assert out_s < 5.0
    assert count > 30 and share >= 0.99, (share, count)
    assert pool_level <= 1  # its few 500s before the ejection are left out of the pool's rate
    failed = metric(scrape(pair.metrics_url), "slogate_engine_answers_total", engine=victim,
                    outcome="failed")  # fmt: skip
    assert 3 <= failed <= 12
    back_to_two(pair)


def test_a_draining_engine_gets_nothing_new(pair: LocalStack) -> None:
    drained, other = addresses(pair)
    result = slogate(pair, "drain", "--engine", drained)
    assert result.returncode == 0 and "draining" in result.stdout, result.stderr
    before = picked(pair, drained), picked(pair, other)
    for turn in range(20):
        reply = post(pair.url, CHAT, chat_body(f"drain {turn}", max_tokens=4), key="sk-demo-batch")
        assert reply.status == 200
    assert picked(pair, drained) == before[0]
    assert picked(pair, other) == before[1] + 20
    assert may_hold(pair) == "524288"
    assert slogate(pair, "drain", "--engine", drained, "--undo").returncode == 0
    assert engine_states(pair)[drained] == "serving"
    missing = slogate(pair, "drain", "--engine", "10.9.9.9:1")
    assert missing.returncode == 2 and "NOT_FOUND" in missing.stderr


def test_a_picked_engine_that_is_gone_is_retried_on_the_other(pair: LocalStack) -> None:
    """Killed and asked at once, before any probe can tell: Envoy's connection is refused
    and its one retry goes to the second engine slogate named. A request Envoy had already
    written to a kept-alive connection of the dead engine is not retried (Envoy cannot tell
    it from one the engine started): at most one per such connection fails."""
    victim = addresses(pair)[1]
    os.kill(pair.engine_procs["default"][1].pid or 0, signal.SIGKILL)
    replies = [
        post(pair.url, CHAT, chat_body(f"gone {turn}", max_tokens=4), key="sk-demo-critical")
        for turn in range(12)
    ]
    failed = [r for r in replies if r.status != 200]
    assert len(failed) <= 2, [(r.status, r.body[:300]) for r in failed]
    assert all(b"connection_termination" in r.body for r in failed), failed
    stats = scrape(f"http://127.0.0.1:{pair.admin_port}/stats/prometheus")
    name = "envoy_cluster_upstream_rq_retry_success_total"
    assert metric(stats, name, envoy_cluster_name="default") >= 1
    assert wait_for(lambda: engine_states(pair).get(victim) == "dead", 10)
    back_to_two(pair)


def test_a_whole_pool_failing_still_trips_its_breaker(pair: LocalStack) -> None:
    for proc in pair.engine_procs["default"]:
        os.kill(proc.pid or 0, signal.SIGKILL)
    try:
        assert wait_for(lambda: level(pair) == 3, 20)
        # Critical requests go to the fallback pool, the others are refused at once.
        reply = post(pair.url, CHAT, chat_body("any", max_tokens=4), key="sk-demo-critical")
        assert reply.status == 200 and reply.headers["x-slogate-pool"] == "fallback"
    finally:
        back_to_two(pair)


def test_an_external_picker_gets_the_objective_and_slogate_names_no_engine(
    tmp_path: Path,
) -> None:
    stack = start_stack(tmp_path, engines_policy(tmp_path, "external"), exact_tokenizer=False)
    try:
        for turn in range(10):
            reply = post(
                stack.url, CHAT, chat_body(f"ext {turn}", max_tokens=4), key="sk-demo-batch"
            )
            assert reply.status == 200
            saw = json.loads(reply.headers["x-sim-saw-headers"])
            assert saw["x-gateway-inference-objective"] == "slogate-sheddable"

        def answers() -> list[float]:
            samples = scrape(stack.metrics_url)
            return [
                metric(samples, "slogate_engine_answers_total", engine=address, outcome="ok")
                for address in addresses(stack)
            ]

        assert wait_for(lambda: sum(answers()) == 10)  # the access log is batched
        assert answers() == [5, 5]  # Envoy's round robin
        assert metric(scrape(stack.metrics_url), "slogate_engine_picked_total") == 0
    finally:
        stack.stop()


def test_a_conversation_stays_on_one_engine_through_either_replica(tmp_path: Path) -> None:
    """Two Envoy + sidecar replicas, each with its own prefix index: the turns of each chat
    alternate between them and still land on one engine (rendezvous on the conversation's
    head), while different chats spread over both engines."""
    stack = start_stack(tmp_path, engines_policy(tmp_path), replicas=2)
    engines = addresses(stack)

    def served() -> dict[str, float]:
        totals = dict.fromkeys(engines, 0.0)
        for replica in stack.fleet:
            samples = scrape(replica.metrics_url)
            for address in engines:
                totals[address] += metric(
                    samples, "slogate_engine_answers_total", engine=address, pool="default"
                )
        return totals

    try:
        homes: list[set[str]] = []
        sent = 0
        for chat in range(16):
            history = [{"role": "system", "content": "You answer briefly. " * 30}]
            used: set[str] = set()
            for turn in range(3):
                history.append({"role": "user", "content": f"chat {chat} question {turn} " * 8})
                before = served()
                replica = stack.fleet[(chat + turn) % 2]
                body = {"model": "deepseek-v4", "messages": history, "max_tokens": 8}
                reply = post(replica.url, CHAT, body, key="sk-demo-standard")
                assert reply.status == 200
                sent += 1
                assert wait_for(lambda n=sent: sum(served().values()) == n)
                after = served()
                used |= {a for a in engines if after[a] > before[a]}
                answer = reply.json()["choices"][0]["message"]["content"]
                history.append({"role": "assistant", "content": answer})
            homes.append(used)
        assert all(len(used) == 1 for used in homes), homes
        assert {a for used in homes for a in used} == set(engines)
    finally:
        stack.stop()


def test_a_request_larger_than_every_engines_cache_is_refused_not_sent(tmp_path: Path) -> None:
    """Two simulated engines of 8,000 KV tokens each: the pool holds 16,000, but a request
    whose footprint is ~11,000 (a ~6k-token context, its bucket's KV weight 1.8) fits
    neither; a 400 in OpenAI's shape that says why, nothing held; a smaller one is served."""
    stack = start_stack(tmp_path, engines_policy(tmp_path, kv_capacity_tokens=16_000))
    try:
        too_big = post(stack.url, CHAT, chat_body("hello", max_tokens=6_000))
        assert too_big.status == 400, too_big.body
        error = too_big.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert "the largest: 8000 tokens" in error["message"]
        samples = scrape(stack.metrics_url)
        assert metric(samples, "slogate_engine_picked_total") == 0
        assert (
            metric(samples, "slogate_rejections_total", reason="engine_kv_exceeded", status="400")
            == 1
        )
        assert post(stack.url, CHAT, chat_body("hello", max_tokens=3_000)).status == 200
    finally:
        stack.stop()
