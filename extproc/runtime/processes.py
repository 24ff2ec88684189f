"""One child process, started and stopped the one way slogate does it.

What lives here: `ManagedProcess` (a child in its own session; its output to a log file, to a
line sink, or both; a ready line or an HTTP readiness probe; stop by SIGTERM, a wait, then
SIGKILL), `ProcessFailed` and `python_module`. The `serve --workers` supervisor
(extproc.runtime.supervisor) relays its workers' lines through a sink; the local stack, the
benchmarks and the test fixtures (tooling.stack) write log files. What must not live here:
what a particular child is (a sidecar, Envoy, Redis) — that is its caller's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

# Receives each line the child writes (stdout and stderr together), without its line end.
LineSink = Callable[[str], None]


class ProcessFailed(RuntimeError):
    pass


def python_module(module: str, *args: str, runner: str | None = None) -> list[str]:
    """The argv that runs `module` with this interpreter (the venv's, the image's);
    `runner`: a script that runs the module itself (a profiler's, `python RUNNER MODULE`)."""
    if runner is not None:
        return [sys.executable, runner, module, *args]
    return [sys.executable, "-m", module, *args]


class ManagedProcess:
    """One child. Its output goes to `log_dir/<name>.log` when `log_dir` is given and to
    `lines` line by line when that is given (a thread reads the pipe); at least one of them."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path | None,
        env: dict[str, str] | None = None,
        group: bool = False,
        lines: LineSink | None = None,
    ) -> None:
        if log_dir is None and lines is None:
            raise ValueError(f"{name}: its output needs a log_dir or a line sink")
        self.name = name
        # A program with children of its own (vLLM: API server, engine core, worker): `stop`
        # signals its whole process group, so none of them outlives it.
        self.group = group
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log" if log_dir is not None else None
        self._lines = lines
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> ManagedProcess:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE if self._lines is not None else self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not each child
        )
        if self._lines is not None:
            self._pump = threading.Thread(target=self._pump_lines, daemon=True)
            self._pump.start()
        return self

    def _pump_lines(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        assert self._lines is not None
        for raw in self._proc.stdout:
            log = self._log
            if log is not None and not log.closed:
                log.write(raw)
                log.flush()  # wait_for_line and log_text read the file meanwhile
            self._lines(raw.decode("utf-8", errors="replace").rstrip("\r\n"))

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """Its status once it exited (negative: the signal that ended it); None before."""
        return self._proc.poll() if self._proc is not None else None

    def wait_output(self, timeout_s: float = 5.0) -> None:
        """After it exited: until its last lines reached the sink (the pipe is drained)."""
        if self._pump is not None:
            self._pump.join(timeout=timeout_s)

    def log_text(self) -> str:
        if self.log_path is None:
            return ""
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

    def signal(self, signum: int) -> None:
        """Send `signum` (SIGHUP: reread the policy) to it, or to its group with `group`."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal(self._proc.pid, signum)

    def _signal(self, pid: int, signum: int) -> None:
        # start_new_session: the child leads a process group whose id is its pid.
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.group:  # a child left behind by a leader that exited
            self._signal(proc.pid, signal.SIGKILL)
        self.wait_output()  # the sink gets every line before the log file closes
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode
