"""One fuzz case end to end, and a run of them bounded in time (`slogate fuzz`).

A case is sent to the sidecar (tooling.fuzz.target), its replies checked
(tooling.fuzz.properties), then what it routed is settled as Envoy's access log would
settle it and what the sidecar still holds is read back: anything above what it held
before the case is a leaked hold. An access-log case first routes real requests, so its
entries (built or mutated) can name ids the sidecar issued. `still_serving`: a plain
request after the run is routed and settled as ever.
"""

from __future__ import annotations

import base64
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as seeded

from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import METADATA_NAMESPACE, REASON_HEADER, TRACKING_ID_FIELD
from tooling.fuzz.access_log_cases import access_log_streams
from tooling.fuzz.cases import LogCase, StreamCase
from tooling.fuzz.ext_proc_cases import ext_proc_streams
from tooling.fuzz.properties import Finding, stream_findings
from tooling.fuzz.seeds import API_KEYS, CHAT, ROUTED_ID, two_message
from tooling.fuzz.target import FuzzTarget, routed, routed_ids

# What the checks may wait for a case's holds to be given back (a stream's end is settled
# in a task of its own): a liveness bound, not a timing.
DRAIN_S = 10.0

# Hypothesis's health checks judge generation speed, which a loaded machine makes slow.
FUZZ_SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _leaks(target: FuzzTarget, before: dict[str, int]) -> list[Finding]:
    left = target.drained(DRAIN_S)
    grown = {name: n for name, n in left.items() if n > before.get(name, 0)}
    return [Finding("leaked_hold", str(grown))] if grown else []


def _logged(target: FuzzTarget) -> list[Finding]:
    records, target.errors.records = target.errors.records, []
    return [Finding("error_logged", record[:300]) for record in records]


def _settle_rest(target: FuzzTarget) -> None:
    """End every decision still in flight: what a case left is not the next one's."""
    target.end_in_flight()


def answers(replies: Sequence[bytes]) -> list[str]:
    """What each reply was, for a run's tally of how deep its inputs reached: "routed",
    "refused STATUS REASON", or the phase it answered in kind."""
    out = []
    for data in replies:
        try:
            reply = pb.ProcessingResponse.FromString(data)
        except Exception:
            continue
        which = reply.WhichOneof("response") or "timeout override"
        if which == "immediate_response":
            immediate = reply.immediate_response
            reason = next(
                (
                    h.header.raw_value.decode()
                    for h in immediate.headers.set_headers
                    if h.header.key == REASON_HEADER
                ),
                "",
            )
            which = f"refused {immediate.status.code} {reason}"
        elif routed_ids([data]):
            which = "routed"
        out.append(which)
    return out


def ext_proc_case(
    target: FuzzTarget,
    case: StreamCase,
    tally: Counter[str] | None = None,
    crowded: bool = False,
) -> list[Finding]:
    """`crowded`: the pools' one batch slot each (fuzz_policy's crowded policy) taken by a
    request held through the case, so that what the case routes waits in the waiting
    room (and leaves it by its timeout, or by the client's reset)."""
    before = target.held()
    target.errors.records = []
    holders: list[struct_pb2.Struct] = []
    if crowded:
        for max_tokens in (16, 40_000):  # the default pool's slot, the long pool's
            holder = [
                m.SerializeToString()
                for m in two_message(
                    "/v1/chat/completions", API_KEYS[1], {**CHAT, "max_tokens": max_tokens}
                )
            ]
            holders += routed(target.ext_proc(holder).replies)
    record = target.ext_proc(case.messages, case.cancel_after)
    if tally is not None:
        tally.update(answers(record.replies))
    found = stream_findings(case.messages, record.replies, record.status, record.cancelled)
    target.settle(routed(record.replies) + holders)
    if record.cancelled:
        # Replies grpc wrote before the reset reached Envoy, which logs them as ever; the
        # client here never read them. What a decision still underway held is the
        # servicer's to give back (abandoned or never delivered).
        time.sleep(0.02)
        _settle_rest(target)
    found += _leaks(target, before)
    _settle_rest(target)
    return found + _logged(target)


