"""slogate dropped into an Envoy it did not write: `slogate envoy-config --merge-into` puts
the fragment into an operator's own bootstrap (tests/data/foreign-envoy.yaml: its listener,
routes, clusters and names), and the real Envoy, the real sidecar and the simulated pools
pass the data-path checks through it."""

from __future__ import annotations

import http.client
import json
import string
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.request.contract import (
    FAIRNESS_HEADER,
    LLM_D_FAIRNESS_HEADER,
    LLM_D_OBJECTIVE_HEADER,
    OBJECTIVE_HEADER,
)
from policy.schema import Policy
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, charged_as_used, random_ports, slogate
from tooling.render.envoy_config.profile import EnvoyPorts
from tooling.stack.local import LocalStack

FOREIGN = Path(__file__).parents[1] / "data" / "foreign-envoy.yaml"
POOL_CLUSTERS = {"default": "vllm_main", "long": "vllm_long_context", "fallback": "vllm_spare"}


def merged_bootstrap(work: Path, notes: list[str]) -> Any:
    """The stack's Envoy configuration: the operator's file, its ports filled in, with the
    fragment merged by the command an operator runs."""

    def build(policy: Policy, ports: EnvoyPorts) -> dict[str, Any]:
        filled = string.Template(FOREIGN.read_text()).substitute(
            LISTEN_PORT=ports.listen_port,
            ADMIN_PORT=ports.admin_port,
            **{
                f"{name.upper()}_POOL_PORT": pool.endpoints[0][1]
                for name, pool in policy.pools.items()
            },
        )
        theirs = work / "their-envoy.yaml"
        theirs.write_text(filled)
        out = work / "merged-envoy.json"
        done = subprocess.run(
            [
                sys.executable, "-m", "tooling.cli.main", "envoy-config",
                "--policy", str(EXAMPLE_POLICY), "--merge-into", str(theirs),
                "--sidecar-port", str(ports.sidecar_port), "--out", str(out),
                *[f"--pool-cluster={pool}={cluster}" for pool, cluster in POOL_CLUSTERS.items()],
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        notes.extend(line for line in done.stdout.splitlines() if line.startswith("note:"))
        merged: dict[str, Any] = json.loads(out.read_text())
        return merged

    return build


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, list[str]]]:
    work = tmp_path_factory.mktemp("foreign")
    notes: list[str] = []
    stack = LocalStack(
        EXAMPLE_POLICY,
        work,
        random_ports(),
        time_scale=0.05,
        bootstrap=merged_bootstrap(work, notes),
    )
    stack.start()
    yield stack, notes
    stack.stop()


@pytest.fixture
def stack(foreign: tuple[LocalStack, list[str]]) -> Iterator[LocalStack]:
    local = foreign[0]
    try:
        yield local
    except BaseException:
        print(local.logs())
        raise


def get(stack: LocalStack, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_the_merge_says_what_it_changed(foreign: tuple[LocalStack, list[str]]) -> None:
    # The operator's 120 s idle timeout would cut requests in the waiting room.
    assert any("stream_idle_timeout raised from 120s" in note for note in foreign[1])


def test_prompts_reach_the_operators_clusters_by_context(stack: LocalStack) -> None:
    short = post(stack.url, CHAT, chat_body("What is the capital of France?"))
    assert short.status == 200, short.body
    assert short.headers["x-slogate-pool"] == short.headers["x-sim-pool"] == "default"
    assert short.headers["x-served-by"] == "acme-edge"  # their virtual host's own header
    long = post(stack.url, CHAT, chat_body(" word" * 40_000, max_tokens=16))
    assert long.status == 200, long.body
    assert long.headers["x-slogate-pool"] == long.headers["x-sim-pool"] == "long"
    # Clients cannot pick the pool (only the sidecar's metadata does), nor claim another
    # class at an endpoint picker behind slogate.
    spoofed = post(
        stack.url,
        CHAT,
        chat_body("hi"),
        headers={
            "x-slogate-pool": "long",
            OBJECTIVE_HEADER: "slogate-critical",
            LLM_D_OBJECTIVE_HEADER: "slogate-critical",  # the name llm-d's router reads first
            LLM_D_FAIRNESS_HEADER: "someone-else",
        },
    )
    assert spoofed.status == 200 and spoofed.headers["x-sim-pool"] == "default"
    saw = json.loads(spoofed.headers["x-sim-saw-headers"])
    assert saw[OBJECTIVE_HEADER] == saw[LLM_D_OBJECTIVE_HEADER] == "slogate-standard"
    assert saw[FAIRNESS_HEADER] == saw[LLM_D_FAIRNESS_HEADER] == "demo-standard"


def test_the_operators_own_routes_do_not_ask_the_sidecar(stack: LocalStack) -> None:
    status, _, body = get(stack, "/status")  # Envoy's direct response, no policy path
    assert (status, body) == (200, b"ok")
    status, headers, _ = get(stack, "/docs/index.html")  # their docs service
    assert headers.get("x-sim-pool") == "default" and "x-slogate-reason" not in headers
    # Inside their inference prefix the sidecar still denies what the policy does not list.
    status, headers, body = get(stack, "/v1/fine_tuning/jobs")
    assert status == 404 and headers["x-slogate-reason"] == "unknown_path", body
    assert json.loads(body)["error"]["code"] == "not_found"


def test_a_small_key_gets_429_with_rate_limit_headers(stack: LocalStack) -> None:
    statuses = []
    for _ in range(8):
        reply = post(stack.url, CHAT, chat_body("hi", max_tokens=4), key="sk-demo-small")
        statuses.append(reply.status)
        if reply.status == 429:
            break
    assert statuses[-1] == 429, statuses
    assert reply.json()["error"]["code"] == "rate_limit_exceeded"
    assert reply.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(reply.headers["retry-after"]) >= 1
    ok = post(stack.url, CHAT, chat_body("hi"), key="sk-demo-critical")
    # Successful responses carry them too (the pool route renders them from metadata).
    assert ok.status == 200 and int(ok.headers["x-ratelimit-remaining-requests"]) > 0


def test_usage_is_settled_through_the_access_log(stack: LocalStack) -> None:
    charged_as_used(stack)


def test_the_breaker_answers_503(stack: LocalStack) -> None:
    assert (
        slogate(stack, "drill", "--pool", "default", "--level", "3", "--minutes", "1").returncode
        == 0
    )
    try:
        refused = post(stack.url, CHAT, chat_body("x"), key="sk-demo-standard")
        assert refused.status == 503, refused.body
        assert refused.headers["x-slogate-reason"] == "shed_tier_shed"  # the breaker's shed
        # Critical traffic goes to the fallback pool at L3: the operator's spare cluster.
        critical = post(stack.url, CHAT, chat_body("x"), key="sk-demo-critical")
        assert critical.status == 200 and critical.headers["x-sim-pool"] == "fallback"
    finally:
        slogate(stack, "drill", "--pool", "default", "--level", "0", "--minutes", "0")


def test_the_failure_mode_holds_with_the_sidecar_down(stack: LocalStack) -> None:
    stack.stop_sidecar()
    try:
        inference = post(stack.url, CHAT, chat_body())
        assert inference.status == 502, inference.body  # closed, by the policy
        assert inference.json()["error"]["code"] == "gateway_unavailable"  # JSON, merged
        status, headers, _ = get(stack, "/health")  # open, by failure_mode_by_path
        assert status == 200 and headers["x-sim-pool"] == "default"
        assert get(stack, "/status")[0] == 200
    finally:
        assert stack.supervise()  # the sidecar again, on its ports
    assert post(stack.url, CHAT, chat_body("back")).status == 200
