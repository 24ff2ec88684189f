"""ONE suite, every KV ledger (tests/support/kv_book_suite.py), run here on this process's
book (admission.kv.book.LocalBook); and the failover's retry and this process's shared service
without a server. On Redis and a Redis Cluster, and Redis dying and coming back:
tests/e2e/admission/kv/test_book.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from admission.kv.book import FailoverBook, LedgerUnavailable, LocalBook
from tests.support.clock import VirtualClock
from tests.support.kv_book_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.kv_book_suite import Fleet, hold, pool


@pytest.fixture(params=["local"])
async def fleet(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[Fleet]:
    made = Fleet(request.param, request, clock)
    yield made
    await made.close()


async def test_a_failing_shared_book_is_never_asked_again_before_the_retry() -> None:
    clock = VirtualClock(0.0)

    class Down(LocalBook):
        calls = 0

        async def hold(self, *args: object, **kw: object) -> str:
            Down.calls += 1
            raise LedgerUnavailable("down")

        async def release_ids(self, ids: object) -> None:
            raise LedgerUnavailable("down")

    book = FailoverBook(Down(clock), LocalBook(clock, lambda: 4), clock, 1.0)  # type: ignore[arg-type]
    spec = pool(kv=10_000)
    assert await hold(book, "a", spec, 2000) == ""
    assert await hold(book, "b", spec, 1000) == "kv_cache"  # a quarter of 10k: 2500
    assert Down.calls == 1
    clock.advance(1.5)
    await hold(book, "c", spec, 10)  # retried: still down (the unsettled "a" first)
    assert Down.calls == 1 and not book.healthy and book.holds == 2


async def test_this_process_book_shares_service_as_redis_does(clock: VirtualClock) -> None:
    book = LocalBook(clock, shared=True)
    now = clock()
    assert (await book.share_service([("t", 1000.0, now - 60.0)], 60.0, now))["t"] == (
        pytest.approx(500.0)
    )
    assert (await book.share_service([("t", 500.0, now)], 60.0, now))["t"] == pytest.approx(1000.0)
    assert book.fleet_wide and not LocalBook(clock).fleet_wide
