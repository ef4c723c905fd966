"""The demo MCP server on streamable HTTP, as a real process the tests can kill and restart."""

from __future__ import annotations

import asyncio
import sys


async def start_http_demo(port: int) -> asyncio.subprocess.Process:
    """Started and ready (uvicorn says it runs); its later stderr is drained."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        "demo-server",
        "--http",
        f"127.0.0.1:{port}",
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[bytes] = []
    async with asyncio.timeout(30):
        while b"Uvicorn running" not in (line := await proc.stderr.readline()):
            seen.append(line)
            assert line, f"the HTTP demo server exited: {b''.join(seen)!r}"
    return proc


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """Killed, reaped and its pipes read to the end, within a bound."""
    if proc.returncode is None:
        proc.kill()
    async with asyncio.timeout(10):
        await proc.communicate()
