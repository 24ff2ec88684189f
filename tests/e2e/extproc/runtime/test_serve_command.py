"""`slogate serve` loads the product and the command line, nothing of the simulator or the tools.

A real `slogate serve` is started under `python -X importtime` (which writes one stderr line
per module it imports, as it imports it) on the example policy and random ports, asked for
its gRPC health until SERVING, and stopped by pid; then the modules it loaded are read back.

What must not be there, and why: `sim` (the simulated engines and the offline fleet: numpy
models, plotting, workloads) and every part of `tooling` but its command line — the local
stack, the renders, the load test, preflight, the benchmarks and the build. They are what
developers and operators' laptops run; in the container they would only add start time,
memory and their own import failures to the sidecar. `tooling.cli.*` is allowed: `slogate`
collects every subcommand's parser, and each handler imports its heavy parts when it runs.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from extproc.runtime.processes import ManagedProcess, python_module
from tests.support.serve_imports import forbidden
from tests.support.stack import ROOT

# `import time: self [us] | cumulative | imported package`, the name indented by its depth.
_IMPORTED = re.compile(r"^import time:\s+\d+\s+\|\s+\d+\s+\|\s+(\S+)\s*$", re.M)


def loaded_modules(log: str) -> list[str]:
    return _IMPORTED.findall(log)


def serving(port: int) -> int:
    from grpc import aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async def check() -> int:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            return int(reply.status)

    return asyncio.run(check())


def serve_modules(tmp_path: Path, module: str = "tooling.cli.main") -> list[str]:
    """The modules a `slogate serve` (`python -X importtime -m <module> serve`) loaded by the
    time it answered SERVING."""
    from grpc_health.v1 import health_pb2

    argv = python_module(
        module,
        "serve",
        "--policy", str(ROOT / "deploy" / "policy.example.yaml"),
        "--host", "127.0.0.1",
        "--grpc-port", "0",
        "--metrics-port", "0",
        "--admin-address", "127.0.0.1:0",
        "--no-exact-tokenizer",
    )  # fmt: skip
    argv.insert(1, "-X")
    argv.insert(2, "importtime")
    proc = ManagedProcess("serve-importtime", argv, tmp_path).start()
    try:
        port = int(proc.wait_for_line(r"sidecar ready: grpc [^:]+:(\d+)", 120).group(1))
        assert serving(port) == health_pb2.HealthCheckResponse.SERVING
    finally:
        code = proc.stop(30)
    assert code == 0, proc.log_text()[-3000:]
    return loaded_modules(proc.log_text())


def test_serve_loads_nothing_of_the_simulator_or_the_tools(tmp_path: Path) -> None:
    modules = serve_modules(tmp_path)
    # The reading itself works: the sidecar's own modules are in it, and the command line's
    # (tooling.cli.main runs as __main__; `simulate`'s parser is registered, its simulator not).
    expected = {"extproc.runtime.serve", "extproc.runtime.serve_command", "tooling.cli.simulate"}
    assert expected <= set(modules), sorted(expected - set(modules))
    loaded = sorted({m for m in modules if forbidden(m)})
    assert not loaded, f"`slogate serve` loaded {loaded}"
