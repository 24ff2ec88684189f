"""DeepSeek's vocabulary for the simulated server and the offline fleet, loaded once.

What lives here: `shared_bpe`, the sidecar's own counter (`exact_counter`: the engine the
default policy counts with), built once per process and shared by every simulated pool
that counts with `--tokenizer deepseek` (sim.server._serving) and by the fleet's prompts
and conversations (sim.fleet.prompts), so a process that runs both loads it once.
"""

from __future__ import annotations

from functools import cache

from extproc.request.tokens.native import exact_counter
from extproc.request.tokens.prompt import TokenCounter


@cache
def shared_bpe() -> TokenCounter:
    """The sidecar's counter (`exact_counter`: the engine the default policy counts with),
    loaded once per process (~1.3 s)."""
    return exact_counter()
