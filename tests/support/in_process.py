"""A sidecar in the test's own process, driven over real gRPC as Envoy drives it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from extproc.runtime.sidecar import Sidecar, SidecarAddress
from tooling.benchmarks.driver import SidecarDriver


@contextlib.asynccontextmanager
async def in_process(
    path: Path, exact_tokenizer: bool = True
) -> AsyncIterator[tuple[Sidecar, SidecarDriver, SidecarAddress]]:
    """The sidecar of the policy at `path` on a free gRPC port (no metrics or admin
    listener), a driver connected to it; both closed on the way out. `exact_tokenizer`
    False: prompts counted by their estimate (no tokenizer to load: a second less)."""
    sidecar = Sidecar(
        path,
        grpc_port=0,
        metrics_port=None,
        admin_address=None,
        exact_tokenizer=exact_tokenizer,
    )
    address = await sidecar.start()
    driver = SidecarDriver(f"127.0.0.1:{address.grpc_port}")
    try:
        yield sidecar, driver, address
    finally:
        await driver.close()
        await sidecar.stop(grace_s=0.5)
