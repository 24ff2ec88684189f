"""The shipped rules with their time scaled, for the live alert run: promtool accepts them.
The scaling: tests/tooling/render/test_alert_rules.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tooling.render.alert_rules import (
    write_scaled_rules,
)


def test_promtool_accepts_the_scaled_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    out = write_scaled_rules(tmp_path / "scaled.yaml", 1 / 60, 10.0)
    checked = subprocess.run(
        [promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
