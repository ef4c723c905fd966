"""Local tools that misbehave on purpose, for the worker tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from worker.backends.local import LocalTool, tool


@dataclass
class Probe:
    """Counts calls and the most that ran at once, measured inside the tool."""

    active: int = 0
    max_active: int = 0
    calls: int = 0
    cancelled: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)


def probe_tools(probe: Probe) -> list[LocalTool]:
    @tool
    async def busy(n: int, hold_ms: float = 5.0) -> dict[str, int]:
        """Holds a concurrency slot for a while and reports its number back."""
        probe.calls += 1
        probe.active += 1
        probe.max_active = max(probe.max_active, probe.active)
        try:
            await asyncio.sleep(hold_ms / 1000)  # simulated work, not synchronisation
        finally:
            probe.active -= 1
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
        probe.calls += 1
        probe.active += 1
        try:
            await probe.release.wait()
        finally:
            probe.active -= 1
        return "released"

    @tool
    async def explode(reason: str = "kaput") -> str:
        """Raises, as a buggy tool does."""
        raise ValueError(reason)

    @tool
    async def local_device(deviceName: str) -> str:  # noqa: N803
        """A local tool with a camelCase parameter: local tools are never renamed."""
        return deviceName

    return [busy, sleepy, gate, explode, local_device]
