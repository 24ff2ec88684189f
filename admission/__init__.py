"""Admission: whether a request may run now, on which pool, at what cost.

Grpc-free and I/O-free except through the budget store it is given. `admission.decision`
holds the types, `admission.chain` the step protocol and the chain, one module per step
(`breaker_step`, `kv_step`, `budget_step`), `admission.assembly` builds the chain the
sidecar and the simulator both run, `admission.signals` turns an outcome into the
breaker's signals, `admission.errors` the refusals a request can end with.
"""
