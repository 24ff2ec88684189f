"""The sidecar's lifecycle (extproc.runtime.sidecar): what `start` started, `stop` stops in
the reverse order, by construction, and a stopped sidecar holds none of its ports."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from extproc.runtime import sidecar as sidecar_module
from extproc.runtime.parts import Observers
from extproc.runtime.sidecar import Sidecar
from extproc.runtime.stores import Stores
from tests.support.stack import EXAMPLE_POLICY


def _recorded(events: list[str], name: str, start: Callable[..., Any]) -> Callable[..., Any]:
    """`start`, its start and (once its own stop has run) its stop appended to `events`."""

    def recorded(exits: AsyncExitStack, **kwargs: Any) -> Any:
        exits.callback(events.append, f"stop {name}")  # runs after what `start` registers
        started = start(exits, **kwargs)
        events.append(f"start {name}")
        return started

    async def recorded_async(exits: AsyncExitStack, **kwargs: Any) -> Any:
        exits.callback(events.append, f"stop {name}")
        started = await start(exits, **kwargs)
        events.append(f"start {name}")
        return started

    return recorded_async if inspect.iscoroutinefunction(start) else recorded


async def test_stop_undoes_start_in_reverse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ext_proc server starts last and drains first, while /metrics and the admin API
    still answer; the loops stop before it; the stores close after every server, then the
    observers."""
    events: list[str] = []
    for name, attribute in (
        ("loops", "start_loops"),
        ("ext_proc", "start_ext_proc"),
        ("admin", "start_admin"),
        ("metrics", "start_metrics"),
    ):
        original = getattr(sidecar_module, attribute)
        monkeypatch.setattr(sidecar_module, attribute, _recorded(events, name, original))
    stores_close, observers_close = Stores.close, Observers.close

    async def close_stores(self: Stores) -> None:
        events.append("close stores")
        await stores_close(self)

    def close_observers(self: Observers) -> None:
        events.append("close observers")
        observers_close(self)

    monkeypatch.setattr(Stores, "close", close_stores)
    monkeypatch.setattr(Observers, "close", close_observers)
    sidecar = Sidecar(
        EXAMPLE_POLICY,
        grpc_port=0,
        metrics_port=0,
        admin_address="127.0.0.1:0",
        exact_tokenizer=False,
    )
    address = await sidecar.start()
    assert events == ["start metrics", "start admin", "start ext_proc", "start loops"]
    await sidecar.stop(grace_s=0.1)
    assert events[4:] == [
        "stop loops",
        "stop ext_proc",
        "stop admin",
        "stop metrics",
        "close stores",
        "close observers",
    ]
    await sidecar.stop()  # nothing left to undo
    assert len(events) == 10
    assert address.metrics_port is not None and address.admin is not None
    admin_port = int(address.admin.rsplit(":", 1)[1])
    for port in (address.grpc_port, address.metrics_port, admin_port):
        with socket.socket() as free:
            free.bind(("127.0.0.1", port))  # released: nothing listens there any more
