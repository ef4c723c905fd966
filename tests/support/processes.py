"""Real processes the tests start: `toolbus serve`, the HTTP demo server, backends.

Readiness is read from each process's own output (a line it prints when it is up),
within a bound; never slept on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
BUNDLED_CONFIG = ROOT / "config" / "toolbus.toml"
RUN_BOUND_S = 30.0  # a `toolbus serve` starts, or ends, within this


async def wait_for_line(
    stream: asyncio.StreamReader, marker: bytes, what: str, timeout_s: float = 30
) -> None:
    """Read until a line holding `marker`; fail with what the process said if it ends first."""
    seen: list[bytes] = []
    async with asyncio.timeout(timeout_s):
        while marker not in (line := await stream.readline()):
            seen.append(line)
            assert line, f"{what} exited: {b''.join(seen[-20:])!r}"


async def run_bounded(
    *argv: str,
    env: dict[str, str],
    bound_s: float,
    cwd: Path | None = None,
    typed: bytes | None = None,
) -> tuple[int, str, str]:
    """Run `argv` to its end: exit code, standard output and error. Killed (and reaped)
    when it overruns `bound_s`, which then fails the test with a `TimeoutError`.
    `typed`: its standard input, a pipe holding these bytes (else it inherits ours)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if typed is not None else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(bound_s):
            out, err = await proc.communicate(typed)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def start_serve(
    broker_url: str, env: dict[str, str], **streams: Any
) -> asyncio.subprocess.Process:
    """`toolbus serve` with the bundled config, as `make run` starts it."""
    return await spawn_serve(env, "--broker", broker_url, **streams)


async def spawn_serve(
    env: dict[str, str], *flags: str, **streams: Any
) -> asyncio.subprocess.Process:
    """`toolbus serve --config <the bundled config> *flags`."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus",
        "serve",
        "--config",
        str(BUNDLED_CONFIG),
        *flags,
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


def serve_env(**settings: str) -> dict[str, str]:
    """This environment without TOOLBUS_*/OTEL_* settings, plus `settings` as TOOLBUS_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "OTEL_"))}
    env.update({f"TOOLBUS_{k.upper()}": v for k, v in settings.items()})
    return env


class Serve:
    """A `toolbus serve` with the bundled config, every line it writes kept."""

    def __init__(self, env: dict[str, str], *flags: str) -> None:
        self.env, self.flags = env, flags
        self.stderr: list[str] = []
        self.stdout = ""
        self._seen = asyncio.Condition()
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Serve:
        self._proc = await spawn_serve(
            self.env, *self.flags, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self._reader = asyncio.create_task(self._read(), name="serve-stderr")
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._proc is not None
        if self._proc.returncode is None:
            self._proc.kill()
        async with asyncio.timeout(RUN_BOUND_S):
            await self._proc.wait()

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while line := await self._proc.stderr.readline():
            async with self._seen:
                self.stderr.append(line.decode(errors="replace"))
                self._seen.notify_all()

    def kill(self) -> None:
        """SIGKILL: no drain, no last words but the broker's will."""
        assert self._proc is not None
        self._proc.kill()

    async def wait_for(self, marker: str, times: int = 1) -> None:
        """Until `times` stderr lines hold `marker` (bounded; fails if the process ends
        first)."""
        reader = self._reader
        assert reader is not None

        def seen() -> bool:
            return sum(marker in line for line in self.stderr) >= times

        async with asyncio.timeout(RUN_BOUND_S), self._seen:
            await self._seen.wait_for(lambda: seen() or reader.done())
        assert seen(), self.stderr

    async def exit_code(self, *, stop: bool = False) -> int:
        """Its exit code once it ends (after SIGTERM with `stop`), all output read."""
        assert self._proc is not None and self._proc.stdout is not None
        assert self._reader is not None
        if stop:
            self._proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(RUN_BOUND_S):
            self.stdout = (await self._proc.stdout.read()).decode(errors="replace")
            await self._reader
            return await self._proc.wait()

    @property
    def output(self) -> str:
        return self.stdout + "".join(self.stderr)

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid
