"""Network namespaces for the regions lab: created, joined by veth pairs, cut, torn down.

What lives here: `NetLab` (namespaces and veth pairs whose every name starts with the lab's
own prefix, commands run inside a namespace with `ip netns exec`, a link cut and healed by
setting one end down and up, and `close`, which removes all of it by name, idempotently,
also when a start failed half-way), `netns_unavailable` (why namespaces cannot be used
here, or None) and `free_subnet` (a 10.x.0.0/16 no root address uses). What must not live
here: what runs inside (tooling.stack.region_host, tooling.stack.delay_link) and the
scenario (tooling.benchmarks.regions).

A cut link's end is set down, not its route removed: packets are dropped and TCP
connections hang (new connects time out), as on a real cut, instead of failing fast with
"network unreachable". Every process started inside is kept by pid and stopped by pid;
`close` also kills (by pid) whatever is still inside the lab's namespaces before deleting
them, since deleting a namespace does not end its processes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from extproc.runtime.processes import ManagedProcess

ROOT = None  # the root namespace, where a veth end may stay


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def netns_unavailable() -> str | None:
    """Why this machine cannot run the lab (not root, no `ip`, namespaces refused); None
    when it can. Tries one namespace of its own and deletes it."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"slprobe-{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add refused: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    veth = f"slp{secrets.token_hex(3)}"
    made = _ip("link", "add", f"{veth}a", "type", "veth", "peer", "name", f"{veth}b", check=False)
    if made.returncode != 0:
        return f"veth pairs refused: {made.stderr.strip()}"
    _ip("link", "del", f"{veth}a", check=False)
    return None


def free_subnet() -> int:
    """A second octet X such that no address of the root namespace is in 10.X.0.0/16, so two
    labs (or the host's own networks) never share an edge subnet."""
    shown = _ip("-o", "-4", "addr", "show").stdout
    used = {
        int(word.split(".")[1])
        for line in shown.splitlines()
        for word in line.split()
        if word.startswith("10.") and word.count(".") == 3
    }
    for octet in range(200, 255):
        if octet not in used:
            return octet
    raise NetnsError("no free 10.X.0.0/16 in 10.200-10.254 for the lab's links")


@dataclass(frozen=True, slots=True)
class Veth:
    """A veth pair: end `a` in namespace `ns_a` (None: the root one) with `addr_a`, end `b`
    likewise; addresses are /24s."""

    name_a: str
    ns_a: str | None
    addr_a: str
    name_b: str
    ns_b: str | None
    addr_b: str


@dataclass
class NetLab:
    """The lab's namespaces and links; `close` (also at exit) removes them by name."""

    prefix: str = field(default_factory=lambda: f"sl{secrets.token_hex(2)}")
    namespaces: list[str] = field(default_factory=list)
    links: list[Veth] = field(default_factory=list)
    processes: list[ManagedProcess] = field(default_factory=list)
    _closed: bool = False

    def __post_init__(self) -> None:
        if len(self.prefix) > 7:  # an interface name holds 15 bytes: prefix + "v" + nn + a/b
            raise ValueError(f"lab prefix {self.prefix!r} longer than 7 characters")
        atexit.register(self.close)

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def namespace(self, name: str) -> str:
        """A new namespace `<prefix>-<name>`, its loopback up; its full name."""
        full = f"{self.prefix}-{name}"
        _ip("netns", "add", full)
        self.namespaces.append(full)
        _ip("-n", full, "link", "set", "lo", "up")
        return full

    def veth(self, ns_a: str | None, addr_a: str, ns_b: str | None, addr_b: str) -> Veth:
        """A veth pair between two namespaces (None: the root one), each end with its
        address (a /24) and up."""
        index = len(self.links)
        link = Veth(
            f"{self.prefix}v{index}a", ns_a, addr_a, f"{self.prefix}v{index}b", ns_b, addr_b
        )
        _ip("link", "add", link.name_a, "type", "veth", "peer", "name", link.name_b)
        self.links.append(link)
        for name, ns, addr in ((link.name_a, ns_a, addr_a), (link.name_b, ns_b, addr_b)):
            if ns is not None:
                _ip("link", "set", name, "netns", ns)
            _ip(*_in(ns), "addr", "add", f"{addr}/24", "dev", name)
            _ip(*_in(ns), "link", "set", name, "up")
        return link

    def argv(self, ns: str | None, argv: Sequence[str]) -> list[str]:
        """`argv` run inside namespace `ns` (`ip netns exec` execs it: the pid is its own)."""
        return list(argv) if ns is None else ["ip", "netns", "exec", ns, *argv]

    def run(self, ns: str | None, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """A short command inside `ns`, its output captured."""
        return subprocess.run(
            self.argv(ns, argv), capture_output=True, text=True, check=False, timeout=60
        )

    def start(
        self,
        ns: str | None,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        """A long-lived process inside `ns`, kept (by pid) to be stopped by `close`."""
        proc = ManagedProcess(name, self.argv(ns, argv), log_dir, env).start()
        self.processes.append(proc)
        return proc

    def cut(self, link: Veth) -> None:
        """Partition: end `b` of the link down (its packets dropped; connections hang)."""
        _ip(*_in(link.ns_b), "link", "set", link.name_b, "down")

    def heal(self, link: Veth) -> None:
        """End `b` up again, with its address and route as before."""
        _ip(*_in(link.ns_b), "link", "set", link.name_b, "up")

    def close(self) -> None:
        """Stop the lab's processes, kill (by pid) what else is left in its namespaces,
        delete them and any link end left in the root namespace. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for proc in reversed(self.processes):
            with contextlib.suppress(Exception):
                proc.stop(timeout_s=10.0)
        for ns in self.namespaces:
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        for link in self.links:  # deleting one end deletes its peer; a gone one: no error
            for name, where in ((link.name_a, link.ns_a), (link.name_b, link.ns_b)):
                if where is None:
                    _ip("link", "del", name, check=False)
        atexit.unregister(self.close)

    def leftovers(self) -> list[str]:
        """Namespaces and root interfaces still named with the lab's prefix (after close:
        none)."""
        names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
        links = [
            line.split(":")[1].strip().split("@")[0]
            for line in _ip("-o", "link", "show").stdout.splitlines()
            if ":" in line
        ]
        return [n for n in names + links if n.startswith(self.prefix)]


def _in(ns: str | None) -> list[str]:
    return [] if ns is None else ["-n", ns]
