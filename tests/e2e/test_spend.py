"""A tenant's monthly spend budget through the real stack (Envoy, the sidecar, a simulated
pool): warnings at 80% and 100% on admitted responses, a stream that runs the month out
mid-way finishes and is settled on its real usage (past the limit), and the next request
gets 429 insufficient_quota naming the tenant and the window, with Retry-After until the
month ends."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from policy.schema import BudgetStoreKind
from tests.support.http import CHAT, Reply, chat_body, metric, post
from tests.support.stack import example_policy, settled, slogate, start_stack, write_policy
from tooling.stack.local import LocalStack

MONTH = 2000.0  # token-equivalents: prompt x 1, cached prompt x 0, completion x 2
PROMPT = "hi " * 200  # long enough for the engine's prefix cache to serve it again
WIDE_OPEN = {"requests_per_minute": 10_000, "tokens_per_minute": 10**9, "tokens_per_hour": 10**9}


@pytest.fixture(scope="module")
def spend_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    work = tmp_path_factory.mktemp("spend")
    raw = example_policy()
    raw["tenants"] = {
        "defaults": {},  # the demo keys' tenants: as before, no budget
        "prices": {"tokens": {"prompt": 1, "cached_prompt": 0, "completion": 2}},
        "classes": {"metered": {"tier": "critical", "limits": WIDE_OPEN}},
        "list": {
            "frugal": {"limits": WIDE_OPEN, "spend": {"per_month": MONTH}},
            "tally": {"class": "metered", "spend": {"per_day": 100_000, "per_month": 1e6}},
        },
    }
    raw["keys"] += [
        {"key": "sk-frugal", "tenant": "frugal"},
        {"key": "sk-tally", "tenant": "tally"},
    ]
    policy = work / "policy.yaml"
    write_policy(policy, raw)
    stack = start_stack(work, policy)
    yield stack
    stack.stop()


def stream(stack: LocalStack, body: dict[str, Any]) -> tuple[int, dict[str, str], list[str]]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=60)
    headers = {"authorization": "Bearer sk-frugal", "content-type": "application/json"}
    conn.request("POST", CHAT, body=json.dumps(body).encode(), headers=headers)
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.startswith("data: ")]
    return response.status, {k.lower(): v for k, v in response.getheaders()}, events


def cost(usage: dict[str, Any]) -> float:
    """What the engine's usage costs at the test's prices; the cached part is free."""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return usage["prompt_tokens"] - cached + 2 * usage["completion_tokens"]


def used_ratio(stack: LocalStack) -> float:
    samples = settled(stack)
    return metric(samples, "slogate_tenant_spend_used_ratio", tenant="frugal", window="month")


def test_a_month_running_out_mid_stream_settles_it_and_refuses_the_next(
    spend_stack: LocalStack,
) -> None:
    stack, spent, cached = spend_stack, 0.0, 0
    # ~3% of the month: no warning.
    first = post(
        stack.url, CHAT, chat_body(PROMPT, max_tokens=10, ignore_eos=True), key="sk-frugal"
    )
    assert first.status == 200, first.body
    assert "x-slogate-spend-warning" not in first.headers
    usage = first.json()["usage"]
    spent += cost(usage)
    cached += usage["prompt_tokens_details"]["cached_tokens"]
    assert used_ratio(stack) == pytest.approx(spent / MONTH)
    # Spent + this request's largest cost (its 400 tokens at 2) pass 80%: warned.
    second = post(
        stack.url, CHAT, chat_body(PROMPT, max_tokens=700, ignore_eos=True), key="sk-frugal"
    )
    assert second.status == 200, second.body
    assert second.headers["x-slogate-spend-warning"] == "month=80%"
    usage = second.json()["usage"]
    spent += cost(usage)
    cached += usage["prompt_tokens_details"]["cached_tokens"]
    assert used_ratio(stack) == pytest.approx(spent / MONTH) and 0.8 <= spent / MONTH < 1.0
    # Still under the limit: admitted, warned it may run the month out, and not cut.
    body = chat_body(
        PROMPT, max_tokens=300, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    status, headers, events = stream(stack, body)
    assert status == 200 and headers["x-slogate-spend-warning"] == "month=100%"
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 300  # every token it asked for
    spent += cost(usage)
    cached += usage["prompt_tokens_details"]["cached_tokens"]
    assert spent > MONTH
    assert cached > 0  # the engine served prompts from its cache: they were priced at 0
    # Settled on its real usage, past the limit.
    assert used_ratio(stack) == pytest.approx(spent / MONTH)
    refused = post(stack.url, CHAT, chat_body("hi"), key="sk-frugal")
    refused_s = time.time()
    assert refused.status == 429, refused.body
    error = refused.json()["error"]
    assert error["type"] == error["code"] == "insufficient_quota"
    now = dt.datetime.now(dt.UTC)
    month_end = dt.datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=dt.UTC)
    assert "'frugal'" in error["message"] and "monthly spend budget" in error["message"]
    assert f"resets at {month_end:%Y-%m-%dT%H:%M:%SZ}" in error["message"]
    assert refused.headers["x-slogate-reason"] == "spend_exhausted"
    assert abs(int(refused.headers["retry-after"]) - (month_end.timestamp() - refused_s)) < 5
    # Other tenants are untouched; warnings were counted once each.
    assert post(stack.url, CHAT, chat_body("hi")).status == 200
    samples = settled(stack)
    for threshold in ("0.8", "1"):
        warned = metric(
            samples, "slogate_tenant_spend_warnings_total", tenant="frugal", threshold=threshold
        )
        assert warned == 1, threshold


def test_slogate_tenants_shows_what_each_has_spent(spend_stack: LocalStack) -> None:
    stack = spend_stack
    reply = post(stack.url, CHAT, chat_body(PROMPT, max_tokens=50, ignore_eos=True), key="sk-tally")
    assert reply.status == 200, reply.body
    spent = cost(reply.json()["usage"])
    settled(stack)
    shown = slogate(stack, "tenants", "tally", "--json")
    assert shown.returncode == 0, shown.stderr
    (tally,) = json.loads(shown.stdout)["tenants"]
    assert (tally["tenantClass"], tally["tier"], tally["unit"]) == ("metered", "critical", "tokens")
    windows = {w["window"]: w for w in tally["windows"]}
    assert windows["day"]["used"] == pytest.approx(spent) and windows["day"]["limit"] == 100_000
    assert windows["month"]["used"] == pytest.approx(spent)
    table = slogate(stack, "tenants")
    assert table.returncode == 0, table.stderr
    lines = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert set(lines) >= {"frugal", "tally"}
    assert "metered" in lines["tally"] and "/100k (" in lines["tally"]
    unknown = slogate(stack, "tenants", "nobody-at-all")
    assert unknown.returncode == 0  # `defaults` covers every tenant: no budget, no class
    assert "nobody-at-all" in unknown.stdout


def test_two_replicas_sharing_redis_charge_one_budget(tmp_path: Path) -> None:
    """Two Envoy + sidecar pairs on one Redis, a client on each charging one tenant at once:
    they stop at the one day's budget (not at a budget each), passing it by less than one
    request's cost, and both then refuse."""
    raw = example_policy()
    raw["tenants"] = {
        "defaults": {},
        "list": {"shared": {"limits": WIDE_OPEN, "spend": {"per_day": 1000}}},
    }
    raw["keys"] += [{"key": "sk-shared", "tenant": "shared"}]
    stack = start_stack(
        tmp_path,
        write_policy(tmp_path / "policy.yaml", raw),
        replicas=2,
        budget_store=BudgetStoreKind.REDIS,
    )
    try:
        assert len(stack.fleet) == 2
        body = chat_body("hi", max_tokens=50, ignore_eos=True)

        def client(url: str) -> list[Reply]:
            return [post(url, CHAT, body, key="sk-shared") for _ in range(20)]

        with ThreadPoolExecutor(2) as pool:
            replies = [r for rs in pool.map(client, [r.url for r in stack.fleet]) for r in rs]
        served = [r for r in replies if r.status == 200]
        assert {r.status for r in replies} == {200, 429}
        assert all(
            r.headers["x-slogate-reason"] == "spend_exhausted" for r in replies if r.status == 429
        )
        costs = [r.json()["usage"]["total_tokens"] for r in served]  # default prices: 1 each
        spent, largest = sum(costs), max(costs)
        assert 1000 <= spent < 1000 + largest + 10  # one budget, not one a replica
        for replica in stack.fleet:
            refused = post(replica.url, CHAT, body, key="sk-shared")
            assert refused.status == 429, refused.body
        settled(stack)
        shown = slogate(stack, "tenants", "shared", "--json")
        assert shown.returncode == 0, shown.stderr
        (day,) = json.loads(shown.stdout)["tenants"][0]["windows"]
        assert day["used"] == pytest.approx(spent, abs=10)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


