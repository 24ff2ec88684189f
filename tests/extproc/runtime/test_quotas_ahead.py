"""The sidecar's quotas ahead of ramps: a calendar event declared in the policy raises its
tenant at the controller's next interval; admission applies the held and squeezed
multipliers and the KV share cap; the move is counted by reason and shown by the admin
API's status, each raise with its reason, and written to the decision log."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

from extproc.adminpb import admin_pb2 as pb
from extproc.service.admin_client import status_table
from tests.support.stack import example_policy, write_policy


def test_a_declared_event_raises_its_tenant_and_status_says_why(tmp_path: Path) -> None:
    from extproc.runtime.sidecar import Sidecar

    now = dt.datetime.now(dt.UTC).replace(tzinfo=None, second=0, microsecond=0)
    policy = example_policy()
    policy["ahead"] = {
        "lead_min": 10,
        "timezone": "UTC",
        "calendar": [
            {
                "name": "launch",
                "tenants": ["demo-standard"],
                "on": (now + dt.timedelta(minutes=5)).isoformat(),
                "duration_min": 60,
                "multiple": 4,
            }
        ],
    }
    policy["decision_log"] = {"dir": str(tmp_path / "decisions"), "sample_rate": 0.0}
    path = write_policy(tmp_path / "policy.yaml", policy)

    async def scenario() -> None:
        sidecar = Sidecar(path, metrics_port=None, admin_address=None)
        await sidecar.control.quota_loop.step()
        applied = sidecar.signals.applied
        assert applied["standard"] == 1.0 and applied["sheddable"] == 0.5
        assert sidecar.path.admission.kv.shares.caps == {"sheddable": 0.7}
        value = sidecar.metrics.registry.get_sample_value
        assert value("slogate_quota_ahead_moves_total", {"reason": "calendar"}) == 1.0
        assert value("slogate_quota_ahead_raised_tenants") == 1.0
        assert value("slogate_quota_ahead_kv_share_cap", {"tier": "sheddable"}) == 0.7
        reply = await sidecar.control.admin.Status(pb.StatusRequest(), None)  # type: ignore[arg-type]
        (raised,) = reply.ahead_raises
        assert (raised.tenant, raised.reason, raised.multiple) == (
            "demo-standard",
            "raised by calendar event launch",
            4.0,
        )
        assert reply.quota_multipliers["sheddable"] == 0.5  # what admission applies
        assert "ahead: demo-standard raised by calendar event launch" in status_table(reply)
        await sidecar.stop()

    asyncio.run(scenario())
    # The decision log has the move (each one, whatever the requests' sample rate).
    lines = [
        json.loads(line)
        for file in (tmp_path / "decisions").glob("decisions-*.jsonl")
        for line in file.read_text().splitlines()
    ]
    assert [(r["decision"], r["tenant"], r["reason"]) for r in lines] == [
        ("quota_ahead", "demo-standard", "raised by calendar event launch")
    ]
