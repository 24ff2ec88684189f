"""Comparisons and reports built on the offline fleet (sim.fleet).

What lives here: `scenarios` (the best static per-tier quota against slogate's dynamic
control, `slogate simulate`), `engine_compare` (round robin against slogate's engine
picking), `room_reports` (the waiting room against refusing at once; one sidecar against
several sharing a KV ledger), `policy_impact` (what a policy change does to recorded
traffic, `slogate policy diff --traffic`) and `plots` (PNG figures of a comparison;
matplotlib, the `sim` extra).
"""
