"""The admin API's key servicer (`KeyAdmin` in protos/extproc/adminpb/admin.proto).

What lives here: `KeyAdminService`, which adds, revokes, rotates and lists the keys of the
key store it is given (extproc.runtime.key_store), and the small types that store answers
with. Only SHA-256 digests arrive here: the CLI makes a new key and prints it once. Who may
call it is extproc.service.admin_auth's question, asked before any of this runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from policy.domain import LIMIT_FIELDS, Tier
from policy.keyring import KeyRecord, revoked, rotated

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class KeyStoreError(RuntimeError):
    """A change that could not be made (no writable store, unknown key id, ...)."""


@dataclass(frozen=True, slots=True)
class Propagation:
    """How a change spread: replicas that applied it, of those seen alive, and when the
    last one did (seconds after the write)."""

    applied: int
    live: int
    seconds: float


class KeyWrites(Protocol):
    @property
    def writable(self) -> str | None: ...
    def records(self) -> list[tuple[str, KeyRecord]]: ...
    def find(self, key_id: str) -> KeyRecord: ...
    def tenant_problem(self, tenant: str) -> str | None: ...
    async def put(self, *records: KeyRecord) -> Propagation: ...


def stored_key(record: KeyRecord, source: str, now: float) -> pb.StoredKey:
    message = pb.StoredKey(
        key_id=record.key_id,
        tenant=record.tenant,
        tier=record.tier.value if record.tier is not None else "",
        created_at=record.created_at,
        state=record.state(now).value,
        source=source,
        note=record.note,
    )
    for name, value in record.limits.items():
        setattr(message.limits, name, value)
    if record.expires_at is not None:
        message.expires_at = record.expires_at
    if record.revoked_at is not None:
        message.revoked_at = record.revoked_at
    return message


class KeyAdminService(pb_grpc.KeyAdminServicer):
    def __init__(
        self, store: KeyWrites | None, wall_clock: Callable[[], float] = time.time
    ) -> None:
        """`store`: None when the policy sets no `key_store:` (every change is refused)."""
        self._store = store
        self._wall = wall_clock

    async def _writable(self, context: grpc.aio.ServicerContext) -> KeyWrites:
        if self._store is None or self._store.writable is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this sidecar has no key store to write: set key_store.redis (with "
                "budget.store: redis) or key_store.file in its policy",
            )
        assert self._store is not None
        return self._store

    async def _change(
        self, store: KeyWrites, context: grpc.aio.ServicerContext, *records: KeyRecord
    ) -> pb.KeyChange:
        try:
            spread = await store.put(*records)
        except (KeyStoreError, OSError) as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        now = self._wall()
        source = store.writable or ""
        return pb.KeyChange(
            keys=[stored_key(r, source, now) for r in records],
            store=source,
            replicas_applied=spread.applied,
            replicas_live=spread.live,
            propagation_s=spread.seconds,
        )

    async def _find(
        self, store: KeyWrites, key_id: str, context: grpc.aio.ServicerContext
    ) -> KeyRecord:
        try:
            return store.find(key_id)
        except KeyStoreError as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        raise AssertionError("abort raises")

    async def AddKey(
        self, request: pb.AddKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeyChange:
        store = await self._writable(context)
        digest = request.key_sha256.lower()
        problem = None
        if not _SHA256.match(digest):
            problem = "key_sha256: expected 64 hex digits (the key's SHA-256, never the key)"
        elif not request.tenant:
            problem = "tenant: required"
        elif request.tier and request.tier not in {t.value for t in Tier}:
            problem = f"tier: expected one of {', '.join(t.value for t in Tier)}"
        elif request.expires_in_s < 0:
            problem = "expires_in_s: must be >= 0"
        elif any(digest == r.key_sha256 for _, r in store.records()):
            problem = "that key is already stored"
        else:
            problem = store.tenant_problem(request.tenant)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        now = self._wall()
        record = KeyRecord(
            key_sha256=digest,
            tenant=request.tenant,
            tier=Tier(request.tier) if request.tier else None,
            limits={
                name: getattr(request.limits, name)
                for name in LIMIT_FIELDS
                if request.limits.HasField(name)
            },
            created_at=now,
            expires_at=now + request.expires_in_s if request.expires_in_s > 0 else None,
        )
        return await self._change(store, context, record)

    async def RevokeKey(
        self, request: pb.RevokeKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeyChange:
        store = await self._writable(context)
        record = await self._find(store, request.key_id, context)
        return await self._change(store, context, revoked(record, self._wall()))

    async def RotateKey(
        self, request: pb.RotateKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeyChange:
        store = await self._writable(context)
        digest = request.new_key_sha256.lower()
        if not _SHA256.match(digest) or request.grace_s < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "new_key_sha256: 64 hex digits; grace_s: >= 0",
            )
        record = await self._find(store, request.key_id, context)
        old, new = rotated(record, digest, self._wall(), request.grace_s)
        return await self._change(store, context, old, new)

    async def ListKeys(
        self, request: pb.ListKeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListKeysReply:
        now = self._wall()
        rows = [] if self._store is None else self._store.records()
        rows = [(s, r) for s, r in rows if not request.tenant or r.tenant == request.tenant]
        rows.sort(key=lambda row: (row[1].tenant, row[1].created_at, row[1].key_sha256))
        return pb.ListKeysReply(keys=[stored_key(r, s, now) for s, r in rows])
