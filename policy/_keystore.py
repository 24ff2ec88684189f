"""The policy's `key_store:` section: where keys managed without editing the policy live.

What lives here: `KeyStoreConfig` and its reader. The keys themselves, and the key file's
format, are policy.keyring; reading the file and Redis is extproc.runtime.key_store.
"""

from __future__ import annotations

from dataclasses import dataclass

from policy._reader import PolicyError, Section, positive


@dataclass(frozen=True, slots=True)
class KeyStoreConfig:
    """`file`: a key file (YAML or JSON, SHA-256 digests only), re-read when it changes,
    e.g. mounted from a Kubernetes Secret. `redis`: keys also live in the budget store's
    Redis, shared by every replica and worker (needs `budget.store: redis`).
    `poll_interval_s`: how often each replica looks for a change of either (a revocation
    reaches every replica within about this). `propagation_timeout_s`: how long an admin
    change waits for every live replica to apply it before it answers."""

    file: str | None = None
    redis: bool = False
    poll_interval_s: float = 0.5
    propagation_timeout_s: float = 3.0

    @property
    def enabled(self) -> bool:
        return self.file is not None or self.redis


def parse_key_store(raw: object, path: str, redis_budgets: bool) -> KeyStoreConfig:
    if raw is None:
        return KeyStoreConfig()
    sec = Section(raw, path)
    config = KeyStoreConfig(
        file=sec.get("file", str, "") or None,
        redis=sec.get("redis", bool, False),
        poll_interval_s=sec.get("poll_interval_s", float, 0.5),
        propagation_timeout_s=sec.get("propagation_timeout_s", float, 3.0),
    )
    positive(config.poll_interval_s, sec.child("poll_interval_s"))
    positive(config.propagation_timeout_s, sec.child("propagation_timeout_s"))
    if config.poll_interval_s > 10:
        raise PolicyError(f"{sec.child('poll_interval_s')}: at most 10 (revocations wait on it)")
    if config.redis and not redis_budgets:
        raise PolicyError(f"{sec.child('redis')}: needs budget.store: redis (its Redis is used)")
    sec.close()
    return config
