"""A steady load for the network-fault tests: requests to the recording tool through a
retrying `toolbus.Client`, `in_flight` at a time, sent until told to stop (so a fault and
its repair fit inside it however fast the machine is), each outcome kept: the reply, or
the exception that ended the request (counted as lost, never raised mid-load).

The counts are the chaos tests' (tests/worker/test_chaos.py): lost, executed twice (from
the recording tool's file), in_doubt, unavailable, resent.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.support.fleet import Executions
from tests.support.harness import measured
from toolbus.client.client import Client, Retry
from toolbus.wire.contracts import Reply

# A worker cut off for a few seconds, then back, must fit between the first send and the
# last: 10 sends, 2 s apart (the chaos tests' own).
RETRY = Retry(attempts=10, interval_s=2.0)
CALL_TIMEOUT_S = 40.0


class Resends:
    """A `Client`'s `on_resend`: counts the repeats and wakes who waits for one."""

    def __init__(self) -> None:
        self.count = 0
        self._one = asyncio.Event()

    def __call__(self, send: int, sends: int) -> None:
        self.count += 1
        self._one.set()

    async def beyond(self, count: int, timeout_s: float = 20.0) -> None:
        """Once more than `count` repeats were sent."""
        async with asyncio.timeout(timeout_s):
            while self.count <= count:
                self._one.clear()
                await self._one.wait()


class SteadyLoad:
    """Requests `{tag}0, {tag}1, ...` to `{prefix}/call/record`, each holding `hold_s`."""

    def __init__(self, client: Client, prefix: str, *, tag: str, hold_s: float) -> None:
        self.client, self.topic = client, f"{prefix}/call/record"
        self.tag, self.hold_s = tag, hold_s
        self.sent = 0
        self.replies: dict[str, Reply] = {}
        self.failed: dict[str, BaseException] = {}  # lost: no reply after every send
        self._stop = asyncio.Event()
        self._progress = asyncio.Condition()

    def stop(self) -> None:
        """No new request; those sent still run to their end."""
        self._stop.set()

    async def run(self, in_flight: int) -> None:
        slots = asyncio.Semaphore(in_flight)

        async def one(key: str) -> None:
            try:
                body = {"id": key, "arguments": {"key": key, "hold_s": self.hold_s}}
                reply = await self.client.request(self.topic, body, timeout_s=CALL_TIMEOUT_S)
                assert isinstance(reply, Reply)  # one call, our envelope: a plain reply
            except Exception as exc:  # counted as lost, reported with the rest
                outcome: Reply | Exception = exc
            else:
                outcome = reply
            async with self._progress:
                if isinstance(outcome, Reply):
                    self.replies[key] = outcome
                else:
                    self.failed[key] = outcome
                self._progress.notify_all()
            slots.release()

        async with asyncio.TaskGroup() as group:
            while True:
                await slots.acquire()
                if self._stop.is_set():
                    break
                group.create_task(one(f"{self.tag}{self.sent}"))
                self.sent += 1

    async def reached(self, count: int, timeout_s: float = 30.0) -> None:
        """Once `count` replies are in."""
        async with asyncio.timeout(timeout_s), self._progress:
            await self._progress.wait_for(lambda: len(self.replies) >= count)

    async def ended(self, sent: int, timeout_s: float = 30.0) -> None:
        """Once each of the first `sent` requests has its outcome (a reply, or lost)."""
        keys = [f"{self.tag}{n}" for n in range(sent)]
        async with asyncio.timeout(timeout_s), self._progress:
            await self._progress.wait_for(
                lambda: all(k in self.replies or k in self.failed for k in keys)
            )

    def codes(self) -> Counter[str]:
        return Counter(
            "ok" if r.error is None else r.error.code.value for r in self.replies.values()
        )

    def report(self, scenario: str, executions: Executions) -> None:
        """Print the counts; assert nothing lost, nothing executed twice."""
        lost = self.sent - len(self.replies)
        twice = sorted(key for key, runs in executions.counts().items() if runs > 1)
        codes = self.codes()
        measured(
            f"{scenario}: sent {self.sent}, answered {len(self.replies)}, lost {lost}, "
            f"executed twice {len(twice)}, in_doubt {codes['in_doubt']}, "
            f"unavailable {codes['unavailable']}, resent {self.client.resent}"
        )
        assert lost == 0, {key: repr(exc) for key, exc in list(self.failed.items())[:5]}
        assert twice == []
        # Every call answered `ok` ran, exactly once.
        counts = executions.counts()
        assert [k for k, r in self.replies.items() if r.error is None and counts[k] != 1] == []
