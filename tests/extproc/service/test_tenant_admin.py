"""The admin API's tenants part: its generated code is current, and `slogate tenants`' table
shows each tenant's class, tier, suspension and spend per window."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tempfile
from pathlib import Path

from budget.spend import SpendHold, windows
from budget.spend_store import InProcessSpendStore
from extproc.adminpb import tenants_pb2 as pb
from extproc.service.tenant_admin import tenant_usage
from policy.loader import parse_policy
from tooling.cli.tenants import tenants_table

ROOT = Path(__file__).resolve().parents[3]
NOW_S = dt.datetime(2026, 12, 2, 6, 0, tzinfo=dt.UTC).timestamp()


def test_generated_tenants_code_is_current() -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                sys.executable, "-m", "grpc_tools.protoc", "-Iprotos", f"--python_out={out}",
                f"--grpc_python_out={out}", f"--pyi_out={out}",
                "protos/extproc/adminpb/tenants.proto",
            ],
            cwd=ROOT, check=True, timeout=60,
        )  # fmt: skip
        for name in ("tenants_pb2.py", "tenants_pb2_grpc.py", "tenants_pb2.pyi"):
            fresh = (Path(out) / "extproc" / "adminpb" / name).read_text()
            committed = (ROOT / "extproc" / "adminpb" / name).read_text()
            assert fresh == committed, f"{name} is stale: run `make protos`"


async def test_the_table_shows_spend_per_window() -> None:
    policy = parse_policy(
        {
            "tenants": {
                "prices": {"usd_per_million": {"prompt": 1, "completion": 2}},
                "classes": {"gold": {"tier": "critical"}},
                "list": {
                    "acme": {"class": "gold", "spend": {"per_day": 5e6, "per_month": 1e8}},
                    "globex": {"spend": {"unit": "usd", "per_month": 2500}, "suspended": True},
                    "plain": {},
                },
            },
            "keys": [],
        }
    )
    store = InProcessSpendStore(lambda: NOW_S)
    acme = policy.tenants.listed["acme"]
    assert acme.spend is not None
    spans = windows(acme.spend.windows(), NOW_S)
    await store.reserve(SpendHold("acme", spans, {}, 1_200_000), "r", 600)
    await store.settle("acme", [s.id for s in spans], "r", 1_250_000)
    reply = pb.TenantsReply(spend_store_up=True)
    for name in ("acme", "globex", "plain"):
        tenant = policy.tenants.listed[name]
        reply.tenants.append(await tenant_usage(name, tenant, True, store, NOW_S))
    assert reply.tenants[0].windows[1].resets_at == "2027-01-01T00:00:00Z"
    lines = tenants_table(reply).splitlines()
    assert lines[0].split() == ["tenant", "class", "tier", "suspended", "unit", "day", "month"]
    assert lines[1].split() == [
        "acme", "gold", "critical", "tokens", "1.25M/5M", "(25%)", "1.25M/100M", "(1%)",
    ]  # fmt: skip
    assert lines[2].split() == [
        "globex",
        "-",
        "standard",
        "yes",
        "usd",
        "-",
        "$0.00/$2,500.00",
        "(0%)",
    ]
    assert lines[3].split() == ["plain", "-", "standard", "-", "-", "-"]
