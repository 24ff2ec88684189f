"""The engines inside each pool: their state, and which one gets each request. Pure.

`engines.state` keeps every pool's engines (serving, draining, dead) and the capacity they
add up to; `engines.prefix` hashes prompts' token blocks and indexes who served which;
`engines.scoring` scores the candidates; `engines.picker` ties them together for the
request path and the simulator alike. Discovery, probing and scraping are I/O and live in
extproc.runtime; nothing here reads a socket or a clock of its own.
"""

from engines.picker import EnginePicker
from engines.prefix import NO_BLOCKS, PrefixIndex, PromptBlocks, prompt_blocks, text_blocks
from engines.scoring import EngineCandidate, Scores, pick, rendezvous, score
from engines.state import Engine, EngineFleet, EngineState, HeldOn, engine_address

__all__ = [
    "NO_BLOCKS",
    "Engine",
    "EngineCandidate",
    "EngineFleet",
    "EnginePicker",
    "EngineState",
    "HeldOn",
    "PrefixIndex",
    "PromptBlocks",
    "Scores",
    "engine_address",
    "pick",
    "prompt_blocks",
    "rendezvous",
    "score",
    "text_blocks",
]
