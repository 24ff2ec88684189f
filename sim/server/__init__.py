"""The simulated engine server: a stand-in for vLLM pools used by tests, the local stack and
load tests.

- `model`        pure latency / KV-cache / prefix-cache model (seeded RNG, no I/O, no
                 clock), shared with the offline fleet (sim.fleet).
- `config`       `PoolConfig`, the frozen configuration of one pool.
- `faults`       fault-injection state (extra latency, error rate) with an injected clock.
- `metrics`      vLLM-named Prometheus metrics in a per-pool registry.
- `tokenizer`    DeepSeek's vocabulary, loaded once per process (the fleet shares it).
- `calibration`  the latency model fitted from measured TTFT samples (`slogate calibrate`).
- `pool`         the aiohttp server of one pool (`create_app`) and its CLI,
                 `python -m sim.server.pool`; `_serving` (one pool's requests), `_openai`
                 (request bodies), `_frames`, `_event_frames` and `_wire` (answers and
                 stream events).

Only `pool` and `_serving` import aiohttp: the offline fleet imports `model` without it.

Held to a real vLLM 0.32 (tests/e2e/test_sim_matches_vllm.py): metric names, types and labels,
the JSON of answers and stream events (vLLM-only fields as null, `finish_reason` on the last
token's chunk, no `usage: null` chunks), vLLM's error documents (`type` from the status,
`code` the status; what the simulator meant rides in `x-sim-error`), FCFS ignoring an
integer `priority`, a 404 for a model it does not serve (with `--served-model-name`), and a
full KV cache queueing requests rather than failing them. Where it differs on purpose:
- speed: latencies come from the field's model (or a calibrated one) times `time_scale`;
- scale: its KV cache counts weighted tokens (the field's per-bucket KV factors) with no
  blocks (`cache_config_info` says block size 1), so it holds DeepSeek-sized contexts;
- it reserves a request's whole footprint (prompt + max_tokens) when it starts it, so it
  never preempts (`num_preemptions_total` stays 0) where vLLM grows requests block by block
  and preempts when the cache runs out; so it also queues sooner than vLLM does;
- it counts prompts with DeepSeek's vocabulary (`--tokenizer deepseek`) or a quarter of the
  bytes, where a vLLM counts with its model's tokenizer and chat template;
- its text is filler words; values vLLM fills in (`token_ids`, `system_fingerprint`) are
  null or fixed; it exports a subset of vLLM's metric families.
"""
