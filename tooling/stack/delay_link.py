"""A TCP relay that delays each direction by a fixed time: the lab's wide-area link.

What lives here: `DelayLink` (one listening address forwarding every connection to one
target, each chunk released `delay_s` after it arrived, in order) and the command that
runs several of them in one process (`python -m tooling.stack.delay_link --link
LISTEN=TARGET@MS ...`), which `slogate bench regions` starts inside the WAN network
namespace. What must not live here: namespaces and addresses (tooling.stack.netns).

Why a relay and not `tc qdisc ... netem delay`: netem is the natural tool where the kernel
has it (sch_netem); the kernel this lab was built on has no netem (tbf, htb and pfifo only),
so the delay is added in user space. Each chunk is stamped on arrival and released at
arrival + delay by a writer that runs beside the reader, so a long delay does not cut the
throughput (the chunks in flight overlap, as packets on a long link do). The TCP handshake
itself is not delayed (the relay accepts at once); every byte after it is, both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass
from typing import Any

_CHUNK_BYTES = 65536
_SHAPE = "LISTEN_HOST:PORT=TARGET_HOST:PORT@MS"


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """`LISTEN_HOST:PORT=TARGET_HOST:PORT@MS`: one delayed link (MS: one way, each direction)."""

    listen_host: str
    listen_port: int
    target_host: str
    target_port: int
    delay_s: float

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        try:
            addresses, _, delay = text.partition("@")
            listen, _, target = addresses.partition("=")
            lhost, _, lport = listen.rpartition(":")
            thost, _, tport = target.rpartition(":")
            spec = cls(lhost, int(lport), thost, int(tport), float(delay or 0) / 1000.0)
        except ValueError as err:
            raise ValueError(f"expected {_SHAPE}, got {text!r}") from err
        if not spec.listen_host or not spec.target_host or spec.delay_s < 0:
            raise ValueError(f"expected {_SHAPE}, got {text!r}")
        return spec


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: float,
    abort: asyncio.Event,
) -> None:
    """Copy one direction: chunks stamped when read, written at stamp + delay_s, in order.
    The end of the stream is passed on after the same delay; an error on either side sets
    `abort`, which ends both directions (the relay then closes both connections)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, chunk = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    async def read() -> None:
        while True:
            chunk = await reader.read(_CHUNK_BYTES)
            queue.put_nowait((time.monotonic() + delay_s, chunk))
            if not chunk:
                return

    reading, releasing = asyncio.create_task(read()), asyncio.create_task(release())
    aborted = asyncio.create_task(abort.wait())
    try:
        pending: set[asyncio.Task[Any]] = {reading, releasing, aborted}
        while releasing in pending and aborted in pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(t.exception() for t in done if t is not aborted and not t.cancelled()):
                abort.set()
                break
    finally:
        for task in (reading, releasing, aborted):
            task.cancel()


class DelayLink:
    """One listening address; every connection to it is relayed to the target, delayed."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the spec's, or the one the OS picked for port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> DelayLink:
        self._server = await asyncio.start_server(
            self._accepted, self.spec.listen_host, self.spec.listen_port, reuse_address=True
        )
        return self

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.spec.target_host, self.spec.target_port
                )
            except OSError:
                writer.close()
                return
            abort = asyncio.Event()
            try:
                await asyncio.gather(
                    _pump(reader, up_writer, self.spec.delay_s, abort),
                    _pump(up_reader, writer, self.spec.delay_s, abort),
                )
            finally:
                for w in (writer, up_writer):
                    w.close()
        finally:
            self._conns.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()


async def _serve(specs: list[LinkSpec]) -> None:
    links = [await DelayLink(spec).start() for spec in specs]
    for link in links:
        s = link.spec
        print(
            f"delay link {s.listen_host}:{link.port} -> {s.target_host}:{s.target_port} "
            f"+{s.delay_s * 1000:g} ms each way",
            flush=True,
        )
    print("delay links ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    for link in links:
        await link.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tooling.stack.delay_link")
    parser.add_argument(
        "--link",
        action="append",
        type=LinkSpec.parse,
        required=True,
        metavar="LISTEN_HOST:PORT=TARGET_HOST:PORT@MS",
        help="one delayed link (MS one way, applied in each direction); repeat",
    )
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.link))


if __name__ == "__main__":
    main()
