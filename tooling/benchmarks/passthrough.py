"""A minimal pass-through ext_proc: the baseline slogate's overhead is measured against.

It answers every phase with an empty CONTINUE and does nothing else: no parsing, no
metrics. `python -m tooling.benchmarks.passthrough --port 0` prints its ready line.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc.service.replies import passthrough_reply


class PassThrough(pb_grpc.ExternalProcessorServicer):
    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for request in request_iterator:
            yield passthrough_reply(request)


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.so_reuseport", 0),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(PassThrough(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"passthrough ext_proc ready: grpc {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
