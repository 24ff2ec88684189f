"""Run a coroutine on the caller's stack until it first waits: a task only for what waits.

Most of what the servicers await never waits: a body decision with the budgets in memory
and a small prompt counted on the loop, the outcome sinks of an answered request (metrics,
the in-memory ledgers). A task for each costs a task object, two or three loop callbacks
and a context copy; with two servicers per request that was six tasks, about a third of
the sidecar's event-loop callbacks (bench/results/stages.md). Python 3.12's eager task
factory does this for the whole loop; on 3.11 this module does it for the calls that ask.

`start` runs the coroutine until it returns, raises or waits on a future. Done: a finished
future. Waiting: a task that resumes it exactly where a task would (the future's outcome
read by the coroutine itself; a cancellation thrown into it), so a caller sees a task's
semantics either way. What the coroutine did before it first waited ran in the caller's
context, as a direct `await` would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def start(coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """The coroutine's result as a future: done already when it never waited."""
    loop = asyncio.get_running_loop()
    try:
        waiting_on = coroutine.send(None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(stop.value)
        return done
    except BaseException as error:  # the caller reads it from the future
        failed: asyncio.Future[T] = loop.create_future()
        if isinstance(error, asyncio.CancelledError):
            failed.cancel()
        else:
            failed.set_exception(error)
        return failed
    return loop.create_task(_resume(coroutine, waiting_on))


async def _resume(coroutine: Coroutine[Any, Any, T], waiting_on: Any) -> T:
    """Go on with a coroutine that yielded `waiting_on` (an asyncio future, or None for
    a bare yield such as asyncio.sleep(0)) as its task would have."""
    while True:
        thrown: BaseException | None = None
        if waiting_on is None:
            try:
                await asyncio.sleep(0)
            except BaseException as error:  # a cancellation, passed on below
                thrown = error
        else:
            if not asyncio.isfuture(waiting_on):
                coroutine.close()
                raise RuntimeError(f"eager coroutine yielded {waiting_on!r}, not a future")
            # Taken over as a task takes it: the coroutine's yield marked the future
            # as awaited (blocking), and awaiting it again must start from unmarked.
            waiting_on._asyncio_future_blocking = False
            try:
                await waiting_on
            except BaseException as error:
                # The future's own outcome the coroutine reads itself when resumed; anything
                # else was thrown into this task (its cancellation) and goes on into it.
                own = waiting_on.done() and (
                    waiting_on.cancelled() or waiting_on.exception() is error
                )
                if not own:
                    thrown = error
        try:
            waiting_on = coroutine.send(None) if thrown is None else coroutine.throw(thrown)
        except StopIteration as stop:
            return stop.value


async def finish(pending: Sequence[Awaitable[None]]) -> None:
    """Await each piece of work: every one started on this stack, and gathered only when
    one waits (concurrently: a batch's Redis settlements take one round trip's time)."""
    futures = [
        start(work) if asyncio.iscoroutine(work) else asyncio.ensure_future(work)
        for work in pending
    ]
    if all(future.done() for future in futures):
        for future in futures:
            future.result()  # raise what it raised, as awaiting it would
    else:
        await asyncio.gather(*futures)
