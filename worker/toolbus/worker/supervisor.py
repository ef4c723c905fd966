"""Supervisor: N worker processes kept running (`toolbus serve --processes N`).

Each child is a `toolbus serve` of its own (one process: its own event loop, MCP
sessions and signal handling), on the shared subscription, so the broker spreads the
requests over them. The parent connects to nothing itself; it only starts children,
restarts one that ends unasked (after a bounded exponential backoff), and stops them all:

    SIGTERM/SIGINT to the parent -> SIGTERM to every child -> each drains as a single
    `serve` does -> a child still running after its drain bound is SIGKILLed -> exit 0

Children stopped together decide among themselves which keeps its subscription for the
next start (the last to say `stopping`: see `handover`); the parent need not tell them.

A child that exits with a configuration or broker-refused code at its first start
would only do so again: the parent stops the others and exits with that code.

A parent that dies without stopping them (SIGKILL, a crash) must not leave workers
behind: on Linux each child asks the kernel, as it starts, to be sent SIGTERM when
its parent dies (`PR_SET_PDEATHSIG`), and so drains like on any other SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from toolbus.config import Settings

log = logging.getLogger("toolbus.supervisor")

FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 30.0
STEADY_AFTER_S = 60.0  # a child that ran this long failed afresh: its backoff starts over
# `McpBackend.close_bound_s`, not imported (the supervisor loads no backend); a test keeps
# them equal.
MCP_CLOSE_BOUND_S = 15.0
STOP_MARGIN_S = 5.0  # a child's exit after its drain: flushing, interpreter shutdown
KILL_BOUND_S = 5.0  # SIGKILL is not refused; this bounds the wait for the kernel
# Exit codes that say the configuration or the broker refuses: a restart would repeat them.
REFUSED_AT_START = frozenset({EXIT_USAGE, EXIT_BROKER})
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def child_stop_bound_s(shutdown_grace_s: float, publish_timeout_s: float) -> float:
    """How long a child may take from SIGTERM to exit: a `Worker`'s own stop bound (the
    grace period, four bounded steps, closing the MCP servers) plus a margin."""
    return shutdown_grace_s + 4 * publish_timeout_s + MCP_CLOSE_BOUND_S + STOP_MARGIN_S


def supervise(settings: Settings, flags: Sequence[str]) -> int:
    """Run `settings.processes` children of `toolbus serve *flags` until SIGTERM or SIGINT;
    the exit code (0, or a child's refusal at its first start)."""
    if settings.dedup_store == "memory":
        log.warning(
            "dedup_store is memory: each process remembers only its own request ids, so a "
            "request sent again may run again in another process; use a redis:// store"
        )
    supervisor = Supervisor(
        [sys.executable, "-m", "toolbus", "serve", *flags, "--processes", "1"],
        settings.processes,
        worker_id=settings.worker_id,
        http_port=settings.http_port,
        stop_bound_s=child_stop_bound_s(settings.shutdown_grace_s, settings.publish_timeout_s),
    )
    return asyncio.run(supervisor.run())


class Supervisor:
    """Keeps `processes` children of `command` running until `stop()` (or a signal).

    Args:
        command: a child's command line: a `toolbus serve` of one process.
        processes: how many children; child `i` counts from 1.
        worker_id: with one, child `i` is `{worker_id}-{i}`, the same id on every restart
            (so it resumes its persistent session); without, each child makes its own.
        http_port: with one, child `i` serves /metrics, /healthz and /readyz on
            `http_port + i - 1`.
        stop_bound_s: how long a child may drain after SIGTERM before it is SIGKILLed.
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        worker_id: str | None,
        http_port: int | None,
        stop_bound_s: float,
    ) -> None:
        self._command = list(command)
        self._processes = processes
        self._worker_id, self._http_port = worker_id, http_port
        self._stop_bound_s = stop_bound_s
        self._stop = asyncio.Event()
        self._refused: int | None = None

    def child_env(self, slot: int) -> dict[str, str]:
        """Child `slot`'s environment: this one, with its own worker id and HTTP port
        (the environment outranks the config file, so these win over what it says)."""
        own: dict[str, str] = {SUPERVISOR_PID_ENV: str(os.getpid())}
        if self._worker_id:
            own["TOOLBUS_WORKER_ID"] = f"{self._worker_id}-{slot}"
        if self._http_port is not None:
            own["TOOLBUS_HTTP_PORT"] = str(self._http_port + slot - 1)
        return {**os.environ, **own}

    def stop(self) -> None:
        """Stop every child (each drains) and return from `run`."""
        self._stop.set()

    async def run(self) -> int:
        """Until stopped: 0, or the exit code of a child refused at its first start."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop)
        log.info("supervising %d worker processes", self._processes)
        async with asyncio.TaskGroup() as group:
            for slot in range(1, self._processes + 1):
                group.create_task(self._keep(slot), name=f"child-{slot}")
        log.info("all %d worker processes stopped", self._processes)
        return EXIT_OK if self._refused is None else self._refused

    async def _keep(self, slot: int) -> None:
        """Child `slot`, restarted whenever it ends unasked, until the supervisor stops."""
        loop = asyncio.get_running_loop()
        delay_s, first = FIRST_RESTART_DELAY_S, True
        while not self._stop.is_set():
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._command,
                    env=self.child_env(slot),
                    stdin=asyncio.subprocess.DEVNULL,
                )
            except (OSError, subprocess.SubprocessError) as exc:  # fork or exec failed
                log.warning(
                    "worker process %d could not start (%s); retrying in %.1f s", slot, exc, delay_s
                )
                await self._pause(delay_s)
                delay_s = min(delay_s * 2, MAX_RESTART_DELAY_S)
                continue
            started = loop.time()
            log.info("worker process %d started: pid %d", slot, proc.pid)
            try:
                code = await self._exit_code(proc)
                if code is None:
                    await self._end(slot, proc)
                    return
            finally:  # cancelled (a sibling's error): the child drains on its own
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
            if first and code in REFUSED_AT_START:
                log.error("worker process %d %s at its first start: stopping", slot, _how(code))
                self._refused = code
                self._stop.set()
                return
            first = False
            if loop.time() - started >= STEADY_AFTER_S:
                delay_s = FIRST_RESTART_DELAY_S
            log.warning(
                "worker process %d (pid %d) %s; restarting in %.1f s",
                slot,
                proc.pid,
                _how(code),
                delay_s,
            )
            await self._pause(delay_s)
            delay_s = min(delay_s * 2, MAX_RESTART_DELAY_S)

    async def _pause(self, delay_s: float) -> None:
        """The backoff before a restart, cut short by a stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._stop.wait()

    async def _exit_code(self, proc: asyncio.subprocess.Process) -> int | None:
        """Wait until the child exits (its exit code) or the supervisor stops (None)."""
        exited = asyncio.create_task(proc.wait(), name=f"wait-{proc.pid}")
        stopping = asyncio.create_task(self._stop.wait(), name=f"stop-{proc.pid}")
        try:
            await asyncio.wait((exited, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (exited, stopping):
                task.cancel()
            await asyncio.gather(exited, stopping, return_exceptions=True)
        return None if self._stop.is_set() else proc.returncode

    async def _end(self, slot: int, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM, a bounded wait while it drains, then SIGKILL."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it exited just now
                proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self._stop_bound_s):
                await proc.wait()
        except TimeoutError:
            log.warning(
                "worker process %d (pid %d) did not stop within %.0f s: killing it",
                slot,
                proc.pid,
                self._stop_bound_s,
            )
            proc.kill()
            try:
                async with asyncio.timeout(KILL_BOUND_S):
                    await proc.wait()
            except TimeoutError:  # not reaped yet: nothing more a parent can do
                log.error(  # noqa: TRY400 -- the timeout's traceback says nothing more
                    "worker process %d (pid %d) survived SIGKILL", slot, proc.pid
                )
                return
        log.info("worker process %d (pid %d) stopped: %s", slot, proc.pid, _how(proc.returncode))


def _how(code: int | None) -> str:
    """An exit status as words: `exited with code 1`, `killed by SIGKILL`."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


SUPERVISOR_PID_ENV = "TOOLBUS_SUPERVISOR_PID"


def die_with_supervisor(environ: Mapping[str, str]) -> None:
    """In a child (its environment names the supervisor): get SIGTERM when the supervisor
    dies (Linux: `prctl(PR_SET_PDEATHSIG)`), and exit at once if it has died already.

    Called by the child itself at start, not between fork and exec: the supervisor has
    threads (asyncio's child watcher), and code run after a fork in a threaded process
    may deadlock before exec.
    """
    supervisor = environ.get(SUPERVISOR_PID_ENV)
    if not supervisor or not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if str(os.getppid()) != supervisor:  # it died before we asked: no signal will come
        os._exit(1)
