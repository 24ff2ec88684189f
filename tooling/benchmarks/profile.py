"""Where the sidecar's time goes under load: py-spy samples, summarised.

What lives here: `record` (py-spy on a running process for a while, raw collapsed stacks)
and `summarise` (each sample given to the first part of the request path its stack passes
through, and the busiest leaf functions). py-spy samples without stopping the process
(`--nonblocking`); it sees Python frames, so time inside a C or Rust extension (the BPE,
cygrpc) is charged to the Python line that called it, which is the attribution wanted here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    markers: tuple[str, ...]  # a stack passing through a frame naming any of these


# First match wins, so the specific parts come before the machinery they run on: a count
# done in a worker thread is counting, not "thread pool".
PARTS = (
    Part("prompt counting (BPE)", ("extproc/request/tokens/",)),
    Part("metrics (prometheus_client)", ("prometheus_client/",)),
    Part(
        "access log and settling",
        ("extproc/service/access_log.py", "extproc/service/outcomes.py", "decision_log.py"),
    ),
    Part("body parsing and rewriting", ("extproc/request/bodies/",)),
    Part("admission (budgets, breaker, KV)", ("admission/", "budget/", "breaker/")),
    Part("identity, routing, flow", ("extproc/request/",)),
    Part("protobuf replies", ("extproc/service/replies.py", "google/protobuf/")),
    Part("ext_proc service", ("extproc/service/",)),
    Part("grpc.aio / cygrpc", ("grpc/", "grpc_")),
    # What grpc.aio does in C (cygrpc) runs inside asyncio callbacks and in gRPC's own
    # threads: py-spy sees only the Python frame that entered it (ENVOY-NOTES: the
    # per-stream cost sits there).
    Part("event loop (asyncio callbacks: cygrpc inside)", ("asyncio/",)),
    Part("threads in C (gRPC core, idle counting workers)", ("threading.py", "concurrent/")),
)
OTHER = "other"
_OURS = ("extproc/", "admission/", "budget/", "breaker/", "policy/", "tooling/")


def _binary() -> str | None:
    """py-spy on PATH, or beside this Python (a virtual environment's bin/, which a
    `.venv/bin/slogate` run does not put on PATH)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def available() -> bool:
    return _binary() is not None


def record(pid: int, duration_s: float, out: Path, rate_hz: int = 250) -> subprocess.Popen[bytes]:
    """Start sampling `pid` for `duration_s` into `out` (raw collapsed stacks); wait on it."""
    seconds = str(max(1, round(duration_s)))
    argv = [_binary() or "py-spy", "record", "--pid", str(pid), "--duration", seconds]
    argv += ["--rate", str(rate_hz), "--format", "raw", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def summarise(path: Path, top: int = 12, parts_of: Sequence[Part] = PARTS) -> dict[str, object]:
    """Samples per part of the request path (shares of all samples) and the leaf functions
    with the most samples; `parts_of`: another program's parts (LiteLLM's)."""
    parts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for frames, count in _stacks(path):
        total += count
        joined = ";".join(frames)
        part = next((p.name for p in parts_of if any(m in joined for m in p.markers)), OTHER)
        parts[part] += count
        leaves[_short(frames[-1])] += count
    return {
        "samples": total,
        "parts": {name: round(n / total, 4) for name, n in parts.most_common()} if total else {},
        "leaves": {name: round(n / total, 4) for name, n in leaves.most_common(top)}
        if total
        else {},
    }


def _short(frame: str) -> str:
    """A py-spy frame with its path cut to the package: `count (extproc/.../bpe.py:120)`."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for package in _OURS:
        if f"/{package}" in where:
            where = where[where.index(f"/{package}") + 1 :]
            break
    else:
        for root in ("site-packages/", "lib/python3"):
            if root in where:
                where = where.split(root, 1)[1]
                break
    return f"{name} ({where})" if where else name


def table(summaries: dict[str, dict[str, object]]) -> str:
    """One table per body profile: its parts, then its busiest leaves."""
    out = []
    for profile, summary in summaries.items():
        out.append(f"### {profile} ({summary['samples']} samples)\n")
        out.append("| part of the request path | share of samples |\n| --- | ---: |")
        parts = summary["parts"]
        assert isinstance(parts, dict)
        out += [f"| {name} | {100 * share:.1f}% |" for name, share in parts.items()]
        out.append("\n| busiest leaf function | share |\n| --- | ---: |")
        leaves = summary["leaves"]
        assert isinstance(leaves, dict)
        out += [f"| `{name}` | {100 * share:.1f}% |" for name, share in leaves.items()]
        out.append("")
    return "\n".join(out)
