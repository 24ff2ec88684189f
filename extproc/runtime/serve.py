"""`slogate serve`: one sidecar process until SIGINT/SIGTERM; SIGHUP reloads the policy.

What lives here: `run_sidecar`, which builds the composition root (extproc.runtime.sidecar),
starts it, prints the one ready line the local stack and the tests wait for, and stops it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from extproc.runtime.grpc_servers import ListenerTls
from extproc.runtime.heap import freeze_at_start
from extproc.runtime.sidecar import Sidecar
from extproc.runtime.workers import WorkerSlot
from extproc.service.log_records import json_logs


async def run_sidecar(
    policy_path: Path,
    host: str,
    grpc_port: int,
    metrics_port: int | None,
    exact: bool = True,
    metrics_host: str | None = None,
    admin_address: str | None = "127.0.0.1:50052",
    worker: WorkerSlot | None = None,
    tls: ListenerTls | None = None,
    health_port: int | None = None,
    grpc_socket: Path | None = None,
    health_host: str | None = None,
    region: str | None = None,
) -> None:
    """`slogate serve`: run until SIGINT/SIGTERM; SIGHUP reloads the policy."""
    sidecar = Sidecar(
        policy_path,
        host,
        grpc_port,
        metrics_port,
        exact_tokenizer=exact,
        metrics_host=metrics_host,
        admin_address=admin_address,
        worker=worker,
        tls=tls,
        health_port=health_port,
        grpc_socket=grpc_socket,
        health_host=health_host,
        region=region,
    )
    address = await sidecar.start()
    freeze_at_start()  # what lives as long as the process leaves the collector's walks
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[bool]] = set()  # held: the loop keeps only weak references

    def reload() -> None:
        task = asyncio.ensure_future(sidecar.policy.reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    metrics = (
        f" metrics http://{metrics_host or host}:{address.metrics_port}/metrics"
        if address.metrics_port
        else ""
    )
    admin = f" admin {address.admin}" if address.admin else ""
    health_at = f"{health_host or host}:{address.health_port}"
    health = f" health {health_at}" if address.health_port else ""
    health += " tls" if tls is not None else ""  # after the fields the tools' patterns read
    ready = f"slogate sidecar ready: grpc {address.grpc}{metrics}{admin}{health} pid {os.getpid()}"
    if json_logs():
        logging.getLogger("slogate.serve").info(ready)  # every line of the process is JSON
    else:
        print(ready, flush=True)
    await stop.wait()
    await sidecar.stop()
