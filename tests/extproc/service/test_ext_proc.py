"""The ext_proc servicer's side of a stream that ends early (extproc.service.ext_proc), on
the in-process sidecar's own request path: driven as grpc drives it, message by message."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.service.ext_proc import ExternalProcessorService
from tests.support.in_process import in_process
from tests.support.stack import EXAMPLE_POLICY
from tooling.benchmarks.driver import _headers_message

BODY = json.dumps(
    {"model": "deepseek-v4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()


async def one_request() -> AsyncIterator[pb.ProcessingRequest]:
    yield _headers_message("/v1/chat/completions", "sk-demo-standard", BODY)
    body = pb.ProcessingRequest()
    body.request_body.body = BODY
    body.request_body.end_of_stream = True
    yield body
    await asyncio.Event().wait()  # Envoy keeps the stream open until the request ends


async def test_a_routed_reply_grpc_never_took_gives_back_what_it_holds() -> None:
    """grpc closes the servicer's generator without taking the body's reply when it could
    not be written (the stream was reset while the decision waited for room): no access-log
    entry will ever name it, so its holds are ended at once; a reply grpc took waits for
    its entry as ever."""
    async with in_process(EXAMPLE_POLICY) as (sidecar, _, _):
        path = sidecar.path
        service = ExternalProcessorService(path.decider, sidecar.metrics, ends=path.recorder)
        for taken in (False, True):
            replies = service.Process(one_request(), None)  # type: ignore[arg-type]
            assert (await anext(replies)).HasField("request_headers")
            routed = await anext(replies)
            assert routed.HasField("request_body")
            if taken:  # grpc wrote it and asks for the next reply
                pending = asyncio.ensure_future(anext(replies))
                await asyncio.sleep(0)
                pending.cancel()  # then the request ends: Envoy resets the stream
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
            await replies.aclose()
            await asyncio.sleep(0.05)  # the ending task
            assert len(path.decider.inflight) == (1 if taken else 0)