def test_reasoning_and_cached_tokens_are_priced_apart_through_envoy(tmp_path: Path) -> None:
    """The usage tap reads completion_tokens_details.reasoning_tokens and the prompt's
    cached_tokens out of the engine's response (a stream and a JSON body), and the tenant
    is charged each kind at its price."""
    raw = example_policy()
    raw["tenants"] = {
        "defaults": {},
        "prices": {"tokens": {"prompt": 1, "cached_prompt": 0, "completion": 2, "reasoning": 5}},
        "list": {"thinker": {"limits": WIDE_OPEN, "spend": {"per_month": 1e6}}},
    }
    raw["keys"] += [{"key": "sk-thinker", "tenant": "thinker"}]
    stack = start_stack(tmp_path, write_policy(tmp_path / "policy.yaml", raw))
    try:
        fields = {"max_tokens": 40, "ignore_eos": True, "reasoning_effort": "high"}
        first = post(stack.url, CHAT, chat_body(PROMPT, **fields), key="sk-thinker")
        assert first.status == 200, first.body
        usages = [first.json()["usage"]]
        body = chat_body(PROMPT, stream=True, stream_options={"include_usage": True}, **fields)
        conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=60)
        headers = {"authorization": "Bearer sk-thinker", "content-type": "application/json"}
        conn.request("POST", CHAT, body=json.dumps(body).encode(), headers=headers)
        events = [e for e in conn.getresponse().read().decode().split("\n\n") if e]
        conn.close()
        usages.append(json.loads(events[-2].removeprefix("data: "))["usage"])
        expected = 0.0
        for usage in usages:
            reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert reasoning == 20 and usage["completion_tokens"] == 40
            expected += usage["prompt_tokens"] - cached + 2 * (40 - reasoning) + 5 * reasoning
        assert usages[1]["prompt_tokens_details"]["cached_tokens"] > 0  # served from cache
        settled(stack)
        shown = slogate(stack, "tenants", "thinker", "--json")
        assert shown.returncode == 0, shown.stderr
        (month,) = json.loads(shown.stdout)["tenants"][0]["windows"]
        assert month["used"] == pytest.approx(expected)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()
