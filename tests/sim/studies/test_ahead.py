"""Quotas ahead of time in the simulator, on the sidecar's own planner: with the class start
declared, the ramp's requests meet their objective more often than under the reaction alone
(the reports holding the KV cache were squeezed before the class came), critical no worse."""

from __future__ import annotations

from sim.studies.ahead import Arm, run_arm


def test_the_calendar_beats_the_reaction_on_a_sharp_class_start() -> None:
    reactive = run_arm(Arm("reactive only", "sharp", ""))
    calendar = run_arm(Arm("with the calendar", "sharp", "calendar"))
    assert calendar["moves"] == {"calendar": 1, "given_back": 1}
    assert calendar["burst_handling"] > reactive["burst_handling"]
    assert calendar["critical_attainment"] >= reactive["critical_attainment"]
    assert calendar["oom_events"] <= reactive["oom_events"]
