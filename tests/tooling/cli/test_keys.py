"""`slogate keys add / rotate / revoke / list --file`: the CLI on a key file, in-process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from extproc.runtime.key_store import read_key_file
from policy.domain import Tier, hash_api_key
from tooling.cli.main import build_parser, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(["keys", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_add_rotate_revoke_list_on_a_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "keys.yaml")
    added = run(capsys, "add", "--file", path, "--tenant", "acme", "--tier", "critical",
                "--expires-in", "30d", "--limit", "requests_per_minute=5")  # fmt: skip
    assert isinstance(added, dict)
    key = added["key"]
    stored = read_key_file(Path(path))
    (record,) = stored.values()
    assert record.key_sha256 == hash_api_key(key) and key not in Path(path).read_text()
    assert (record.tier, dict(record.limits)) == (Tier.CRITICAL, {"requests_per_minute": 5})
    assert record.expires_at is not None and record.expires_at - time.time() > 29 * 86400
    rotated = run(capsys, "rotate", record.key_id, "--file", path, "--grace", "1h")
    assert isinstance(rotated, dict)
    old, new = (
        read_key_file(Path(path))[record.key_sha256],
        read_key_file(Path(path))[hash_api_key(rotated["key"])],
    )
    assert old.expires_at is not None and 3500 < old.expires_at - time.time() <= 3600
    assert (new.tenant, new.tier, dict(new.limits)) == ("acme", Tier.CRITICAL, dict(record.limits))
    run(capsys, "revoke", new.key_id[:8], "--file", path)
    listed = run(capsys, "list", "--file", path, "--tenant", "acme")
    assert isinstance(listed, list)
    assert sorted(k["state"] for k in listed) == ["active", "revoked"]
    assert main(["keys", "revoke", "00000000", "--file", path]) == 2
    assert "no stored key" in capsys.readouterr().err


def test_keys_without_a_subcommand_is_still_the_usage_table() -> None:
    args = build_parser().parse_args(["keys", "--tenant", "acme", "--admin", "unix:/s"])
    assert (args.keys_action, args.tenant, args.admin) == (None, "acme", "unix:/s")
    args = build_parser().parse_args(["keys", "--admin", "h:1", "list"])
    assert (args.keys_action, args.admin) == ("list", "h:1")
