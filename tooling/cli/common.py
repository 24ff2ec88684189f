"""What several `slogate` subcommands share: a foreground command's stop signal, the vLLM
check, the POOL=NAME, --workload and --engine arguments, a call to a running sidecar's
admin API, and the window of a traffic record a command reads (--from, --to) and its
reading. The --policy and --admin arguments, which `serve` has too, are
extproc.runtime.serve_command's."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from extproc.service.traffic_read import TrafficRead


class Signalled:
    """Set by SIGTERM or SIGINT: a foreground command then stops its children itself
    (Python's default SIGTERM would end it without running its `finally`, orphaning them)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum: int, frame: object) -> None:
        self.stopping = True


def pool_cluster(value: str) -> tuple[str, str]:
    """POOL=NAME: a pool and the cluster (or InferencePool) of yours in front of it."""
    name, _, cluster = value.partition("=")
    if not name or not cluster:
        raise argparse.ArgumentTypeError(f"expected POOL=CLUSTER, got {value!r}")
    return name, cluster


def vllm_ready() -> bool:
    from tooling.stack.vllm_engine import vllm_available

    if not vllm_available():
        print(
            "slogate: vLLM is not installed here: `make vllm` (pip install -e '.[vllm]' and "
            "python -m tooling.build.vllm_install)",
            file=sys.stderr,
        )
        return False
    return True


def add_token_file(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """--token-file: the admin token a command sends (extproc.service.admin_client finds
    one without it: SLOGATE_ADMIN_TOKEN_FILE, then the file `slogate up` writes)."""
    parser.add_argument(
        "--token-file",
        type=Path,
        default=default,
        help="the admin token (default: $SLOGATE_ADMIN_TOKEN_FILE, else the file `slogate up` "
        "writes, ~/.local/state/slogate/admin-token)",
    )


def on_admin_api(
    address: str, call: Callable[[Any], Awaitable[int]], token_file: Path | None = None
) -> int:
    """`call`'s exit code, run on a channel (a grpc.aio.Channel) to the sidecar's admin API
    at `address` that sends the admin token (`token_file`, or the one found), closed after;
    a call the sidecar failed is printed, and exits 2, as does a token file that cannot be
    read."""
    import grpc

    from extproc.service import admin_client
    from extproc.service.admin_auth import AdminTokenError

    try:
        sent = admin_client.client_token_file(token_file)
        token = admin_client.client_token(sent)
    except AdminTokenError as error:
        print(f"slogate: the admin token: {error}", file=sys.stderr)
        return 2

    async def run() -> int:
        channel = admin_client.channel(address, token)
        try:
            return await call(channel)
        except grpc.aio.AioRpcError as error:
            print(f"slogate: {address}: {error.code().name}: {error.details()}", file=sys.stderr)
            if error.code() is grpc.StatusCode.UNAUTHENTICATED:
                print(
                    f"slogate: sent the token in {sent}"
                    if sent is not None
                    else "slogate: no admin token found to send",
                    file=sys.stderr,
                )
            return 2
        finally:
            await channel.close()

    return asyncio.run(run())


def add_workload(parser: argparse.ArgumentParser, default: str) -> None:
    """--workload: the workload a command plays, by name or file."""
    parser.add_argument(
        "--workload",
        default=default,
        help="a name in sim/workloads/, or a workload file (e.g. slogate workload fit's)",
    )


def add_engine(parser: argparse.ArgumentParser, vllm: str) -> None:
    """--engine: what serves the local stack's default pool (LocalStack.engine), simulated
    engines or a real vLLM; `vllm` says what the real one means to this command."""
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim", help=f"vllm: {vllm}")


def add_time_window(parser: argparse.ArgumentParser) -> None:
    """--from and --to: the part of a traffic record a command reads."""
    parser.add_argument("--from", dest="from_t", default=None, help="Unix seconds or ISO time")
    parser.add_argument("--to", dest="to_t", default=None, help="Unix seconds or ISO time")


def time_window(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """--from and --to in Unix seconds (None: open); ValueError when one is not a time."""
    from extproc.service.traffic_read import parse_time

    from_s = None if args.from_t is None else parse_time(args.from_t)
    return from_s, None if args.to_t is None else parse_time(args.to_t)


def read_record(
    paths: list[Path], from_s: float | None, to_s: float | None, name: str
) -> TrafficRead | None:
    """The traffic record in `paths` between the two times, each problem in it printed;
    None (printed why) when no record file was found."""
    from extproc.service.traffic_read import read_traffic

    read = read_traffic(paths, from_s, to_s)
    for problem in read.problems:
        print(f"{name}: {problem}", file=sys.stderr)
    if not read.files:
        print(f"{name}: no traffic record files found", file=sys.stderr)
        return None
    return read
