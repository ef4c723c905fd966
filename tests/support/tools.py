"""Local tools that misbehave on purpose, for the worker tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from toolbus.backends.local.functions import LocalTool, tool


@dataclass
class Probe:
    """Counts calls and the most that ran at once, measured inside the tool."""

    active: int = 0
    max_active: int = 0
    calls: int = 0
    cancelled: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def enter(self) -> None:
        async with self.changed:
            self.calls += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.changed.notify_all()

    async def leave(self) -> None:
        async with self.changed:
            self.active -= 1
            self.changed.notify_all()

    async def wait_active(self, count: int, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s), self.changed:
            await self.changed.wait_for(lambda: self.active >= count)


def probe_tools(probe: Probe) -> list[LocalTool]:
    @tool
    async def busy(n: int, hold_ms: float = 5.0) -> dict[str, int]:
        """Holds a concurrency slot for a while and reports its number back."""
        await probe.enter()
        try:
            await asyncio.sleep(hold_ms / 1000)  # simulated work, not synchronisation
        finally:
            await probe.leave()
        return {"n": n}

    @tool
    async def sleepy(seconds: float = 60.0) -> str:
        """Sleeps past any sensible deadline; records its cancellation."""
        probe.calls += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            probe.cancelled += 1
            raise
        return "woke up"

    @tool
    async def gate() -> str:
        """Waits until the test opens the gate (for in-flight work at shutdown)."""
        await probe.enter()
        try:
            await probe.release.wait()
        finally:
            await probe.leave()
        return "released"

    @tool
    async def explode(reason: str = "kaput") -> str:
        """Raises, as a buggy tool does."""
        raise ValueError(reason)

    @tool
    async def local_device(deviceName: str) -> str:  # noqa: N803 -- camelCase is the schema's name
        """A local tool with a camelCase parameter: local tools are never renamed."""
        return deviceName

    return [busy, sleepy, gate, explode, local_device]


@tool
async def quits(how: str = "exit") -> str:
    """Ends the process, as a careless tool does (`sys.exit()`, KeyboardInterrupt)."""
    raise SystemExit(3) if how == "exit" else KeyboardInterrupt
