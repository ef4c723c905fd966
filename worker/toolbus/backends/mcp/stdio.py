"""A stdio MCP server: its process, and bounded pipes between it and a `ClientSession`.

The mcp SDK's `stdio_client` is not used: it reads stdout without a bound, at a cost
quadratic in a line's length (each chunk re-joins the whole line so far: one 100 MB
line kept a core busy for minutes), and offers no way to bound it. Its transport
contract is public (`mcp.client.Transport`: a pair of streams of `SessionMessage`), so
this module is a transport of its own under the SDK's `ClientSession`:

    stdout  split by `LineSplitter` (bounded, linear), each line parsed by the SDK's
            own `jsonrpc_message_adapter`. A line is bounded in time as well: one
            still unfinished `PARTIAL_LINE_S` after its first byte is dropped (a
            WARNING, counted), or the server's next answer would be glued to it and
            lost; a line that does not parse but whose part from the last read on
            does is that message, the bytes before it dropped the same way. A line
            over `line_limit_bytes` is never parsed: if its ends show which request
            it answers, that request gets `RESULT_TOO_LARGE` (a `tool_error` for the
            caller) and the session goes on; if it starts like a message but answers
            nothing we can name, the session ends (and is restarted); anything else
            is a bad line, counted.
    stdin   one JSON-RPC message per line, as the SDK writes them.
    stderr  split the same way, each line to the log `toolbus.mcp.{server}` (a long
            one cut, never fatal), a tail kept for error reports (`stderr`).
    end     when stdout ends, the session ends with the truth: the exit code or the
            signal, or that the server closed its stdout and runs on. It ends before
            the SDK can see either pipe close, so that an error answer with the SDK's
            own "connection closed" code, -32000, from a session still open is the
            server's answer, never a lost connection (`call.failure`).
    stop    as the MCP spec says and the SDK does: close stdin, wait, then SIGTERM
            and SIGKILL to the server's process group, every wait bounded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp.client.session import MessageHandlerFnT
from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError, jsonrpc_message_adapter

from toolbus.backends.mcp.asking import Asking, session_of
from toolbus.backends.mcp.convert import BAD_LINE_CHARS, RESULT_TOO_LARGE, describe
from toolbus.backends.mcp.environment import server_environment
from toolbus.backends.mcp.lines import LineSplitter, Oversized, answered_id, looks_like_json_object
from toolbus.backends.mcp.stderr import StderrPipe
from toolbus.config import McpServerConfig

log = logging.getLogger("toolbus.mcp")

READ_BYTES = 256 * 1024
LINE_HEADROOM_BYTES = 64 * 1024  # the JSON-RPC envelope around a result, and then some
EXIT_GRACE_S = 2.0  # after stdin closes, as the SDK waits
TERM_GRACE_S = 1.0  # after SIGTERM, before SIGKILL
KILL_REAP_S = 1.0  # after SIGKILL, for the event loop to see the exit
EXIT_SEEN_S = 1.0  # after stdout ends, for the exit status to arrive
EXIT_POLL_S = 0.01
PARTIAL_LINE_S = 2.0
"""How long a stdout line may stay unfinished. A server writes each message at once; bytes
left without a newline (a stray `print(..., end="")`) would take the next answer with them."""
LATE_READ_S = 0.01
"""Once a line's time is up, how long to wait for more of it: what has already arrived
is read first (the worker's loop, not the server, may have been the slow one)."""


def line_limit_bytes(max_result_bytes: int) -> int:
    """The longest stdout line read: a result at its limit escaped (a quote, backslash or
    newline takes two bytes on the wire), and the envelope around it."""
    return 2 * max_result_bytes + LINE_HEADROOM_BYTES


async def open_stdio(
    stack: AsyncExitStack,
    name: str,
    config: McpServerConfig,
    *,
    child_env: Mapping[str, str],
    max_result_bytes: int,
    tail: deque[str],
    on_end: Callable[[str], None],
    on_partial: Callable[[], None],
    message_handler: MessageHandlerFnT,
    asking: Asking | None = None,
) -> ClientSession:
    """Start the server and open a session to it; both close with `stack`. `asking`
    answers the server's questions (and declares that toolbus can ask its callers).

    `on_end` is called with the reason once the server's side is over (its stdout
    ended, or a line answering no call was too long to read); `on_partial` each time
    an unfinished stdout line is dropped.
    """
    assert config.command is not None
    # The worker's own environment, read as any process launcher does: only the basics.
    env = server_environment(os.environ, child_env, config.env)
    read, write = await stack.enter_async_context(
        stdio_transport(
            name,
            [config.command, *config.args],
            env=env,
            cwd=config.cwd,
            max_result_bytes=max_result_bytes,
            tail=tail,
            on_end=on_end,
            on_partial=on_partial,
        )
    )
    return await stack.enter_async_context(session_of(read, write, message_handler, asking))


@asynccontextmanager
async def stdio_transport(
    name: str,
    command: list[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    max_result_bytes: int,
    tail: deque[str],
    on_end: Callable[[str], None],
    on_partial: Callable[[], None] = lambda: None,
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The server's process, and the streams a `ClientSession` takes (an MCP transport)."""
    stderr = await StderrPipe.open(name, tail)
    try:
        process = await anyio.open_process(
            command, env=dict(env), cwd=cwd, start_new_session=True, stderr=stderr.write_fd
        )
    except BaseException:
        stderr.close()
        raise
    stderr.given()
    # No awaits until the task group is entered: a cancellation there would leak it.
    pipes = Pipes(
        name,
        process,
        max_result_bytes=max_result_bytes,
        stderr=stderr,
        on_end=on_end,
        on_partial=on_partial,
    )
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(pipes.read_stdout, incoming_send)
        tasks.start_soon(pipes.write_stdin, outgoing_receive)
        try:
            yield incoming, outgoing
        finally:
            # Every wait in `stop` is bounded; shielded, so a cancelled holder cannot
            # leave the process running.
            with anyio.CancelScope(shield=True):
                await pipes.stop()
                for stream in (incoming, incoming_send, outgoing, outgoing_receive):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


class OversizedLine(ValueError):
    """A stdout line over the limit that is not a message: never read, counted as bad."""

    def __init__(self, line: Oversized, limit_bytes: int) -> None:
        start = line.head[:120].decode("utf-8", "replace")
        super().__init__(
            f"a line of {line.size_bytes} bytes, over the limit of {limit_bytes}, not read: {start}"
        )


class Pipes:
    """The three pipes of one server process, and how the process is stopped."""

    def __init__(
        self,
        name: str,
        process: Process,
        *,
        max_result_bytes: int,
        stderr: StderrPipe,
        on_end: Callable[[str], None],
        on_partial: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.process = process
        self.max_result_bytes = max_result_bytes
        self.line_limit_bytes = line_limit_bytes(max_result_bytes)
        self.stderr = stderr
        self.stopping = False
        self._on_end = on_end
        self._on_partial = on_partial

    def _end(self, why: str) -> None:
        if not self.stopping:
            self._on_end(why)

    # -- stdout ----------------------------------------------------------------------

    async def read_stdout(self, sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        assert self.process.stdout is not None
        splitter = LineSplitter(self.line_limit_bytes)
        delivering = True
        began: float | None = None  # when the open line, if any, began
        with contextlib.suppress(
            anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError
        ):
            while True:
                chunk = await self._receive(began)
                if chunk is None:  # the open line outlived its time: drop it
                    self._drop_partial(splitter.rest())
                    began = None
                    continue
                lines = splitter.feed(chunk)
                if not splitter.open:
                    began = None
                elif lines or began is None:  # the open line began in this chunk
                    began = anyio.current_time()
                for index, line in enumerate(lines):
                    item = self._item(line, splitter.carried if index == 0 else 0)
                    if item is None or not delivering:
                        continue  # the session is gone: drain, so the server never blocks
                    try:
                        await _deliver(sink, item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        delivering = False
        if not self.stopping:
            self._end(await self._exit_reason("the server closed its stdout and runs on"))
        # After the reason: the session then fails what is in flight (connection closed).
        await sink.aclose()

    async def _receive(self, began: float | None) -> bytes | None:
        """The next chunk of stdout; None once a line open since `began` is too old."""
        assert self.process.stdout is not None
        if began is None:
            return await self.process.stdout.receive(READ_BYTES)
        with anyio.move_on_after(began + PARTIAL_LINE_S - anyio.current_time()):
            return await self.process.stdout.receive(READ_BYTES)
        with anyio.move_on_after(LATE_READ_S):
            return await self.process.stdout.receive(READ_BYTES)
        return None

    def _drop_partial(self, line: bytes | Oversized | None, *, glued: bool = False) -> None:
        size = line.size_bytes if isinstance(line, Oversized) else len(line or b"")
        start = line.head if isinstance(line, Oversized) else (line or b"")
        log.warning(
            "MCP server %s left a stdout line of %d bytes unfinished %s: dropped: %s",
            self.name,
            size,
            "with its next message glued on" if glued else f"for {PARTIAL_LINE_S:.1f} s",
            start[:BAD_LINE_CHARS].decode("utf-8", "replace"),
        )
        self._on_partial()

    def _item(self, line: bytes | Oversized, carried: int) -> SessionMessage | Exception | None:
        """What a line is; `carried`: how many of its bytes came before the last read."""
        if isinstance(line, Oversized):
            return self._oversized(line)
        if not line or line.isspace():  # (not `strip()`: that copies the line)
            return None
        try:
            return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:  # not JSON-RPC: the session hands it to our handler
            bad = exc
        if not carried:
            return bad
        try:  # bytes left unfinished, then a message glued on: the message alone, once
            message = jsonrpc_message_adapter.validate_json(line[carried:], by_name=False)
        except ValueError:
            return bad
        self._drop_partial(line[:carried], glued=True)
        return SessionMessage(message)

    def _oversized(self, line: Oversized) -> SessionMessage | Exception | None:
        ident = answered_id(line)
        if ident is not None:
            log.warning(
                "MCP server %s answered request %s with a line of %d bytes, over the limit "
                "of %d: not read, the call gets tool_error",
                self.name,
                ident,
                line.size_bytes,
                self.line_limit_bytes,
            )
            error = ErrorData(
                code=RESULT_TOO_LARGE,
                message="the answer is too large",
                data={"limit_bytes": self.max_result_bytes, "received_bytes": line.size_bytes},
            )
            return SessionMessage(JSONRPCError(jsonrpc="2.0", id=ident, error=error))
        if looks_like_json_object(line):
            # Perhaps an answer whose id we cannot see: its call would wait forever.
            self._end(
                f"the server wrote a stdout line of {line.size_bytes} bytes, over the limit "
                f"of {self.line_limit_bytes}, that answers no call we can name"
            )
            return None
        return OversizedLine(line, self.line_limit_bytes)

    # -- stdin -----------------------------------------------------------------------

    async def write_stdin(self, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
        assert self.process.stdin is not None
        # `source` closes only once the end is told: a call that then cannot write (the SDK
        # raises its CONNECTION_CLOSED) finds the session ended, as a lost connection must.
        async with source:
            try:
                async for message in source:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await self.process.stdin.send(text.encode() + b"\n")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
                if not self.stopping:
                    reason = f"writing to the server failed: {describe(exc)}"
                    self._end(await self._exit_reason(reason))

    # -- the process -----------------------------------------------------------------

    async def _exit_reason(self, running: str) -> str:
        """Why the server's side ended: how its process exited, else `running`."""
        code = await _exit_code(self.process, EXIT_SEEN_S)
        if code is None:
            return running
        if code < 0:
            return f"the server process was killed by signal {_signal_name(-code)}"
        return f"the server process exited with code {code}"

    async def stop(self) -> None:
        """Close stdin, wait, then SIGTERM and SIGKILL the process group (bounded)."""
        self.stopping = True
        assert self.process.stdin is not None
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self.process.stdin.aclose()
        if await _exit_code(self.process, EXIT_GRACE_S) is None:
            self._signal_group(signal.SIGTERM)
            if await _exit_code(self.process, TERM_GRACE_S) is None:
                self._signal_group(signal.SIGKILL)
                if await _exit_code(self.process, KILL_REAP_S) is None:
                    log.warning(
                        "MCP server %s (pid %d) is still alive after SIGKILL; abandoning it",
                        self.name,
                        self.process.pid,
                    )
        self.stderr.close()
        if self.process.stdout is not None:
            with contextlib.suppress(OSError, anyio.BrokenResourceError):
                await self.process.stdout.aclose()

    def _signal_group(self, sig: signal.Signals) -> None:
        # The server leads its own process group (start_new_session): its children too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


async def _deliver(
    sink: MemoryObjectSendStream[SessionMessage | Exception], item: SessionMessage | Exception
) -> None:
    """Hand a message to the session: at once when it waits for one (as it does between
    messages), which saves the answer the extra turn of the event loop that `send` takes
    before handing over."""
    try:
        sink.send_nowait(item)
    except anyio.WouldBlock:
        await sink.send(item)


async def _exit_code(process: Process, within_s: float) -> int | None:
    """The process's exit status once it has one, else None after `within_s`.

    Polled, not `process.wait()`: on Python 3.11 that also waits for every pipe to
    close, and a child of the server holding one would make an exited server look alive.
    """
    with anyio.move_on_after(within_s):
        while process.returncode is None:  # noqa: ASYNC110 -- no event to wait on, see above
            await anyio.sleep(EXIT_POLL_S)
    return process.returncode


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