def _with_ids(message: bytes, ids: Sequence[str]) -> bytes:
    """The placeholders of tooling.fuzz.seeds replaced by ids the sidecar issued, where the
    message still parses (else it goes as it is)."""
    try:
        parsed = als_pb2.StreamAccessLogsMessage.FromString(message)
    except Exception:
        return message
    for entry in parsed.http_logs.log_entry:
        namespace = entry.common_properties.metadata.filter_metadata.get(METADATA_NAMESPACE)
        if namespace is None or TRACKING_ID_FIELD not in namespace.fields:
            continue
        value = namespace.fields[TRACKING_ID_FIELD]
        for index, tracking in enumerate(ids):
            if value.string_value == ROUTED_ID.format(index):
                value.string_value = tracking
    return parsed.SerializeToString()


def _routed(target: FuzzTarget, count: int) -> list[str]:
    ids: list[str] = []
    for index in range(count):
        key = API_KEYS[index % 3]  # not sk-demo-small: its budget refuses most of them
        messages = [m.SerializeToString() for m in two_message("/v1/chat/completions", key, CHAT)]
        ids += routed_ids(target.ext_proc(messages).replies)
    return ids


def access_log_case(target: FuzzTarget, case: LogCase) -> list[Finding]:
    before = target.held()
    target.errors.records = []
    ids = _routed(target, case.routed)
    messages = [_with_ids(message, ids) for message in case.messages]
    record = target.access_log(messages)
    found = []
    if record.status == "DEADLINE_EXCEEDED":
        found.append(Finding("stall", "access-log stream"))
    elif record.status != "OK" and all(_parses(m) for m in messages):
        found.append(Finding("stream_error", f"access log: {record.status} {record.details}"))
    _settle_rest(target)  # the ids the entries did not settle (unknown ones do nothing)
    found += _leaks(target, before)
    return found + _logged(target)


def _parses(message: bytes) -> bool:
    try:
        als_pb2.StreamAccessLogsMessage.FromString(message)
    except Exception:
        return False
    return True


def still_serving(target: FuzzTarget) -> list[Finding]:
    """A plain chat after the fuzz: routed (200, an id), settled, nothing left held."""
    before = target.held()
    messages = [
        m.SerializeToString() for m in two_message("/v1/chat/completions", API_KEYS[1], CHAT)
    ]
    record = target.ext_proc(messages)
    requests = routed(record.replies)
    found = stream_findings(messages, record.replies, record.status, False)
    if len(requests) != 1:
        detail = f"{record.status}: {len(record.replies)} replies, {len(requests)} routed"
        found.append(Finding("not_serving", detail))
    target.settle(requests)
    return found + _leaks(target, before)


