"""The admin API's tenants (`slogate tenants`): each tenant's class, tier, suspension and
what it has spent of its day's and month's budget.

What lives here: `tenant_usage` (one tenant as the reply shows it, read from the policy and
the spend store) and `TenantAdminService`, the servicer. Read only; the windows are the
current UTC day and month. It reads the store once per tenant with a budget, one after
the other: a thousand tenants are a thousand small Redis reads.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import grpc

from budget.spend import windows
from budget.spend_store import SpendStore
from budget.store import BudgetStoreError
from extproc.adminpb import tenants_pb2 as pb
from extproc.adminpb import tenants_pb2_grpc as pb_grpc
from policy.domain import Tenant
from policy.schema import Policy

log = logging.getLogger("slogate.admin")


async def tenant_usage(
    name: str,
    tenant: Tenant,
    listed: bool,
    store: SpendStore | None,
    now_s: float,
) -> pb.TenantUsage:
    """One tenant; raises BudgetStoreError when the store does not answer."""
    usage = pb.TenantUsage(
        name=name,
        tenant_class=tenant.tenant_class or "",
        tier=tenant.tier.value,
        suspended=tenant.suspended,
        listed=listed,
    )
    if tenant.spend is None:
        return usage
    usage.unit = tenant.spend.unit.value
    spans = windows(tenant.spend.windows(), now_s)
    used = {s.id: 0.0 for s in spans}
    if store is not None:
        used = await store.used(name, [s.id for s in spans])
    for span in spans:
        usage.windows.append(
            pb.SpendWindowUsage(
                window=span.name,
                id=span.id,
                used=used[span.id],
                limit=span.limit,
                resets_at=dt.datetime.fromtimestamp(span.ends_s, dt.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            )
        )
    return usage


class TenantAdminService(pb_grpc.TenantAdminServicer):
    def __init__(
        self,
        policy: Callable[[], Policy],
        store: SpendStore | None,
        wall_clock: Callable[[], float],
    ) -> None:
        self._policy = policy
        self._store = store
        self._wall_clock = wall_clock

    async def Tenants(  # the gRPC method's name
        self, request: pb.TenantsRequest, context: grpc.aio.ServicerContext
    ) -> pb.TenantsReply:
        book = self._policy().tenants
        names = list(request.names) or sorted(book.listed)
        reply = pb.TenantsReply(spend_store_up=True)
        now_s = self._wall_clock()
        for name in names:
            tenant = book.get(name)
            if tenant is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"no tenant named {name!r} (and no defaults)"
                )
                raise AssertionError("unreachable")  # abort raises
            try:
                usage = await tenant_usage(name, tenant, name in book.listed, self._store, now_s)
            except BudgetStoreError as error:
                log.warning("spend store unavailable for %s: %s", name, error)
                reply.spend_store_up = False
                usage = await tenant_usage(name, tenant, name in book.listed, None, now_s)
            reply.tenants.append(usage)
        return reply
