"""The inbox a connection's messages wait in (`transport/inbox.py`), without a broker:
in order, drained before its end, and each reader's cancel its own."""

from __future__ import annotations

import asyncio

from toolbus.transport.inbox import Inbox


async def test_messages_come_in_order_and_none_after_the_end() -> None:
    """What is still queued at the end was never acknowledged: the broker sends it again
    to the session's next holder, so it is not handed out here (a call run twice)."""
    inbox: Inbox[int] = Inbox(maxsize=0)
    reading = asyncio.create_task(inbox.next(), name="reader")
    await asyncio.sleep(0)  # the reader waits on an empty inbox
    assert not reading.done()
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    async with asyncio.timeout(5):
        assert await reading == 1
        assert await inbox.next() == 2
    inbox.put_nowait(3)
    inbox.close()
    assert inbox.qsize() == 1  # still counted (the reader's `hold`), never handed out
    async with asyncio.timeout(5):
        assert await inbox.next() is None


async def test_a_waiting_reader_wakes_at_the_end() -> None:
    inbox: Inbox[int] = Inbox()
    reading = asyncio.create_task(inbox.next(), name="reader")
    await asyncio.sleep(0)
    inbox.close()
    async with asyncio.timeout(5):
        assert await reading is None


async def test_one_reader_cancelled_leaves_the_other_waiting() -> None:
    """aiomqtt's own iterator (`get`) cancels its read when the connection goes; a
    reader of `next` waiting beside it must not be cancelled with it."""
    inbox: Inbox[str] = Inbox()
    theirs = asyncio.create_task(inbox.get(), name="aiomqtt-get")
    ours = asyncio.create_task(inbox.next(), name="ours")
    await asyncio.sleep(0)
    theirs.cancel()
    await asyncio.sleep(0)
    assert theirs.cancelled() and not ours.done()
    inbox.put_nowait("m")
    async with asyncio.timeout(5):
        assert await ours == "m"
