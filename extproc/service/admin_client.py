"""The CLI's side of the admin API: a channel that sends the admin token, the token file it
finds, a client stub, and the tables `slogate status`, `keys`, `drill` and `reload` print
(the servicer is extproc.service.admin, who may call what extproc.service.admin_auth).

The token file the CLI sends from, the first that applies: `--token-file`, the file
`SLOGATE_ADMIN_TOKEN_FILE` names (the sidecar's own variable: inside the sidecar's container
the CLI finds the same file), or `default_token_file()`, the one `slogate up` writes, when it
exists. So a command typed against `slogate up` or in the pod needs nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.service.admin_auth import TOKEN_FILE_ENV, read_token


def default_token_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where `slogate up` keeps its admin token: $XDG_STATE_HOME/slogate/admin-token
    (~/.local/state/slogate/admin-token)."""
    env = environ if environ is not None else os.environ
    state = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/state")
    return Path(state) / "slogate" / "admin-token"


def client_token_file(
    given: Path | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The token file a command sends from (module docstring); None: there is none."""
    env = environ if environ is not None else os.environ
    if given is not None:
        return given
    if named := env.get(TOKEN_FILE_ENV):
        return Path(named)
    default = default_token_file(env)
    return default if default.exists() else None


def client_token(given: Path | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token in `client_token_file`; AdminTokenError when that file cannot be used."""
    path = client_token_file(given, environ)
    return read_token(path) if path is not None else None


class _Bearer(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (every admin RPC is unary)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()), self._header)
        return await continuation(client_call_details._replace(metadata=metadata), request)


def channel(address: str, token: str | None) -> grpc.aio.Channel:
    """A channel to the admin API at `address` that sends `token` (None: none) on every call."""
    return grpc.aio.insecure_channel(address, interceptors=[_Bearer(token)] if token else None)


def stub(
    address: str, token_file: Path | None = None
) -> tuple[grpc.aio.Channel, pb_grpc.AdminStub]:
    """A channel (sending the token of `client_token_file(token_file)`) and its Admin stub."""
    opened = channel(address, client_token(token_file))
    return opened, pb_grpc.AdminStub(opened)


async def reload_policy(address: str, token_file: Path | None = None) -> pb.ReloadPolicyReply:
    """Ask the sidecar at `address` to reload its policy file (its reply says whether it took)."""
    opened, admin = stub(address, token_file)
    try:
        return await admin.ReloadPolicy(pb.ReloadPolicyRequest(), timeout=10)
    finally:
        await opened.close()


