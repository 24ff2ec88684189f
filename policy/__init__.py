"""slogate's configuration and domain types: the bottom layer, importing nothing of ours.

`policy.domain` holds the small value types (tier, key, limits, bucket, pool, tenant) and the
one rule that makes a caller (`build_caller`), `policy.apis` the catalogue of engine APIs
slogate guards, `policy.schema` the frozen `Policy`, `policy.loader` the strict YAML reader
(`load_policy`, `parse_policy`), `policy._reader` its `PolicyError`, `policy.quantiles` the one
quantile rule; each section's reader is a `policy._<section>` module. Names are imported from
the module that defines them.
"""
