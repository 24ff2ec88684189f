"""`slogate keys add / revoke / rotate / list`: keys managed without editing the policy.

What lives here: the subcommands' arguments and what they do, against a running sidecar's
admin API (`--admin`, with the admin token tooling.cli.common's `on_admin_api` finds) or
directly on a key file (`--file PATH`, e.g. before it goes into a Kubernetes Secret). A new
key is made here and printed once; only its SHA-256 leaves this process. `slogate keys`
without a subcommand still prints the policy's keys with their usage (tooling.cli.main).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.runtime.key_store import read_key_file, write_key_file
from extproc.service.admin_auth import AdminTokenError
from extproc.service.key_admin import stored_key
from policy._reader import PolicyError
from policy.domain import LIMIT_FIELDS, Tier
from policy.keyring import (
    KeyRecord,
    KeyTable,
    merged,
    new_clear_key,
    parse_duration_s,
    revoked,
    rotated,
)
from tooling.cli.common import add_token_file, on_admin_api

_SUPPRESS = argparse.SUPPRESS  # an option the parent `keys` also has keeps its value


def add_key_commands(keys: argparse.ArgumentParser) -> None:
    sub = keys.add_subparsers(dest="keys_action", metavar="{add,revoke,rotate,list}")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--admin", default=_SUPPRESS, help="the sidecar's admin API")
        add_token_file(parser, default=_SUPPRESS)
        parser.add_argument(
            "--file", type=Path, default=None, help="edit this key file instead of a sidecar"
        )
        parser.add_argument("--json", action="store_true", default=_SUPPRESS)
        parser.set_defaults(handler=manage_keys)  # `keys` alone lists them: tooling.cli.admin
        return parser

    add = command("add", "make a key (printed once; only its SHA-256 is stored)")
    add.add_argument("--tenant", required=True)
    add.add_argument("--tier", choices=[t.value for t in Tier], default="")
    add.add_argument("--expires-in", default="", help="e.g. 30d, 24h (default: never)")
    add.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=N",
        help=f"a per-key limit over its tier's ({', '.join(LIMIT_FIELDS)})",
    )
    revoke = command("revoke", "refuse a key from now on, on every replica")
    revoke.add_argument("key_id", help="8+ leading hex digits of its SHA-256 (`keys list`)")
    rotate = command("rotate", "a new key like the old one; the old one works for --grace")
    rotate.add_argument("key_id")
    rotate.add_argument("--grace", default="24h", help="how long the old key still works")
    listing = command("list", "the stored keys: id, tenant, tier, expiry, state")
    listing.add_argument("--tenant", default=_SUPPRESS)


def manage_keys(args: argparse.Namespace) -> int:
    try:
        if args.file is not None:
            return _on_file(args, args.file)
        return on_admin_api(args.admin, lambda channel: _on_admin(args, channel), args.token_file)
    except (ValueError, KeyError, PolicyError, AdminTokenError) as error:
        message = error.args[0] if isinstance(error, KeyError) else error
        print(f"slogate keys {args.keys_action}: {message}", file=sys.stderr)
        return 2


def _limits(pairs: Sequence[str]) -> dict[str, int]:
    limits: dict[str, int] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in LIMIT_FIELDS or not value.isdigit():
            raise ValueError(f"--limit {pair}: expected NAME=N, NAME one of {LIMIT_FIELDS}")
        limits[name] = int(value)
    return limits


def _when(unix_s: float | None) -> str:
    if unix_s is None:
        return "-"
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print_keys(rows: Sequence[pb.StoredKey], as_json: bool) -> None:
    from google.protobuf import json_format

    from extproc.service.admin_client import table

    if as_json:
        print(json.dumps([json_format.MessageToDict(r) for r in rows], indent=1))
        return
    print(
        table(
            ("key id", "tenant", "tier", "state", "expires", "created", "source", "note"),
            [
                (
                    r.key_id,
                    r.tenant,
                    r.tier or "(tenant's)",
                    r.state,
                    _when(r.expires_at if r.HasField("expires_at") else None),
                    _when(r.created_at),
                    r.source,
                    r.note,
                )
                for r in rows
            ],
        )
    )


def _print_change(args: argparse.Namespace, change: pb.KeyChange, clear: str | None) -> None:
    if getattr(args, "json", False):
        from google.protobuf import json_format

        out: dict[str, Any] = json_format.MessageToDict(change)
        if clear is not None:
            out["key"] = clear
        print(json.dumps(out, indent=1))
        return
    if clear is not None:
        print(f"key: {clear}")
        print("(shown once: only its SHA-256 is stored; keep it now)", file=sys.stderr)
    _print_keys(change.keys, False)
    print(
        f"stored in {change.store}: applied by {change.replicas_applied} of "
        f"{change.replicas_live} live replicas in {change.propagation_s:.2f} s",
        file=sys.stderr,
    )
    if change.replicas_applied < change.replicas_live:
        print(
            "warning: some replicas had not applied it when the wait ended "
            "(key_store.propagation_timeout_s); they will at their next poll of Redis",
            file=sys.stderr,
        )


# -- on a key file ------------------------------------------------------------------------


def _on_file(args: argparse.Namespace, path: Path) -> int:
    records = read_key_file(path)
    now = time.time()
    clear = None
    if args.keys_action == "list":
        tenant = getattr(args, "tenant", "")
        rows = [stored_key(r, "file", now) for r in records.values()]
        _print_keys([r for r in rows if not tenant or r.tenant == tenant], args.json)
        return 0
    if args.keys_action == "add":
        clear, digest = new_clear_key()
        expires = parse_duration_s(args.expires_in) if args.expires_in else None
        changed = [
            KeyRecord(
                digest,
                args.tenant,
                Tier(args.tier) if args.tier else None,
                _limits(args.limit),
                created_at=now,
                expires_at=now + expires if expires else None,
            )
        ]
    else:
        old = KeyTable(records).find(args.key_id)
        if args.keys_action == "revoke":
            changed = [revoked(old, now)]
        else:
            clear, digest = new_clear_key()
            changed = list(rotated(old, digest, now, parse_duration_s(args.grace)))
    write_key_file(path, merged(records, changed))
    change = pb.KeyChange(
        keys=[stored_key(r, "file", now) for r in changed],
        store=f"file {path}",
        replicas_applied=0,
        replicas_live=0,
    )
    _print_change(args, change, clear)
    return 0


# -- against a sidecar's admin API --------------------------------------------------------


async def _on_admin(args: argparse.Namespace, channel: grpc.aio.Channel) -> int:
    keys = pb_grpc.KeyAdminStub(channel)  # the channel sends the admin token
    clear = None
    if args.keys_action == "list":
        reply = await keys.ListKeys(pb.ListKeysRequest(tenant=getattr(args, "tenant", "")))
        _print_keys(reply.keys, args.json)
        return 0
    if args.keys_action == "add":
        clear, digest = new_clear_key()
        request = pb.AddKeyRequest(
            key_sha256=digest,
            tenant=args.tenant,
            tier=args.tier,
            limits=pb.Limits(**_limits(args.limit)),
            expires_in_s=parse_duration_s(args.expires_in) if args.expires_in else 0.0,
        )
        change = await keys.AddKey(request)
    elif args.keys_action == "revoke":
        change = await keys.RevokeKey(pb.RevokeKeyRequest(key_id=args.key_id))
    else:
        clear, digest = new_clear_key()
        change = await keys.RotateKey(
            pb.RotateKeyRequest(
                key_id=args.key_id,
                new_key_sha256=digest,
                grace_s=parse_duration_s(args.grace),
            )
        )
    _print_change(args, change, clear)
    return 0
