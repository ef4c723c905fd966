"""Real processes the tests start: `toolbus serve`, the HTTP demo server, backends.

Readiness is read from each process's own output (a line it prints when it is up),
within a bound; never slept on.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
BUNDLED_CONFIG = ROOT / "config" / "toolbus.toml"


async def wait_for_line(
    stream: asyncio.StreamReader, marker: bytes, what: str, timeout_s: float = 30
) -> None:
    """Read until a line holding `marker`; fail with what the process said if it ends first."""
    seen: list[bytes] = []
    async with asyncio.timeout(timeout_s):
        while marker not in (line := await stream.readline()):
            seen.append(line)
            assert line, f"{what} exited: {b''.join(seen[-20:])!r}"


async def start_serve(
    broker_url: str, env: dict[str, str], **streams: Any
) -> asyncio.subprocess.Process:
    """`toolbus serve` with the bundled config, as `make run` starts it."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus",
        "serve",
        "--config",
        str(BUNDLED_CONFIG),
        "--broker",
        broker_url,
        env=env,
        **streams,
    )


async def start_http_demo(port: int) -> asyncio.subprocess.Process:
    """The demo MCP server on streamable HTTP, started and ready."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus",
        "demo-server",
        "--http",
        f"127.0.0.1:{port}",
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    await wait_for_line(proc.stderr, b"Uvicorn running", "the HTTP demo server")
    return proc


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """Killed, reaped and its pipes read to the end, within a bound."""
    if proc.returncode is None:
        proc.kill()
    async with asyncio.timeout(10):
        await proc.communicate()


def install_plugin(directory: Path, module: str, source: str, tools: dict[str, str]) -> Path:
    """A local-tool package on disk, found through the `toolbus.tools` entry point once
    `directory` is on PYTHONPATH. `tools` maps entry names to `module:function`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(source)
    dist = directory / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in tools.items())
    (dist / "entry_points.txt").write_text(f"[toolbus.tools]\n{lines}")
    return directory
