"""The lab's delay relay (tooling.stack.delay_link) over real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import pytest

from tooling.stack.delay_link import DelayLink, LinkSpec

DELAY_S = 0.15


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(4096):
            writer.write(chunk)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def _through_link(payload_chunks: list[bytes]) -> tuple[bytes, float]:
    server = await _echo_server()
    port = server.sockets[0].getsockname()[1]
    link = await DelayLink(LinkSpec("127.0.0.1", 0, "127.0.0.1", port, DELAY_S)).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        expected = b"".join(payload_chunks)
        started = time.monotonic()
        for chunk in payload_chunks:
            writer.write(chunk)
            await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(expected)), 30)
        elapsed = time.monotonic() - started
        writer.close()
        return got, elapsed
    finally:
        await link.close()
        server.close()
        await server.wait_closed()


def test_bytes_come_back_in_order_after_the_delay_each_way() -> None:
    chunks = [f"chunk {i:04d};".encode() * 50 for i in range(200)]
    got, elapsed = asyncio.run(_through_link(chunks))
    assert got == b"".join(chunks)
    # There and back: the delay twice, at least (a lower bound only: a loaded machine is slower).
    assert elapsed >= 2 * DELAY_S


def test_a_link_spec_is_read_and_a_bad_one_refused() -> None:
    spec = LinkSpec.parse("10.0.0.1:6400=127.0.0.1:6379@40")
    assert spec == LinkSpec("10.0.0.1", 6400, "127.0.0.1", 6379, 0.04)
    with pytest.raises(ValueError, match="LISTEN_HOST:PORT=TARGET_HOST:PORT@MS"):
        LinkSpec.parse("10.0.0.1:6400@40")
