"""One request's decision, without gRPC: what the sidecar and the simulator share.

What lives here: `flow` (the `Decider` and one stream's `RequestFlow`, phase by phase, one
policy snapshot per request), `routing` (a counted request's pool, bucket and charged
output limit), `verdicts` (what the flow answers, and the protocols it is given),
`identity` (who is calling), `candidate` (the candidate policy judged beside),
`inflight` (routed requests until their access-log entry), `engine_outcomes` (what an
answer tells the engine picker), `contract` (names shared with the Envoy around slogate),
`bodies/` (reading and rewriting the APIs' bodies) and `tokens/` (counting prompts).
"""
