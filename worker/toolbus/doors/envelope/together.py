"""Together: the calls of one message, run at once, answered in the calls' order.

The message holds one of the worker's slots; its calls borrow whatever other slots are
free when it starts, one lane per slot, and each lane takes the next call not yet
started. So a message of five calls on an idle worker runs them all at once, and on a
busy one runs them one after another in its own slot: never more calls at once than the
worker's `concurrency`, and never a wait for slots that other messages hold (which
could deadlock a pool of many-call messages). One call's failure is its own answer;
the others run on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from toolbus.calls.call import Call
from toolbus.calls.execute import Outcome
from toolbus.calls.inflight import Slots
from toolbus.calls.replies import reply_for_call
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import Unavailable

# After a shutdown cancels a message, how long its lanes get to answer their calls.
LANE_ANSWER_TIMEOUT_S = 5.0


async def run_together(
    calls: Sequence[Call],
    answer: Callable[[Call], Awaitable[Reply]],
    slots: Slots,
    stopping: Callable[[], bool],
    *,
    max_lanes: int | None = None,
) -> list[Reply]:
    """Each call's reply, in order. `answer` never raises (it answers every outcome).

    `max_lanes` caps how many run at once (the caller's quota room), beyond the slots.
    """
    replies: list[Reply | None] = [None] * len(calls)
    queue = iter(enumerate(calls))
    halted = asyncio.Event()  # shutdown: no call starts any more
    held = 0  # borrowed slots not given back yet

    def give_back() -> None:
        nonlocal held
        if held:
            held -= 1
            slots.release()

    async def lane(borrowed: bool) -> None:
        try:
            for index, call in queue:
                if halted.is_set():
                    return
                replies[index] = await answer(call)
        finally:
            if borrowed:  # the queue is empty: the slot goes back now, not at the end
                give_back()

    wide = len(calls) if max_lanes is None else max(1, min(len(calls), max_lanes))
    borrowed = held = await slots.borrow(wide - 1)
    me = asyncio.current_task()
    name = me.get_name() if me is not None else "calls"
    lanes = [
        asyncio.create_task(lane(borrowed=n > 0), name=f"{name}:lane{n}")
        for n in range(borrowed + 1)
    ]
    try:
        await asyncio.wait(lanes)
    except asyncio.CancelledError:
        # Cancelled (the worker stops): each lane's running call answers `unavailable`,
        # no new call starts, and every lane has ended (bounded) before we return.
        halted.set()
        for task in lanes:
            task.cancel()
        await asyncio.wait(lanes, timeout=LANE_ANSWER_TIMEOUT_S)
        if not stopping() or me is None:
            raise
        me.uncancel()
    finally:
        while held:  # a lane cancelled before it ever ran never reached its `finally`
            give_back()
    return [
        reply if reply is not None else _unanswered(call)
        for call, reply in zip(calls, replies, strict=True)
    ]


def _unanswered(call: Call) -> Reply:
    """A call the shutdown reached before it started (or a lane that could not answer)."""
    error = Unavailable("the worker shut down before the call ran")
    return reply_for_call(call, Outcome(tool=None, error=error))
