"""The LiteLLM arm of `slogate bench overhead`: LiteLLM's proxy, what a user runs instead of
Envoy + slogate, in front of the same upstream, with per-key RPM/TPM limits on the bench key.

What lives here: its virtual environment (`install`, `binary`), its config (`write_config`)
and its process (`start_litellm`). The comparison's arithmetic is tooling.benchmarks
.vs_litellm's.

LiteLLM has a virtual environment of its own (.venv-litellm, ignored by git; `make
bench-overhead` or `python -m tooling.benchmarks.litellm_arm` makes it): litellm[proxy]
pins rich<14 where slogate's environment has rich 15 (import-linter's), and it brings some
forty packages (boto3, azure, polars, granian, psycopg...) the sidecar never needs.

Per-key limits without Postgres: LiteLLM keeps virtual keys in its database, but
`general_settings.custom_auth` may return a UserAPIKeyAuth carrying rpm_limit and
tpm_limit, and its parallel-request limiter (v3) enforces those on every request (LiteLLM
says so at start; tests/e2e/tooling/benchmarks/test_litellm_arm.py sees a limit of 3 refuse the
fourth request). Its tokens are charged as it ships (the usage the upstream reports). Given a Redis,
`general_settings.coordination_redis` puts the limiter's counters there: LiteLLM's
multi-instance limiter, as slogate's `budget.store: redis`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from extproc.runtime.processes import ManagedProcess
from tooling.benchmarks.levers import BENCH_KEY
from tooling.benchmarks.profile import Part
from tooling.stack.processes import free_port

HOST = "127.0.0.1"
REQUIREMENT = "litellm[proxy]==1.108.7"  # the newest on PyPI when the arm was written
VENV = Path(__file__).resolve().parents[2] / ".venv-litellm"
MODEL = "deepseek-v4"
# Limits like slogate's bench key: never reached, but looked up and charged on each request.
HUGE_RPM = 1_000_000_000
HUGE_TPM = 10**15
# LiteLLM refuses to start without a master key; requests use the bench key (custom_auth).
MASTER_KEY = "sk-bench-master-" + "0" * 32

# Where LiteLLM's time goes (tooling.benchmarks.profile): first match wins, so the specific
# parts come before the machinery they run on (the upstream call runs under the router,
# which runs under the proxy's request processing, which runs under FastAPI).
PARTS = (
    Part("rate limiter (parallel_request_limiter)", ("hooks/parallel_request_limiter",)),
    Part("token counting", ("token_counter", "tiktoken", "tokenizers")),
    Part("auth (user_api_key_auth, custom_auth)", ("proxy/auth/", "bench_auth")),
    # Not logging_utils.py: its timing decorator wraps the whole upstream call.
    Part(
        "logging, callbacks, cost",
        ("litellm_logging.py", "integrations/", "_service_logger", "cost_calculator"),
    ),
    Part("upstream call (HTTP client)", ("httpx", "aiohttp", "custom_httpx", "http_handler")),
    Part("response building (pydantic, types)", ("pydantic", "types/utils.py", "convert_dict")),
    Part("router", ("litellm/router",)),
    Part("provider call (litellm.main, llms/)", ("litellm/main.py", "litellm/llms/")),
    Part("request processing (proxy)", ("litellm/proxy/",)),
    Part("web server (FastAPI, Starlette, uvicorn)", ("fastapi/", "starlette/", "uvicorn/")),
    Part("event loop", ("asyncio/", "uvloop")),
    Part("threads", ("threading.py", "concurrent/")),
)

_AUTH_MODULE = '''"""Written by tooling/benchmarks/litellm_arm.py: the bench key with its limits."""
from fastapi import HTTPException, Request
from litellm.proxy._types import UserAPIKeyAuth


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    if api_key != {key!r}:
        raise HTTPException(status_code=401, detail="unknown key")
    return UserAPIKeyAuth(
        api_key=api_key,
        token="bench-key",
        rpm_limit={rpm},
        tpm_limit={tpm},
        max_parallel_requests={parallel},
    )
'''


def binary() -> Path | None:
    """The `litellm` command of the arm's environment, when it is installed."""
    path = VENV / "bin" / "litellm"
    return path if path.exists() else None


def missing_message() -> str:
    return (
        f"LiteLLM's arm skipped: no {VENV.name}/bin/litellm. Make it with "
        "`python -m tooling.benchmarks.litellm_arm` (`make bench-overhead` does)."
    )


def install() -> Path:
    """The arm's environment with REQUIREMENT installed (again only if the pin moved)."""
    stamp = VENV / ".installed"
    if stamp.exists() and stamp.read_text().strip() == REQUIREMENT and binary() is not None:
        return VENV
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, REQUIREMENT], check=True)
    stamp.write_text(REQUIREMENT + "\n")
    return VENV


def write_config(
    directory: Path,
    upstream_port: int,
    rpm: int = HUGE_RPM,
    tpm: int = HUGE_TPM,
    redis_port: int | None = None,
) -> Path:
    """config.yaml and its custom_auth module in `directory`; the config's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bench_auth.py").write_text(
        _AUTH_MODULE.format(key=BENCH_KEY, rpm=rpm, tpm=tpm, parallel=HUGE_RPM)
    )
    lines = [
        "model_list:",
        f"  - model_name: {MODEL}",
        "    litellm_params:",
        f"      model: openai/{MODEL}",
        f"      api_base: http://{HOST}:{upstream_port}/v1",
        "      api_key: unused",
        "general_settings:",
        f"  master_key: {MASTER_KEY}",
        "  custom_auth: bench_auth.user_api_key_auth",
        # No database: nothing to write spend rows to (a DB-less deployment has none).
        "  disable_spend_logs: true",
    ]
    if redis_port is not None:
        lines += ["  coordination_redis:", f"    host: {HOST}", f"    port: {redis_port}"]
    config = directory / "config.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def start_litellm(
    name: str,
    work: Path,
    upstream_port: int,
    rpm: int = HUGE_RPM,
    tpm: int = HUGE_TPM,
    redis_port: int | None = None,
) -> tuple[str, ManagedProcess]:
    """LiteLLM's proxy, one worker process, ready: its chat completions URL, and it."""
    command = binary()
    if command is None:
        raise RuntimeError(missing_message())
    config = write_config(work / name, upstream_port, rpm, tpm, redis_port)
    port = free_port()
    argv = [str(command), "--config", str(config), "--host", HOST, "--port", str(port)]
    proc = ManagedProcess(
        name,
        [*argv, "--num_workers", "1"],
        work,
        # The price map from the package, not fetched from GitHub at start (this machine
        # has no way out; a deployment would not wait on it either); custom_auth's module
        # is found beside the config.
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(config.parent)},
        group=True,
    ).start()
    try:
        proc.wait_for_http(f"http://{HOST}:{port}/health/liveliness", timeout_s=120.0)
    except BaseException:
        proc.stop()
        raise
    return f"http://{HOST}:{port}/v1/chat/completions", proc


if __name__ == "__main__":
    print(f"LiteLLM's environment: {install()} ({REQUIREMENT})")
