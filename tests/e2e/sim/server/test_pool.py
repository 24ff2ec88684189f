"""The simulated pool's command line: started as a process, it serves and stops on SIGTERM.
In process: tests/sim/server/test_pool.py."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import aiohttp

from tests.support.http import CHAT
from tests.support.stack import ROOT


async def test_cli_starts_serves_and_stops_on_sigterm() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sim.server.pool",
        "--name",
        "cli",
        "--port",
        "0",
        "--time-scale",
        "0.001",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=15)).decode()
        match = re.fullmatch(r"sim pool cli listening on http://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        url = f"http://127.0.0.1:{match.group(1)}"
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url + CHAT,
                json={
                    "model": "deepseek-v4",
                    "messages": [{"role": "user", "content": "hello there"}],
                    "max_tokens": 2,
                },
            ) as response,
        ):
            assert response.status == 200
            assert response.headers["x-sim-pool"] == "cli"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.stderr is not None
    assert b"Traceback" not in await process.stderr.read()