def as_json(message: Any) -> str:
    return json_format.MessageToJson(message, always_print_fields_with_no_presence=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _number(message: Any, field: str, fmt: str = "{:.3g}") -> str:
    return fmt.format(getattr(message, field)) if message.HasField(field) else "-"


def _ahead_lines(reply: pb.StatusReply) -> str:
    """The quotas moved ahead of ramps: each raise and why, the reservation, the lending."""
    lines = [
        f"\nahead: {r.tenant} {r.reason} (x{r.multiple:g}, "
        f"{'ramp came' if r.ramp_came else 'waiting for the ramp'})"
        for r in reply.ahead_raises
    ]
    if reply.ahead_kv_share_caps:
        caps = ", ".join(f"{t} {v:.2f}" for t, v in sorted(reply.ahead_kv_share_caps.items()))
        lines.append(f"\nahead: KV reserved, share caps {caps}")
    if reply.HasField("ahead_lent"):
        lines.append(f"\nahead: idle hours lent to sheddable (x{reply.ahead_lent:g})")
    for tenant, source in sorted(reply.ahead_expired.items()):
        lines.append(f"\nahead: {tenant} given back, the ramp did not come ({source})")
    return "".join(lines)


def status_table(reply: pb.StatusReply) -> str:
    rows = [
        (
            b.pool,
            f"L{b.level}",
            f"L{b.signal_level}",
            "yes" if b.probing else "",
            f"L{b.drill_level} {b.drill_remaining_s:.0f}s" if b.drill_level else "",
            _number(b.signals, "p99_over_slo"),
            _number(b.signals, "error_rate"),
            _number(b.signals, "kv_cache_usage"),
            _number(b.signals, "gpu_memory_usage"),
            _number(b.signals, "queue_ratio"),
            b.last_transition,
        )
        for b in reply.breakers
    ]
    head = (
        f"policy {reply.policy_source} ({reply.keys} keys), budget store {reply.budget_store}"
        f" ({'up' if reply.redis_up else 'DEGRADED: local shares'}), "
        f"{reply.inflight_requests} requests in flight, "
        f"GPU {'available' if reply.gpu_available else 'unavailable'}\n"
        "quota multipliers: "
        + ", ".join(f"{t} {v:.2f}" for t, v in sorted(reply.quota_multipliers.items()))
        + f" (load {_number(reply, 'load_score')}, forecast {_number(reply, 'load_forecast')})"
        + _ahead_lines(reply)
    )
    text = (
        head
        + "\n\n"
        + table(
            (
                "pool",
                "level",
                "signals",
                "probing",
                "drill",
                "p99/slo",
                "5xx",
                "kv",
                "gpu",
                "queue",
                "last",
            ),
            rows,
        )
    )
    if reply.admission:
        held = [
            (
                a.pool,
                f"{a.kv_tokens_held} / {_number(a, 'kv_tokens_capacity', '{:.0f}')}",
                f"{a.requests_held} / {_number(a, 'requests_capacity', '{:.0f}')}",
                " ".join(f"{tier} {a.waiting.get(tier, 0)}" for tier in _TIERS),
                f"{a.oldest_wait_s:.2f} s" if sum(a.waiting.values()) else "-",
            )
            for a in reply.admission
        ]
        text += f"\n\nadmission ({reply.kv_ledger or 'this sidecar'})\n" + table(
            (
                "pool",
                "KV tokens held / may hold",
                "requests held / may hold",
                "waiting",
                "oldest wait",
            ),
            held,
        )
    if reply.engines:
        engine_rows = [
            (
                e.pool,
                e.endpoint,
                e.state + (f" ({e.dead_reason})" if e.dead_reason else ""),
                _number(e, "kv_capacity_tokens", "{:.0f}"),
                f"{e.held_tokens} / {e.held_requests}",
                f"{e.picked} / {e.answered} / {e.failed}",
                e.engine,
                f"{e.age_s:.1f} s" if e.age_s >= 0 else "-",
                _number(e, "kv_cache_usage"),
                _number(e, "running", "{:.0f}"),
                _number(e, "waiting", "{:.0f}"),
                _number(e, "prefix_cache_hit_rate"),
            )
            for e in reply.engines
        ]
        text += "\n\nengines (this sidecar's view; scraped: the latest /metrics)\n" + table(
            (
                "pool",
                "engine",
                "state",
                "KV tokens",
                "held tokens / requests",
                "picked / answered / failed",
                "kind",
                "scraped",
                "kv",
                "running",
                "waiting",
                "prefix hits",
            ),
            engine_rows,
        )
    return text + _region_lines(reply)


def _region_lines(reply: pb.StatusReply) -> str:
    """With regions: the region, its state with the global ledger, each global tenant's
    share of its limits, the region's usage and the world's."""
    if not reply.HasField("region"):
        return ""
    r = reply.region
    expires = (
        f", lease expires in {r.lease_expires_in_s:.1f} s"
        if r.HasField("lease_expires_in_s") and r.lease_expires_in_s >= 0
        else (
            f", lease expired {-r.lease_expires_in_s:.1f} s ago"
            if r.HasField("lease_expires_in_s")
            else ""
        )
    )
    holder = "this replica reports for it" if r.holder else "another replica reports for it"
    head = f"\n\nregion {r.region}: {r.ledger_state} (lease #{r.seq}{expires}; {holder})\n"
    rows = [
        (
            t.tenant,
            _number(t, "share", "{:.3f}"),
            f"{t.usage:.0f}",
            _number(t, "global_usage", "{:.0f}"),
        )
        for t in r.tenants
    ]
    if not rows:
        return head + "no global tenants yet"
    return head + table(("global tenant", "share", "region usage", "global usage"), rows)


_TIERS = ("critical", "standard", "sheddable")


def keys_table(reply: pb.KeysReply) -> str:
    rows = [
        (
            k.key_id,
            k.tenant,
            k.tier,
            _number(k.limits, "requests_per_minute", "{}"),
            _number(k.limits, "tokens_per_minute", "{}"),
            _number(k.limits, "concurrent_requests", "{}"),
            k.outstanding,
            f"{k.usage_1m:.0f}",
            f"{k.usage_5m:.0f}",
            f"{k.usage_1h:.0f}",
            _number(k, "dynamic_tokens_per_minute", "{:.0f}"),
            _number(k, "safety_factor", "{:.2f}"),
            _number(k, "demand_tokens_per_minute", "{:.0f}"),
            _number(k, "demand_forecast_tokens_per_minute", "{:.0f}"),
        )
        for k in reply.keys
    ]
    return table(
        (
            "key",
            "tenant",
            "tier",
            "rpm",
            "tpm",
            "conc",
            "in flight",
            "1m",
            "5m",
            "1h",
            "dynamic tpm",
            "safety",
            "demand tpm",
            "forecast",
        ),
        rows,
    )
