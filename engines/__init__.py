"""The engines inside each pool: their state, and which one gets each request. Pure.

What lives here:
- `engine`   one engine (`Engine`) and its state (`EngineState`: serving, draining, dead);
             `engine_address`, `HeldOn`.
- `pool_view` what a request reads of a pool, made once per change of the fleet
             (`PoolView`, `PoolSizes`).
- `state`    `EngineFleet`: every pool's engines and the capacity they add up to.
- `prefix`   prompts' token blocks as hashes (`text_blocks`, `PromptBlocks`, `prompt_blocks`)
             and the index of who served which (`PrefixIndex`).
- `kv_events` the engines' KV cache events (vLLM's msgpack, both encodings) as kept here.
- `cached_blocks` the exact index of what each engine's prefix cache holds, fed by those
             events, in slogate's own block keys (`block_keys`); `CachedBlocks`.
- `block_hashes` the engine's own block hashes (vLLM's sha256 chain), for checks.
- `scoring`  the scorers over the candidates (`EngineCandidate`) and `pick`.
- `picker`   `EnginePicker`, which ties them together for the request path and the simulator
             alike.

Discovery, probing and scraping are I/O and live in extproc.runtime; nothing here reads a
socket or a clock of its own. Names are imported from the module that defines them.
"""
