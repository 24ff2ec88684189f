"""A TCP proxy a test can cut or slow: one process's path to a server, severed while others
keep theirs (a network partition on one machine, without network namespaces), or answered
late (a slow server, without tc)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tooling.stack.processes import free_port


class CuttableProxy:
    """Forwards 127.0.0.1:`port` to `target_port` from a thread of its own. `cut()` closes
    every forwarded connection and closes new ones at once (the peer sees its server vanish);
    `heal()` forwards again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.cut_off = False
        # Each chunk the server sends back is held this long first (0: forwarded at once).
        self.reply_delay_s = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CuttableProxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self._cut)

    def heal(self) -> None:
        self.cut_off = False

    def _cut(self) -> None:
        self.cut_off = True
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool = False
        ) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    if replies and self.reply_delay_s:
                        await asyncio.sleep(self.reply_delay_s)
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer, replies=True))
        self._writers.difference_update((writer, up_writer))
