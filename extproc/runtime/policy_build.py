"""A policy reload's build: in a process of its own, installed on the event loop in slices.

What lives here: `build_elsewhere` (the sidecar's side: asks the builder process for the
policy file's policy and installs what comes back), `policy_stream` (what the builder
answers), `text_digest` and the builder's own state. What must not: when to reload, what a
refused policy does (the policy holder's).

Why a process: reading and validating a ten-thousand-key policy takes ~0.4 s of CPU that
holds the interpreter lock throughout. Built in a thread beside the event loop
(extproc.runtime.heap.off_loop), the loop still had to win the lock back at every hand-off
(each poll, each gRPC call) and requests answered meanwhile waited (bench/results/tenants.md).
The builder has a lock of its own. It is one child process per sidecar process (a
`--workers` worker has its own), started at the first reload and kept: it keeps the last
policies it built, so a reload parses only the new text. It runs niced and in a session of
its own: where the kernel shares CPU out by session (autogroup), a builder in the sidecar's
session took its CPU from the sidecar's share, and requests waited on it, niced or not.
The builder reads the file itself: the sidecar sends it a path and the digest of the
running policy's text, not a megabyte of text (its own text only once, the first time, to
start the builder's memory).

What comes back is one pickle stream with one memo (one Limits shared by a thousand keys
comes once), and only what changed comes at all. The builder compares the new policy with
the running one (the one it built from the same text: the same text always builds an equal
policy, policy.loader.policy_from_text): a section equal to the running one's is a reference
the sidecar resolves to the object it already holds; of the large mappings (the keys, the
listed tenants) only the entries added or changed come, with the names of those removed,
in slices of ENTRIES_PER_SLICE, which the sidecar unpickles one at a time with the loop's
other work between them (the whole ten-thousand-key policy at once is ~45 ms on the loop,
one slice ~1 ms). Both ends are this code: the stream is trusted as the sidecar's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import os
import pickle
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from extproc.runtime.heap import collector_paused
from extproc.runtime.processes import python_module
from policy._reader import PolicyError
from policy.loader import policy_from_text, read_policy_text
from policy.schema import Policy

ENTRIES_PER_SLICE = 250  # ~1 ms of unpickling on the loop each (a key: ~4 us)
BUILD_TIMEOUT_S = 120.0  # a builder that takes longer is stopped and the reload refused
_BUILDER_NICENESS = 10
_MODULE = "extproc.runtime.policy_build"
_KEPT = 2  # policies the builder keeps: the running one and the last one built

# The mappings that come entry by entry, by name, and where each is in a policy.
_SLICED: dict[str, Callable[[Policy], Mapping[str, Any]]] = {
    "keys": lambda policy: policy.keys,
    "tenants": lambda policy: policy.tenants.listed,
}


class BuildFailed(RuntimeError):
    """The builder died or hung without an answer (not a refused policy: that is a
    PolicyError with the loader's reason)."""


@dataclass(frozen=True, slots=True)
class Built:
    policy: Policy
    rebuilt: int  # entries of the keys and listed tenants that came built anew
    reused: int  # entries the running policy's objects were kept for
    builder_pid: int  # the process that built it
    digest: str  # of the text it was built from (text_digest)


# -- the sidecar's side -------------------------------------------------------------------


def text_digest(source: str, text: str) -> str:
    """What names a policy's text between the sidecar and the builder."""
    return hashlib.sha256(f"{source}\0{text}".encode()).hexdigest()


async def build_elsewhere(
    source: str, running: Policy, running_digest: str, running_text: str | None = None
) -> Built:
    """The policy file `source` holds, built in the builder process; raises PolicyError
    (OSError's reason too) when it does not load. `running` was built from the text whose
    digest is `running_digest`; `running_text`, that text, where the builder may not know
    it yet (the first reload)."""
    request = pickle.dumps((source, running_digest, running_text), protocol=pickle.HIGHEST_PROTOCOL)
    # The pipes are worked in a thread (blocking reads and writes release the interpreter
    # lock), so the builder outlives any one event loop.
    exchange = asyncio.ensure_future(asyncio.to_thread(_BUILDER.exchange, request))
    # Shielded below: a reload given up on (timed out, cancelled) leaves the exchange to end
    # with the builder; what it ends with is read here, not reported as never retrieved.
    exchange.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        stream = await asyncio.wait_for(asyncio.shield(exchange), BUILD_TIMEOUT_S)
    except TimeoutError:
        _BUILDER.stop()  # the exchange's read ends with the process
        raise BuildFailed(f"the policy build took over {BUILD_TIMEOUT_S:.0f} s") from None
    return await _install(stream, running)


class _Builder:
    """The builder process, started at the first exchange and again after it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one exchange at a time (one per holder otherwise)
        self._process: subprocess.Popen[bytes] | None = None

    def exchange(self, request: bytes) -> bytes:
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                process = self._process = subprocess.Popen(
                    python_module(_MODULE),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=_builder_env(),
                    # A session of its own: where the kernel shares CPU time out by
                    # session (autogroup), the builder's is not taken from the sidecar's
                    # share (measured: requests waited on it, niced or not); and signals
                    # sent to the sidecar's process group are not the builder's.
                    start_new_session=True,
                )
            assert process.stdin is not None and process.stdout is not None
            try:
                _write_frame(process.stdin, request)
                reply = _read_frame(process.stdout)
            except OSError as error:
                reply, why = None, str(error)
            else:
                why = "no answer"
            if reply is None:
                process.kill()
                raise BuildFailed(f"the policy build process failed ({why}, exit {process.wait()})")
            return reply

    def stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()  # gone before the next exchange looks


_BUILDER = _Builder()


def _builder_env() -> dict[str, str]:
    """The builder imports this very code: a checkout's folder goes first (tests, a
    worktree); an installed package's site-packages is found as it is (first, it would
    put whatever lies there ahead of the standard library)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    if root not in {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _write_frame(pipe: IO[bytes], payload: bytes) -> None:
    pipe.write(len(payload).to_bytes(8, "big"))
    pipe.write(payload)
    pipe.flush()


def _read_frame(pipe: IO[bytes]) -> bytes | None:
    """One frame, or None at the end of the pipe (the other side is gone)."""
    head = pipe.read(8)
    if len(head) < 8:
        return None
    size = int.from_bytes(head, "big")
    payload = pipe.read(size)
    return payload if len(payload) == size else None


class _Installer(pickle.Unpickler):
    """Resolves the stream's references to the running policy and the assembled mappings."""

    def __init__(self, stream: bytes, running: Policy) -> None:
        super().__init__(io.BytesIO(stream))
        self._running = running
        self.assembled: dict[str, dict[str, Any]] = {}
        self.entries_kept = 0  # entries that came as references inside the slices

    def persistent_load(self, pid: Any) -> Any:
        match pid:
            case ("field", name):
                return getattr(self._running, name)
            case ("entry", name, key):
                self.entries_kept += 1
                return _SLICED[name](self._running)[key]
            case ("whole", name):
                return _SLICED[name](self._running)
            case ("assembled", name):
                return self.assembled[name]
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


async def _install(stream: bytes, running: Policy) -> Built:
    installer = _Installer(stream, running)
    came = 0
    with collector_paused():
        header = installer.load()
        if header[0] == "refused":
            raise PolicyError(header[1])
        _, builder_pid, digest, plan = header
        for name, from_running, removed, slices in plan:
            assembled = dict(_SLICED[name](running)) if from_running else {}
            for key in removed:
                del assembled[key]
            for _ in range(slices):
                await asyncio.sleep(0)  # the loop's other work between slices
                piece = installer.load()
                came += len(piece)
                assembled.update(piece)
            installer.assembled[name] = assembled
        await asyncio.sleep(0)
        policy = installer.load()
    rebuilt = came - installer.entries_kept
    total = sum(len(mapping_of(policy)) for mapping_of in _SLICED.values())
    return Built(policy, rebuilt, total - rebuilt, builder_pid, digest)


# -- the builder's side -------------------------------------------------------------------

_kept: dict[str, Policy] = {}  # text digest -> the policy built from it, the last _KEPT


def _built_from(text: str, source: str, digest: str) -> Policy:
    policy = _kept.pop(digest, None) or policy_from_text(text, source)
    _kept[digest] = policy  # last: the most recently used
    while len(_kept) > _KEPT:
        del _kept[next(iter(_kept))]
    return policy


class _Referrer(pickle.Pickler):
    """Writes the objects named in `refs` (by identity) as references."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs: dict[int, tuple[str, ...]] = {}

    def persistent_id(self, obj: Any) -> tuple[str, ...] | None:
        return self.refs.get(id(obj))


_SCALARS = (type(None), bool, int, float, str)  # cheaper sent than referred to


def policy_stream(source: str, running_digest: str, running_text: str | None) -> bytes:
    """The stream the module docstring describes, or the reason the policy is refused."""
    running = _kept.pop(running_digest, None)
    if running is not None:
        _kept[running_digest] = running  # the most recently used but for the new one
    elif running_text is not None:
        try:
            running = _built_from(running_text, source, running_digest)
        except PolicyError:
            running = None  # it built in the sidecar and not here: keep nothing
    try:
        text = read_policy_text(source)
        digest = text_digest(source, text)
        new = _built_from(text, source, digest)
    except (PolicyError, OSError) as error:
        return pickle.dumps(("refused", str(error)))
    out = io.BytesIO()
    pickler = _Referrer(out)
    plan: list[tuple[str, bool, list[str], list[dict[str, Any]]]] = []
    if running is not None:
        for field in dataclasses.fields(Policy):
            value = getattr(new, field.name)
            if not isinstance(value, _SCALARS) and value == getattr(running, field.name):
                pickler.refs[id(value)] = ("field", field.name)
    for name, mapping_of in _SLICED.items():
        mapping = mapping_of(new)
        before = mapping_of(running) if running is not None else {}
        if running is not None and list(mapping.items()) == list(before.items()):
            pickler.refs[id(mapping)] = ("whole", name)
            continue
        pickler.refs[id(mapping)] = ("assembled", name)
        came = [(key, value) for key, value in mapping.items() if before.get(key) != value]
        removed = [key for key in before if key not in mapping]
        # The running mapping patched keeps the new one's order when what was added comes
        # last (an edit's usual shape); otherwise every entry comes, the unchanged ones as
        # references.
        patched = [key for key in before if key in mapping] + [
            k for k in mapping if k not in before
        ]
        from_running = running is not None and patched == list(mapping)
        if not from_running:
            removed, came = [], list(mapping.items())
            for key, value in came:
                if key in before and before[key] == value:
                    pickler.refs[id(value)] = ("entry", name, key)
        slices = [
            dict(came[at : at + ENTRIES_PER_SLICE]) for at in range(0, len(came), ENTRIES_PER_SLICE)
        ]
        plan.append((name, from_running, removed, slices))
    header = [(name, base, removed, len(pieces)) for name, base, removed, pieces in plan]
    pickler.dump(("built", os.getpid(), digest, header))
    for *_, slices in plan:
        for piece in slices:
            pickler.dump(piece)
    pickler.dump(new)
    return out.getvalue()


def main() -> None:
    """The builder: one request at a time until the sidecar closes the pipe."""
    os.nice(_BUILDER_NICENESS)
    # The sidecar's own signals (a terminal's Ctrl-C, a reload sent to its process group)
    # are the sidecar's to act on; the builder ends when the sidecar's pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while (request := _read_frame(sys.stdin.buffer)) is not None:
        source, running_digest, running_text = pickle.loads(request)
        _write_frame(sys.stdout.buffer, policy_stream(source, running_digest, running_text))


if __name__ == "__main__":
    main()
