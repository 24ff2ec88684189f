"""What `slogate serve` must not load: the simulator and every part of `tooling` but its
command line (tests/e2e/extproc/runtime/test_serve_command.py says why), and statsmodels
(~2 s to import with scipy: only the forecast's refit process fits, forecast.seasonal)."""

from __future__ import annotations

import re

ALLOWED_TOOLING = re.compile(r"^tooling(\.cli(\..+)?)?$")


def forbidden(module: str) -> bool:
    """A module `slogate serve` must not load (this module's docstring says where the reason is)."""
    if module in ("sim", "statsmodels") or module.startswith(("sim.", "statsmodels.")):
        return True
    if module == "tooling" or module.startswith("tooling."):
        return not ALLOWED_TOOLING.match(module)
    return False
