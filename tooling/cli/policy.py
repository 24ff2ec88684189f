"""`slogate policy diff` and `slogate policy promote`: two policy files compared, and a
candidate made the policy.

What lives here: the subcommands' arguments, `promote` (the file swap) and their commands.
- `policy diff OLD NEW` prints, in Markdown, every schema-level difference in words
  (policy.diff: keys added or removed per tenant, tenants, limits, tiers, objectives, pools,
  routing, every other setting by its path). `--traffic DIR` replays a traffic record
  under both and compares them per tenant and tier, with guards (tooling.cli.policy_traffic).
- `policy promote --policy P [--candidate C]` writes the candidate (C, or the file P's
  `candidate:` names) over P: checked as the sidecar would check it first, written to a
  temporary file and renamed over P (a reader sees the old file or the new one, never half),
  the old P kept as `P.previous`. The candidate file names no candidate, so the promoted
  policy names none: nothing is judged beside it until one is named again. With `--admin`
  the running sidecar reloads it at once through its admin API (with the admin token the
  other admin commands send; the normal reload path: a
  refusal keeps the running policy); without, its file watch picks it up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import grpc

from extproc.runtime.serve_command import DEFAULT_ADMIN
from extproc.service import admin_client
from extproc.service.admin_auth import AdminTokenError
from policy._reader import PolicyError
from policy.candidate import candidate_path, checked_candidate
from policy.diff import policy_changes
from policy.loader import load_policy
from tooling.cli import policy_traffic
from tooling.cli.common import add_token_file


def register(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser("policy", help="compare two policies; promote a candidate")
    command.set_defaults(handler=run_policy)
    actions = command.add_subparsers(dest="policy_action", required=True)
    diff = actions.add_parser("diff", help="what changes from OLD to NEW, in words (Markdown)")
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    policy_traffic.add_traffic_arguments(diff)  # --traffic, its guards and --out
    promote_cmd = actions.add_parser("promote", help="make the candidate the policy")
    promote_cmd.add_argument("--policy", type=Path, required=True, help="the policy file")
    promote_cmd.add_argument(
        "--candidate", type=Path, default=None, help="default: the one the policy names"
    )
    promote_cmd.add_argument(
        "--admin", default=None, help=f"reload the sidecar there (e.g. {DEFAULT_ADMIN})"
    )
    add_token_file(promote_cmd)


def diff_markdown(old: Path, new: Path) -> str:
    said = policy_changes(load_policy(old), load_policy(new))
    lines = [f"## Policy changes: `{old}` → `{new}`", ""]
    lines += [f"- {sentence}" for sentence in said] or ["No setting differs."]
    return "\n".join(lines) + "\n"


def promote(policy_path: Path, candidate: Path | None = None) -> Path:
    """Write the candidate over the policy file (old one kept as `.previous`); returns the
    candidate file written. Raises PolicyError when there is none or it would be refused."""
    policy = load_policy(policy_path)
    source = candidate if candidate is not None else candidate_path(policy)
    if source is None:
        raise PolicyError(f"{policy_path} names no candidate (candidate: {{file: ...}})")
    checked_candidate(policy, source)  # what the sidecar would refuse is refused here
    text = source.read_text(encoding="utf-8")
    previous = policy_path.with_name(policy_path.name + ".previous")
    previous.write_bytes(policy_path.read_bytes())
    temporary = policy_path.with_name(f".{policy_path.name}.promoting")
    with temporary.open("w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, policy_path)
    return source


def run_policy(args: argparse.Namespace) -> int:
    try:
        if args.policy_action == "diff":
            if args.traffic is not None:
                return policy_traffic.traffic_diff(args)
            sys.stdout.write(diff_markdown(args.old, args.new))
            return 0
        source = promote(args.policy, args.candidate)
    except (PolicyError, OSError) as error:
        print(f"slogate policy {args.policy_action}: {error}", file=sys.stderr)
        return 2
    print(f"promoted {source} to {args.policy} (the old policy: {args.policy}.previous)")
    if args.admin is None:
        return 0
    try:
        reply = asyncio.run(admin_client.reload_policy(args.admin, args.token_file))
    except (AdminTokenError, grpc.aio.AioRpcError) as error:
        said = (
            f"{error.code().name}: {error.details()}" if isinstance(error, grpc.RpcError) else error
        )
        print(f"slogate policy promote: the reload at {args.admin}: {said}", file=sys.stderr)
        return 2
    if not reply.ok:
        print(f"the sidecar refused it, the old policy stays: {reply.error}", file=sys.stderr)
        return 1
    print(f"reloaded: {reply.keys} keys")
    if reply.error:
        print(reply.error, file=sys.stderr)
    return 0
