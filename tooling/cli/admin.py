"""`slogate status / keys / reload / drill / drain`: one call each to the running sidecar's
admin API, with the admin token found as tooling.cli.common's `on_admin_api` finds it
(keys' add / revoke / rotate / list are tooling.cli.keys's); and `slogate admin-token`,
which makes the token file a sidecar is given."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from extproc.runtime.serve_command import DEFAULT_ADMIN
from tooling.cli import keys as key_commands
from tooling.cli.common import add_token_file, on_admin_api


def register(sub: argparse._SubParsersAction) -> None:
    """status, keys (with tooling.cli.keys' add / revoke / rotate / list), reload, drill, drain,
    admin-token."""

    def admin_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--admin", default=DEFAULT_ADMIN, help="the sidecar's admin API")
        add_token_file(command)
        command.add_argument("--json", action="store_true", help="print JSON, not a table")
        command.set_defaults(handler=call_admin)
        return command

    admin_command("status", "breaker state per pool with its signals, budget store health")
    keys = admin_command("keys", "keys with limits, in-flight reservations and usage")
    keys.add_argument("--tenant", default="")
    key_commands.add_key_commands(keys)  # keys add / revoke / rotate / list
    admin_command("reload", "re-read the policy file now (a bad policy is refused)")
    drill = admin_command("drill", "force a breaker level on a pool for a while")
    drill.add_argument("--pool", required=True, help="a pool name, or 'global'")
    drill.add_argument("--level", type=int, choices=[0, 1, 2, 3], required=True)
    drill.add_argument("--minutes", type=float, default=10.0, help="0 ends a running drill")
    drain = admin_command("drain", "an engine gets nothing new, its requests finish")
    drain.add_argument("--engine", required=True, help="ip:port, as `slogate status` shows it")
    drain.add_argument("--pool", default="", help="only in this pool (default: every pool)")
    drain.add_argument("--undo", action="store_true", help="take new requests again")
    token = sub.add_parser(
        "admin-token", help="make an admin token file where none is yet (random, 0600)"
    )
    token.add_argument(
        "path",
        type=Path,
        nargs="?",
        default=None,
        help="default: $SLOGATE_ADMIN_TOKEN_FILE, else the file `slogate up` writes",
    )
    token.set_defaults(handler=make_admin_token)


def make_admin_token(args: argparse.Namespace) -> int:
    """`slogate admin-token [PATH]`: the file made (or kept: an existing token stays), its
    path printed. The manifests' init container runs it; so can an operator who wants one
    token for every pod (then a Secret: docs/operators/admin-api.md)."""
    from extproc.service.admin_auth import AdminTokenError, ensure_token_file
    from tooling.cli.up import up_token_file

    try:
        print(ensure_token_file(args.path or up_token_file()))
    except (AdminTokenError, OSError) as error:
        print(f"slogate admin-token: {error}", file=sys.stderr)
        return 2
    return 0


def call_admin(args: argparse.Namespace) -> int:
    """status / keys / reload / drill / drain: one call to the running sidecar's admin API."""
    from extproc.adminpb import admin_pb2 as pb
    from extproc.adminpb import admin_pb2_grpc as pb_grpc
    from extproc.service import admin_client as admin

    async def call(channel: Any) -> int:
        stub = pb_grpc.AdminStub(channel)
        if args.command == "status":
            status = await stub.Status(pb.StatusRequest(), timeout=5)
            print(admin.as_json(status) if args.json else admin.status_table(status))
        elif args.command == "keys":
            keys = await stub.Keys(pb.KeysRequest(tenant=args.tenant), timeout=10)
            print(admin.as_json(keys) if args.json else admin.keys_table(keys))
        elif args.command == "reload":
            reloaded = await stub.ReloadPolicy(pb.ReloadPolicyRequest(), timeout=10)
            print(
                admin.as_json(reloaded)
                if args.json
                else f"reloaded: {reloaded.keys} keys"
                + (f"\n{reloaded.error}" if reloaded.error else "")
                if reloaded.ok
                else f"refused, the old policy stays: {reloaded.error}"
            )
            return 0 if reloaded.ok else 1
        elif args.command == "drain":
            drained = await stub.Drain(
                pb.DrainRequest(engine=args.engine, pool=args.pool, undo=args.undo), timeout=5
            )
            print(
                admin.as_json(drained)
                if args.json
                else "\n".join(f"{e.pool} {e.endpoint}: {e.state}" for e in drained.engines)
            )
        else:
            drilled = await stub.Drill(
                pb.DrillRequest(pool=args.pool, level=args.level, minutes=args.minutes),
                timeout=5,
            )
            print(
                admin.as_json(drilled)
                if args.json
                else f"drill: {drilled.pool} at least L{drilled.level} for "
                f"{drilled.remaining_s:.0f} s"
            )
        return 0

    return on_admin_api(args.admin, call, args.token_file)
