"""eager.start / eager.finish: a coroutine run on the caller's stack until it waits, and
from there on exactly as a task runs it (results, exceptions, cancellation, bare yields)."""

from __future__ import annotations

import asyncio

import pytest

from extproc.service.eager import finish, start


class Refused(Exception):
    pass


async def _returns(value: int) -> int:
    return value


async def _raises() -> int:
    raise Refused("at once")


async def _awaits(future: asyncio.Future[int], after: list[str]) -> int:
    try:
        value = await future
    except Refused:
        after.append("refused")
        return -1
    except asyncio.CancelledError:
        after.append("cancelled")
        raise
    after.append("resumed")
    return value + 1


async def test_a_coroutine_that_never_waits_is_done_without_a_task() -> None:
    tasks_before = len(asyncio.all_tasks())
    answer = start(_returns(7))
    assert answer.done() and answer.result() == 7
    assert len(asyncio.all_tasks()) == tasks_before
    failed = start(_raises())
    assert failed.done()
    with pytest.raises(Refused):
        failed.result()


async def test_a_waiting_coroutine_goes_on_when_its_future_completes() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    after: list[str] = []
    answer = start(_awaits(future, after))
    assert not answer.done() and after == []
    loop.call_soon(future.set_result, 41)
    assert await answer == 42
    assert after == ["resumed"]


async def test_the_futures_exception_reaches_the_coroutine() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    after: list[str] = []
    answer = start(_awaits(future, after))
    await asyncio.sleep(0)
    future.set_exception(Refused("later"))
    assert await answer == -1
    assert after == ["refused"]


async def test_cancelling_the_answer_cancels_the_coroutine_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    after: list[str] = []
    answer = start(_awaits(future, after))
    await asyncio.sleep(0)
    answer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answer
    assert after == ["cancelled"]
    assert future.cancelled()  # as a task cancels the future it waits on


async def test_a_cancellation_after_the_future_completed_still_reaches_the_coroutine() -> None:
    """The future done but its callback not yet run when the task is cancelled: the
    cancellation is thrown in (a task's semantics), not lost."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    after: list[str] = []
    answer = start(_awaits(future, after))
    await asyncio.sleep(0)
    future.set_result(1)
    answer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answer
    assert after == ["cancelled"]


async def test_bare_yields_and_chained_waits_run_to_the_end() -> None:
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    async def steps() -> int:
        for i in range(3):
            await asyncio.sleep(0)
            seen.append(i)
        first: asyncio.Future[int] = loop.create_future()
        loop.call_soon(first.set_result, 10)
        await asyncio.sleep(0.001)
        return await first + len(seen)

    assert await start(steps()) == 13
    assert seen == [0, 1, 2]


async def test_finish_runs_every_piece_and_gathers_only_the_waiting_ones() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    done: list[str] = []

    async def immediate(name: str) -> None:
        done.append(name)

    async def waits() -> None:
        await future
        done.append("waited")

    loop.call_soon(future.set_result, 0)
    await finish([immediate("a"), waits(), immediate("b")])
    assert done == ["a", "b", "waited"]
    await finish([])
    with pytest.raises(Refused):
        await finish([immediate("c"), _raises()])  # type: ignore[list-item]
    assert done[-1] == "c"
