"""The lab's network namespaces (tooling.stack.netns): two namespaces joined by a veth
pair, TCP across, a cut that blocks it, a heal that restores it, nothing left after."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tooling.stack.netns import NetLab, free_subnet, netns_unavailable

ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7070)); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(100)); c.close()
"""

CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7070), timeout=1.5) as c:
        c.sendall(b"across"); print(c.recv(100).decode())
except OSError as err:
    print("failed", type(err).__name__)
"""


@pytest.fixture
def lab() -> Iterator[NetLab]:
    # Asked here, not at collection: the probe makes (and deletes) a namespace of its own.
    why_not = netns_unavailable()
    if why_not is not None:
        pytest.skip(f"no network namespaces here: {why_not}")
    with NetLab() as made:
        yield made


def test_tcp_crosses_a_veth_is_cut_healed_and_nothing_is_left(lab: NetLab, tmp_path: Path) -> None:
    octet = free_subnet()
    a, b = lab.namespace("a"), lab.namespace("b")
    link = lab.veth(a, f"10.{octet}.1.1", b, f"10.{octet}.1.2")
    server = lab.start(b, "echo", [sys.executable, "-c", ECHO_SERVER, link.addr_b], tmp_path)
    server.wait_for_line("listening")

    def call() -> str:
        return lab.run(a, [sys.executable, "-c", CLIENT, link.addr_b]).stdout.strip()

    assert call() == "across"
    lab.cut(link)
    assert call().startswith("failed")
    lab.heal(link)
    assert call() == "across"
    assert set(lab.leftovers()) >= {a, b}

    lab.close()
    assert lab.leftovers() == []
    assert not server.running()
    lab.close()  # idempotent
