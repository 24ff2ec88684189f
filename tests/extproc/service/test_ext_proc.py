"""The ext_proc servicer's side of a stream that ends early (extproc.service.ext_proc), on
the in-process sidecar's own request path: driven as grpc drives it, message by message."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import grpc

from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import (
    ProcessingMode,
)
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3.external_processor_pb2_grpc import (
    ExternalProcessorStub,
)
from extproc.service.ext_proc import ExternalProcessorService
from tests.support.in_process import in_process
from tests.support.stack import EXAMPLE_POLICY
from tooling.benchmarks.driver import _headers_message
from tooling.fuzz.seeds import CHAT, one_message

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


async def test_messages_envoy_never_sends_are_answered_and_the_stream_goes_on() -> None:
    """Found by the fuzzer (tooling.fuzz), over real gRPC:
    - a message naming no phase has no reply in kind: the pass-through reply's builder
      raised on it, which the two-message mode turned into the catch-all 500 with an
      exception logged, and which ended the stream in streaming mode. It gets a typed 500
      (unknown_ext_proc_message), and the next message its answer;
    - str.isdigit() holds for "²", which int() refuses: a response's `:status` of it ended
      the stream in streaming mode. It reads as no status;
    - a body that came first in streaming mode (Envoy skipping the headers) was answered
      with a headers reply too, for a phase never sent."""
    streaming = pb.ProtocolConfiguration(request_body_mode=ProcessingMode.FULL_DUPLEX_STREAMED)
    then = pb.ProcessingRequest(response_headers=pb.HttpHeaders(end_of_stream=True))
    superscript = pb.ProcessingRequest(protocol_config=streaming)
    superscript.response_headers.headers.headers.add(key=":status", raw_value="²".encode())
    async with (
        in_process(EXAMPLE_POLICY) as (_, _, address),
        grpc.aio.insecure_channel(f"127.0.0.1:{address.grpc_port}") as channel,
    ):
        stub = ExternalProcessorStub(channel)
        for config in (None, streaming):
            first = (
                pb.ProcessingRequest(protocol_config=config) if config else pb.ProcessingRequest()
            )
            replies = [reply async for reply in stub.Process(iter([first, then]))]
            assert [r.WhichOneof("response") for r in replies] == [
                "immediate_response",
                "response_headers",
            ]
            immediate = replies[0].immediate_response
            reasons = [h.header.raw_value for h in immediate.headers.set_headers]
            assert immediate.status.code == 500 and b"unknown_ext_proc_message" in reasons
        replies = [reply async for reply in stub.Process(iter([superscript]))]
        assert [r.WhichOneof("response") for r in replies] == ["response_headers"]
        # The body first, in streaming mode (no header message, the headers forwarded as
        # metadata): no headers reply, the decision's id on the body's first chunk.
        (body_first,) = one_message("/v1/chat/completions", "sk-demo-standard", CHAT)
        body_first.protocol_config.CopyFrom(streaming)
        replies = [reply async for reply in stub.Process(iter([body_first]))]
        assert [r.WhichOneof("response") for r in replies] == ["request_body"]
        assert replies[0].dynamic_metadata.fields["slogate"].struct_value.fields["id"]
