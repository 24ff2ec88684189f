"""What a simulated engine with a paged KV cache is told of an arrival.

What lives here: `prompt_plan`, an arrival's chat (its texts and their roles) as the
engine tokenizes it and holds it (sim.server.engine_ids).
"""

from __future__ import annotations

from sim.fleet.arrivals import Arrival
from sim.fleet.prompts import library
from sim.server import engine_ids
from sim.server.paged_kv import PromptPlan


def prompt_plan(arrival: Arrival, output_tokens: int, block_size: int) -> PromptPlan:
    """The request as a paged engine holds it: its prompt's full blocks' names and ids, and
    the tokens past them (the last partial block, and what it generates)."""
    texts = arrival.texts or library(arrival.crafted).messages(arrival.counted)
    ids = engine_ids.chat_ids(arrival.chat_roles(len(texts)), texts)
    return engine_ids.prompt_plan(ids, block_size, output_tokens)
