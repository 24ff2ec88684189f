"""The in-flight table: ids, expiry, and the proofs an access-log entry must carry."""

from __future__ import annotations

from extproc.request.inflight import PROOF_BYTES, InFlight
from tests.support.clock import VirtualClock


def table() -> InFlight[int]:
    return InFlight(VirtualClock(100.0), ttl_s=60)


def test_an_id_is_proven_only_by_its_own_proof() -> None:
    inflight = table()
    first, second = inflight.add(1), inflight.add(2)
    proof = inflight.proof(first)
    assert len(proof) == 2 * PROOF_BYTES and int(proof, 16) >= 0  # hex, 128 bits
    assert inflight.proof(first) == proof  # recomputed, not stored
    assert inflight.proven(first, proof)
    assert not inflight.proven(first, "")  # missing
    assert not inflight.proven(first, proof[:-1] + ("0" if proof[-1] != "0" else "1"))  # wrong
    assert not inflight.proven(first, proof.upper())
    assert not inflight.proven(second, proof)  # right, for another id
    assert not inflight.proven(first, "é" * 32)  # not ASCII: refused, not an exception


def test_another_process_proofs_prove_nothing_here() -> None:
    """Each table (process, worker) has its own key: the same id, another proof."""
    here, there = table(), InFlight[int](VirtualClock(100.0), ttl_s=60, prefix="p0")
    key = here.add(1)
    assert not here.proven(key, there.proof(key))
    assert here.proof(key) != there.proof(key)


def test_ids_are_unique_pop_once_and_are_members_until_then() -> None:
    inflight = table()
    ids = {inflight.add(i) for i in range(1000)}
    assert len(ids) == 1000
    key = next(iter(ids))
    assert key in inflight
    assert inflight.pop(key) is not None and inflight.pop(key) is None
    assert key not in inflight
