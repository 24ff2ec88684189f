"""The fragment merged into a bootstrap someone else wrote (tests/data/foreign-envoy.yaml):
the real Envoy's verdict. The contract's rules:
tests/tooling/render/envoy_config/test_fragment.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.envoy_config import fragment, theirs
from tooling.render.envoy_config.fragment import (
    merge_fragment,
)
from tooling.stack.processes import envoy_binary


def test_the_real_envoy_accepts_the_merged_bootstrap(tmp_path: Path) -> None:
    merged, _ = merge_fragment(theirs(), fragment())
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(merged))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
