"""`slogate bench stages --in-process`: the request path's CPU per request without gRPC.

The sidecar's own servicers (ExternalProcessorService, AccessLogService) driven in process
with the messages Envoy sends: the header message, the body message (`one_message`: the body
alone, its headers forwarded as metadata, as with `data_path.messages: one`), and the request's
access-log entry (in batches of four, as Envoy's buffer flushes them at this rate). The
process's CPU time per phase (time.process_time_ns: a count handed to a worker thread is
in it; a neighbour's load slows it far less than a wall clock); then the same requests
again under cProfile (deterministic: every call counted), whose own time
tooling.benchmarks.stage_map groups into its STAGES.

Runs as a script too (`python request_path.py PROFILE REQUESTS [DUMP [one]]`, printing
JSON), which is how `--product-tree` runs another checkout's request path (a baseline
commit's) with it.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
from google.protobuf import duration_pb2

from extproc.envoypb.envoy.config.core.v3 import base_pb2 as core
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request import contract
from extproc.request.contract import FORWARDED_NAMESPACE, METADATA_NAMESPACE, TRACKING_ID_FIELD
from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.native import exact_counter
from extproc.runtime.sidecar import Sidecar
from extproc.service.access_log import AccessLogService
from extproc.service.ext_proc import ExternalProcessorService
from tooling.benchmarks import overhead
from tooling.benchmarks.bodies import profile_bodies
from tooling.benchmarks.levers import BENCH_KEY, LEVERS, bench_policy

PHASES = ("request_headers", "request_body", "access_log")
# The proof an entry carries of its id; None in a checkout (`--product-tree`) from before
# the proofs, whose entries carry none.
PROOF_FIELD: str | None = getattr(contract, "USAGE_PROOF_FIELD", None)
ENTRIES_PER_MESSAGE = 4


def _header_fields(body: bytes, serial: int) -> dict[str, str]:
    return {
        ":method": "POST",
        ":path": "/v1/chat/completions",
        ":authority": "bench",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "authorization": f"Bearer {BENCH_KEY}",
        "x-request-id": f"bench-{serial}",
    }


def _headers(body: bytes, serial: int) -> pb.ProcessingRequest:
    fields = _header_fields(body, serial)
    header_map = core.HeaderMap(
        headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in fields.items()]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map))


def _body_alone(body: bytes, serial: int) -> pb.ProcessingRequest:
    """The body message of one message per request: the headers the sidecar reads ride
    along as metadata (tooling.render.envoy_config.one_message's header_to_metadata)."""
    request = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    forwarded = request.metadata_context.filter_metadata[FORWARDED_NAMESPACE].fields
    for name, value in _header_fields(body, serial).items():
        if name in contract.FORWARDED_HEADERS:
            forwarded[name].string_value = value
    return request


def _entry(
    tracking: str, proof: str | None, prompt_tokens: int
) -> accesslog_pb2.HTTPAccessLogEntry:
    """What Envoy logs for a routed request (tooling/render/envoy_config: the sidecar's
    tracking id and its proof in metadata, the usage tap's custom tags). `proof` None: a
    checkout whose sidecar gives none (a baseline before the proofs)."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    common = entry.common_properties
    fields = common.metadata.filter_metadata[METADATA_NAMESPACE].fields
    fields[TRACKING_ID_FIELD].string_value = tracking
    if PROOF_FIELD is not None and proof is not None:
        fields[PROOF_FIELD].string_value = proof
    common.duration.CopyFrom(duration_pb2.Duration(nanos=120_000_000))
    common.custom_tags["prompt_tokens"] = str(prompt_tokens)
    common.custom_tags["completion_tokens"] = "64"
    common.custom_tags["ttft_ms"] = "35"
    common.upstream_remote_address.socket_address.address = "127.0.0.1"
    common.upstream_remote_address.socket_address.port_value = 18001
    entry.response.response_code.value = 200
    entry.response.response_code_details = "via_upstream"
    return entry


async def _messages(items: Sequence[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


class _Path:
    """One sidecar's servicers, driven as Envoy drives them."""

    def __init__(self, work: Path, one_message: bool = False) -> None:
        lever = LEVERS["one_message"] if one_message else None
        self.sidecar = Sidecar(bench_policy(work, lever), metrics_port=None, admin_address=None)
        self.one_message = one_message
        path = self.sidecar.path
        path.counter.use(exact_counter(self.sidecar.policy().counting.engine))
        self.ext_proc = ExternalProcessorService(
            path.decider,
            self.sidecar.metrics,
            self.sidecar.observers.watching(),
            ends=path.recorder,
        )
        self.access_log = AccessLogService(path.recorder)
        self.ext_proc_decider_inflight = path.decider.inflight
        self.context = cast(grpc.aio.ServicerContext, None)  # never read on this path
        self.pending: list[accesslog_pb2.HTTPAccessLogEntry] = []

    async def request(self, body: bytes, serial: int, cpu: dict[str, list[int]]) -> None:
        """One request's two messages (each timed; with one message, the body's time is
        the request_body phase's, its header phase included), its entry kept for the next
        batch."""
        replies: list[pb.ProcessingResponse] = []
        if self.one_message:
            incoming = [_body_alone(body, serial)]
            cpu[PHASES[0]].append(0)
        else:
            incoming = [_headers(body, serial), pb.ProcessingRequest(request_body=pb.HttpBody(
                body=body, end_of_stream=True
            ))]  # fmt: skip
        stream = self.ext_proc.Process(_messages(incoming), self.context)
        for phase in PHASES[2 - len(incoming) : 2]:
            started = time.process_time_ns()
            replies.append(await anext(stream))
            cpu[phase].append(time.process_time_ns() - started)
        reply = replies[-1]
        if reply.HasField("immediate_response"):
            raise RuntimeError(f"refused: {reply.immediate_response.body!r}")
        fields = reply.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
        tracking = fields[TRACKING_ID_FIELD].string_value
        proof = None if PROOF_FIELD is None else fields[PROOF_FIELD].string_value
        # The engine's prompt count agrees with the sidecar's (a key whose counts the
        # engine kept exceeding would be corrected, which is not this benchmark's path).
        inflight = self.ext_proc_decider_inflight
        decision = inflight.pop(tracking)
        assert decision is not None
        inflight.put(tracking, decision)
        self.pending.append(_entry(tracking, proof, decision.prompt_tokens))
        if len(self.pending) == ENTRIES_PER_MESSAGE:
            await self.flush(cpu)

    async def flush(self, cpu: dict[str, list[int]]) -> None:
        if not self.pending:
            return
        message = als_pb2.StreamAccessLogsMessage()
        message.http_logs.log_entry.extend(self.pending)
        entries = len(self.pending)
        self.pending.clear()
        started = time.process_time_ns()
        await self.access_log.StreamAccessLogs(_messages([message]), self.context)
        spent = time.process_time_ns() - started
        cpu["access_log"].extend([spent // entries] * entries)


async def _measure(
    profile: str, requests: int, profiled: Path | None, one_message: bool
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-request-path-"))
    path = _Path(work, one_message)
    if profile == "small":  # bench overhead's 4 KB chat body, the same each time
        bodies = [overhead._request_body().encode()] * requests
    else:
        generated = profile_bodies(profile, DeepSeekBpe())
        bodies = [json.dumps(b).encode() for b, _ in zip(generated, range(requests), strict=False)]
    cpu: dict[str, list[int]] = {phase: [] for phase in PHASES}
    for serial, body in enumerate(bodies[: min(200, len(bodies))]):  # warm-up: caches, imports
        await path.request(body, -serial - 1, cpu)
    await path.flush(cpu)
    cpu = {phase: [] for phase in PHASES}
    for serial, body in enumerate(bodies):
        await path.request(body, serial, cpu)
    await path.flush(cpu)
    if profiled is not None:  # the same requests again, every call counted
        profiler = cProfile.Profile()
        profiler.enable()
        ignored: dict[str, list[int]] = {phase: [] for phase in PHASES}
        for serial, body in enumerate(bodies):
            await path.request(body, len(bodies) + serial, ignored)
        await path.flush(ignored)
        profiler.disable()
        profiler.dump_stats(str(profiled))
    # Entries that settled nothing would time the refusal, not the settlement.
    registry = path.sidecar.metrics.registry
    if registry.get_sample_value("slogate_access_log_unproven_total"):
        raise RuntimeError("access-log entries without their proof: nothing was settled")
    await path.sidecar.stop()
    return {
        phase: {
            "mean_us": statistics.fmean(values) / 1000,
            "p50_us": statistics.median(values) / 1000,
        }
        for phase, values in cpu.items()
    }


def measure(
    profile: str,
    requests: int,
    product_tree: Path | None = None,
    profiled: Path | None = None,
    one_message: bool = False,
) -> dict[str, Any]:
    """Per phase, the CPU µs per request (mean and median); this checkout's request path,
    or (`product_tree`) another's, run as a script with that checkout first on its path;
    `one_message`: Envoy's one message per request (the body alone)."""
    if product_tree is None:
        return asyncio.run(_measure(profile, requests, profiled, one_message))
    # Run by path from the checkout's root: its packages first (the current directory
    # leads sys.path with -c), and this folder kept off sys.path (its profile.py would
    # shadow the standard library's, which cProfile imports).
    launch = (
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    argv = [sys.executable, "-c", launch, __file__, profile, str(requests), str(profiled or "")]
    if one_message:
        argv.append("one")
    env = {**os.environ, "PYTHONPATH": str(product_tree)}
    done = subprocess.run(
        argv, env=env, cwd=product_tree, capture_output=True, text=True, check=True
    )
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


def own_time(path: Path, stage_of: Any) -> dict[str, float]:
    """A cProfile dump's own time per stage (seconds). A built-in's (C: the tokenizer, numpy,
    msgspec, protobuf; cProfile files them under "~") goes to the stages of the functions
    that called it, as much as each call site spent in it."""
    stats = pstats.Stats(str(path))
    own: dict[str, float] = {}
    for (file, _line, _name), (_, _, tottime, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if file != "~" or not callers:
            stage = stage_of(file)
            own[stage] = own.get(stage, 0.0) + tottime
            continue
        for (caller_file, _, _), site in callers.items():
            stage = stage_of(caller_file)
            own[stage] = own.get(stage, 0.0) + site[2]
    return own


if __name__ == "__main__":
    name, count, dump = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""
    one = len(sys.argv) > 4 and sys.argv[4] == "one"
    print(json.dumps(measure(name, count, None, Path(dump) if dump else None, one)))
