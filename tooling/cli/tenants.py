"""`slogate tenants`: each tenant's class, tier, suspension and spend, from a running sidecar.

What lives here: the subcommand's arguments, the call to the admin API's TenantAdmin
(extproc.service.tenant_admin; a read, so no admin token is needed) and the table it
prints:

    tenant  class  tier      suspended  unit    day              month
    acme    gold   critical             tokens  1.2M/5M (24%)    40M/100M (40%)
"""

from __future__ import annotations

import argparse

import grpc

from extproc.adminpb import tenants_pb2 as pb
from extproc.adminpb import tenants_pb2_grpc as pb_grpc
from extproc.runtime.serve_command import DEFAULT_ADMIN
from extproc.service.admin_client import as_json, table
from tooling.cli.common import add_token_file, on_admin_api


def register(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser("tenants", help="tenants with their class, tier and spend budgets")
    command.add_argument("--admin", default=DEFAULT_ADMIN, help="the sidecar's admin API")
    add_token_file(command)
    command.add_argument("--json", action="store_true", help="print JSON, not a table")
    command.add_argument("names", nargs="*", help="only these tenants (default: the list)")
    command.set_defaults(handler=show_tenants)


def _short(value: float, unit: str) -> str:
    if unit == "usd":
        return f"${value:,.2f}"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.0f}"


def tenants_table(reply: pb.TenantsReply) -> str:
    rows = []
    for t in reply.tenants:
        spend = {w.window: w for w in t.windows}
        cells = []
        for name in ("day", "month"):
            w = spend.get(name)
            share = "" if w is None else f" ({w.used / w.limit:.0%})"
            cells.append(
                "-" if w is None else f"{_short(w.used, t.unit)}/{_short(w.limit, t.unit)}{share}"
            )
        rows.append(
            (
                t.name,
                t.tenant_class or "-",
                t.tier,
                "yes" if t.suspended else "",
                t.unit or "-",
                *cells,
            )
        )
    text = table(("tenant", "class", "tier", "suspended", "unit", "day", "month"), rows)
    if not reply.spend_store_up:
        text += "\n(the spend store did not answer: usage shown as 0)"
    return text


def show_tenants(args: argparse.Namespace) -> int:

    async def call(channel: grpc.aio.Channel) -> int:
        reply = await pb_grpc.TenantAdminStub(channel).Tenants(
            pb.TenantsRequest(names=args.names), timeout=30
        )
        print(as_json(reply) if args.json else tenants_table(reply))
        return 0

    return on_admin_api(args.admin, call, args.token_file)
