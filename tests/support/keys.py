"""Key records, key files and a policy with one key: for the key store's and the policy
holder's tests, in process and end to end."""

from __future__ import annotations

import time

from policy.domain import hash_api_key
from policy.keyring import KeyRecord
from policy.loader import parse_policy

KEYS_A = "keys:\n  - {key: sk-a, tenant: a}\n"
KEYS_B = "keys:\n  - {key: sk-b, tenant: b}\n"
POLICY = parse_policy({"keys": [{"key": "sk-policy", "tenant": "p"}]})


def record(key: str, **changes: object) -> KeyRecord:
    fields: dict[str, object] = {
        "key_sha256": hash_api_key(key),
        "tenant": "acme",
        "created_at": time.time(),
    }
    fields.update(changes)
    return KeyRecord(**fields)  # type: ignore[arg-type]