@dataclass(slots=True)
class Report:
    """A run: inputs tried per kind, and findings by kind (how often, the first seen)."""

    tried: dict[str, int] = field(default_factory=lambda: {"ext_proc": 0, "access_log": 0})
    findings: dict[str, list[str]] = field(default_factory=dict)  # kind -> first details
    # kind -> the first case's messages, as sent (what a regression test replays)
    cases: dict[str, tuple[str, tuple[bytes, ...]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    answers: Counter[str] = field(default_factory=Counter)  # what the replies were
    seconds: float = 0.0

    def add(
        self, found: Sequence[Finding], origin: str, sample: str, sent: tuple[bytes, ...] = ()
    ) -> None:
        for finding in found:
            self.cases.setdefault(finding.kind, (origin, sent))
            self.counts[finding.kind] = self.counts.get(finding.kind, 0) + 1
            firsts = self.findings.setdefault(finding.kind, [])
            if len(firsts) < 3:
                firsts.append(f"{finding.detail} [{origin}] {sample[:300]}")

    def as_json(self) -> dict[str, object]:
        """The report, each finding's first case as base64 messages (to replay)."""
        return {
            "seconds": round(self.seconds, 1),
            "tried": self.tried,
            "answers": dict(self.answers.most_common()),
            "findings": {
                kind: {
                    "count": self.counts[kind],
                    "first": self.findings[kind],
                    "case": {
                        "origin": self.cases[kind][0],
                        "messages": [base64.b64encode(m).decode() for m in self.cases[kind][1]],
                    },
                }
                for kind in sorted(self.counts)
            },
        }

    def lines(self) -> list[str]:
        total = sum(self.tried.values())
        out = [
            f"{total} inputs in {self.seconds:.0f} s: {self.tried['ext_proc']} ext_proc streams,"
            f" {self.tried['access_log']} access-log streams",
        ]
        common = ", ".join(f"{kind} {n}" for kind, n in self.answers.most_common(12))
        out.append(f"replies: {common}")
        if not self.counts:
            out.append(
                "found nothing: every stream answered or closed, every reply valid, no hold left"
            )
        for kind, count in sorted(self.counts.items()):
            out.append(f"{kind}: {count}")
            out.extend(f"  e.g. {first}" for first in self.findings[kind])
        return out


def fuzz_policy(policy: Path, scratch: Path, crowded: bool = False) -> Path:
    """`policy` as the fuzz sidecar runs it, written into `scratch`: its pools' engines
    neither scraped nor probed (none runs; capacity comes from the policy). `crowded`: each pool
    one batch slot, every tier's share of it whole, every tier waits up to 0.3 s."""
    raw = yaml.safe_load(policy.read_text())
    raw.setdefault("breaker", {})["scrape_metrics"] = False
    # Nor probed: a pool of dead engines goes to L3 a few seconds in, which would make what
    # a case meets depend on when it runs.
    raw.setdefault("engines", {}).setdefault("health", {})["probes"] = False
    if crowded:
        for pool in raw.get("pools", {}).values():
            pool["max_num_seqs"] = 1
        tiers = ("critical", "standard", "sheddable")
        raw["breaker"]["kv_shares"] = dict.fromkeys(tiers, 1.0)
        raw.setdefault("waiting_room", {})["max_wait_s"] = dict.fromkeys(tiers, 0.3)
    path = scratch / policy.name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def campaign(
    policy: Path,
    seconds: float,
    seed: int = 0,
    batch: int = 50,
    progress: Callable[[str], None] | None = None,
    crowded: bool = False,
) -> Report:
    """Fuzz a sidecar of `policy` for about `seconds`: batches of ext_proc and access-log
    cases, each batch from its own seed (seed, seed + 1, ...), findings collected rather
    than stopping at the first; then the plain request that says it still serves."""
    report = Report()
    target = FuzzTarget(policy)
    target.start()
    started = time.monotonic()
    try:
        round_ = 0
        while time.monotonic() - started < seconds:

            @seeded(seed + round_)
            @settings(FUZZ_SETTINGS, max_examples=batch, phases=[Phase.generate])
            @given(ext_proc_streams)
            def streams(case: StreamCase) -> None:
                report.tried["ext_proc"] += 1
                report.add(
                    ext_proc_case(target, case, report.answers, crowded),
                    case.origin,
                    repr(case.messages),
                    case.messages,
                )

            @seeded(seed + round_)
            @settings(FUZZ_SETTINGS, max_examples=max(1, batch // 3), phases=[Phase.generate])
            @given(access_log_streams)
            def logs(case: LogCase) -> None:
                report.tried["access_log"] += 1
                report.add(
                    access_log_case(target, case),
                    f"{case.origin}, {case.routed} routed",
                    repr(case.messages),
                    case.messages,
                )

            streams()
            logs()
            round_ += 1
            if progress is not None:
                progress(
                    f"{sum(report.tried.values())} inputs, {sum(report.counts.values())} findings"
                )
        report.add(still_serving(target), "after the run", "a plain chat")
    finally:
        report.seconds = time.monotonic() - started
        target.stop()
    return report
