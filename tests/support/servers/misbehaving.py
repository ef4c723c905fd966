"""An MCP test server that misbehaves on request, over stdio (or streamable HTTP).

Modes, from the environment:
  TB_SLOW_START_S    sleep this long before serving (a slow start)
  TB_START_GATE      a FIFO: wait for a byte on it before serving (a start the test ends)
  TB_FAIL_STARTS     fail this many starts first (counted in TB_STATE_DIR), then serve
  TB_CRASH_ON_CALL   exit abruptly on the Nth call to `work`
  TB_GARBAGE         print non-JSON lines to stdout before serving
  TB_STATE_DIR       where it writes its pid and counts (for the tests to read)
  TB_HTTP_PORT       serve streamable HTTP on 127.0.0.1:PORT instead of stdio
Tools: `work` (answers), `exit_now` (dies mid-call), `hang` (never answers),
`stubborn` (ignores cancellation, answers late), `noisy` (garbage on stdout, then
answers), `add_tool`/`remove_tool` (changes its tool list and notifies), `picture`
(non-text content), `env_value`/`environment` (what it inherited). Output without bounds:
`big_result` (a result of N MB), `big_answer_id_last` (writes its own N MB answer with
the id at the end, as some servers order the keys), `stdout_flood` (one N MB line that
answers no call, then a normal answer), `stderr_flood` (one N KB stderr line, then a
normal answer). Hostile to the session: `list_flood` (N `tools/list_changed` in a row;
`lists` counts the `tools/list` requests served), `fragment` (answers, then writes bytes
without a newline), `close_stdout` (closes the wire and lives on, deaf to its stdin
closing and to SIGTERM, until SIGKILL). Calls held and error answers: `hold` (waits
until `release` opens its gate), `held` (answers once N `hold` calls wait), `fail_with` (a
JSON-RPC error answer with the code asked for, as a tool raising the SDK's `MCPError`
gets, once N `hold` calls wait).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import ImageContent, TextContent
from mcp.types import Tool as ListedTool

STATE = Path(os.environ.get("TB_STATE_DIR", "."))
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()

lists = 0  # `tools/list` requests served


class CountingServer(MCPServer):
    async def list_tools(self) -> list[ListedTool]:
        global lists  # noqa: PLW0603 -- a test server's whole state
        lists += 1
        return await super().list_tools()


server = CountingServer("toolbus-test-misbehaving")
calls = 0
linger = threading.Event()  # set: outlive stdin's end (see `close_stdout`)


def bump(name: str) -> int:
    path = STATE / name
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


WIRE_INODE = os.fstat(1).st_ino  # the stdout pipe the client reads, as we were started


def wire_fd() -> int:
    """The descriptor the protocol is written to right now.

    While serving, the mcp SDK moves the wire to a private duplicate and points fd 1
    at stderr, so a print() from an SDK server cannot corrupt the stream. Servers
    built otherwise (a Node console.log, a wrapper script) can: to act like one,
    find the duplicate by the pipe it shares with the original stdout.
    """
    for name in sorted(os.listdir("/proc/self/fd"), key=int, reverse=True):
        fd = int(name)
        with contextlib.suppress(OSError):
            if fd > 2 and os.fstat(fd).st_ino == WIRE_INODE:
                return fd
    return 1


def write_all(fd: int, data: bytes) -> None:
    """All of `data`, however the pipe takes it (partly, or not now if non-blocking)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def garbage(text: str) -> None:
    write_all(wire_fd(), f"{text}\n".encode())


@server.tool()
def work(value: str) -> str:
    """Answers with its argument."""
    global calls  # noqa: PLW0603 -- a test server's whole state
    calls += 1
    crash_on = int(os.environ.get("TB_CRASH_ON_CALL", "0"))
    if crash_on and calls == crash_on:
        os._exit(3)
    return f"did {value}"


@server.tool()
def exit_now() -> str:
    """Dies in the middle of the call."""
    bump("exit_calls")
    os._exit(4)


@server.tool()
async def hang() -> str:
    """Never answers (honours cancellation)."""
    await asyncio.Event().wait()
    return "never"


@server.tool()
async def stubborn(seconds: float) -> str:
    """Ignores cancellation: keeps working, then answers (too late)."""
    end = time.monotonic() + seconds
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        bump("stubborn_cancelled")
        with anyio.CancelScope(shield=True):
            await anyio.sleep(max(0.0, end - time.monotonic()))
    return "late"


@server.tool()
def noisy(value: str) -> str:
    """Prints garbage to stdout, then answers normally."""
    garbage("DEBUG: about to answer")
    garbage('{"this is": "json but not json-rpc"}')
    return f"clean {value}"


async def tools_changed(ctx: Context) -> None:
    """Say the tools changed in both eras' words: on the session (a client that opened it
    with `initialize`) and to `subscriptions/listen` streams (a 2026-07-28 client's only
    way to hear it; a handshake-era client opens none, so nobody hears that one)."""
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Adds a tool called `name` and tells the client."""

    def extra(text: str) -> str:
        return f"{name}: {text}"

    server.add_tool(extra, name=name, description=f"added at run time as {name}")
    await tools_changed(ctx)
    return f"added {name}"


@server.tool()
async def remove_tool(name: str, ctx: Context) -> str:
    """Removes the tool called `name` and tells the client."""
    server.remove_tool(name)
    await tools_changed(ctx)
    return f"removed {name}"


active = 0
most = 0


@server.tool()
async def overlap(hold_s: float) -> int:
    """Holds for a while; answers the most calls it ever saw at once."""
    global active, most  # noqa: PLW0603 -- a test server's whole state
    active += 1
    most = max(most, active)
    try:
        await asyncio.sleep(hold_s)
    finally:
        active -= 1
    return most


@server.tool()
async def cancellations() -> int:
    """How many cancellations `stubborn` has ignored (async: read on the loop that writes)."""
    path = STATE / "stubborn_cancelled"
    return int(path.read_text()) if path.exists() else 0


@server.tool()
def env_value(name: str) -> str:
    """One variable of this server's environment ("" when unset)."""
    return os.environ.get(name, "")


@server.tool()
def environment() -> str:
    """The names of every variable in this server's environment, as a JSON list."""
    return json.dumps(sorted(os.environ))


def megabytes(mbytes: float) -> int:
    return int(mbytes * 1024 * 1024)


@server.tool()
def big_result(mbytes: float) -> str:
    """A text result of `mbytes` MB (through the SDK: `{"jsonrpc", "id", "result"}`)."""
    return "x" * megabytes(mbytes)


@server.tool()
async def big_answer_id_last(mbytes: float, ctx: Context) -> str:
    """Writes its own answer of `mbytes` MB with the id last; the SDK's answer comes late."""
    ident = ctx.request_id
    wire_id = ident if not ident.isdigit() else int(ident)
    text = "y" * megabytes(mbytes)
    body = json.dumps({"result": {"content": [{"type": "text", "text": text}]}})
    write_all(wire_fd(), f'{body[:-1]},"jsonrpc":"2.0","id":{json.dumps(wire_id)}}}\n'.encode())
    return "the real answer, too late"


@server.tool()
async def stdout_flood(mbytes: float, shape: str = "garbage", answer: bool = True) -> str:
    """One stdout line of `mbytes` MB answering no call, then a normal answer (or none).

    shape: `garbage` (not JSON) or `notification` (a JSON-RPC notification).
    """
    filler = "z" * megabytes(mbytes)
    if shape == "notification":
        message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": filler}}
        line = json.dumps(message)
    else:
        line = filler
    write_all(wire_fd(), f"{line}\n".encode())  # blocks the loop: nothing else interleaves
    if not answer:
        await asyncio.Event().wait()
    return f"after a {shape} line"


@server.tool()
def stderr_flood(kbytes: float) -> str:
    """One stderr line of `kbytes` KB, then a normal answer."""
    line = "e" * int(kbytes * 1024)
    write_all(2, f"{line}\n".encode())
    return "after a long stderr line"


@server.tool()
async def list_flood(count: int, ctx: Context, gap_s: float = 0.0) -> str:
    """Says `count` times that its tools changed (they did not), `gap_s` apart (a loop's
    pace: a simulated sleep)."""
    for _ in range(count):
        await tools_changed(ctx)
        await anyio.sleep(gap_s)
    return f"said so {count} times"


@server.tool()
async def lists_served() -> int:
    """How many `tools/list` requests this process has answered."""
    return lists


@server.tool()
async def fragment(text: str) -> str:
    """Answers, then writes `text` to stdout without a newline (once the answer is out)."""

    def write() -> None:
        write_all(wire_fd(), text.encode())
        print("fragment written", file=sys.stderr, flush=True)

    asyncio.get_running_loop().call_later(0.2, write)  # simulated: after the answer
    return "answered; a fragment follows"


@server.tool()
async def close_stdout() -> str:
    """Closes the wire to the client and lives on: deaf to SIGTERM and to stdin's end."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    linger.set()
    null = os.open(os.devnull, os.O_WRONLY)
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.fstat(int(name)).st_ino == WIRE_INODE:
                os.dup2(null, int(name))  # the pipe's last writer gone: the client sees EOF
    await asyncio.Event().wait()
    return "never"


holding: dict[str, int] = {}  # `hold` calls waiting, by gate
held_changed = asyncio.Condition()
gates: dict[str, asyncio.Event] = {}


def gate_named(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


@server.tool()
async def hold(value: str, gate: str = "") -> str:
    """Waits until `release` opens its gate, then answers with its argument."""
    async with held_changed:
        holding[gate] = holding.get(gate, 0) + 1
        held_changed.notify_all()
    await gate_named(gate).wait()
    return f"held {value}"


async def until_held(count: int, gate: str) -> None:
    async with held_changed:
        await held_changed.wait_for(lambda: holding.get(gate, 0) >= count)


@server.tool()
async def held(count: int, gate: str = "") -> int:
    """Answers once `count` calls of `hold` wait at `gate`."""
    await until_held(count, gate)
    return holding[gate]


@server.tool()
async def release(gate: str = "") -> str:
    """Lets every `hold` call at `gate` answer, now and from now on."""
    gate_named(gate).set()
    return f"released {gate}"


@server.tool()
async def fail_with(code: int, after_held: int = 0, gate: str = "") -> str:
    """Answers with a JSON-RPC error of `code` (once `after_held` calls of `hold` wait at
    `gate`): what the SDK answers for a tool that raises `MCPError`, -32000 included."""
    await until_held(after_held, gate)
    raise MCPError(code, f"failed with {code} on purpose")


@server.tool()
def picture() -> list[Any]:
    """Returns an image and a caption."""
    return [
        ImageContent(type="image", data=PNG, mime_type="image/png"),
        TextContent(type="text", text="a tiny png"),
    ]


def wait_at_the_gate(gate: str) -> None:
    """Until a byte comes on the FIFO `gate`, or no one holds it open for writing any
    more (the test ended). Opened without blocking: a blocking open waits for a writer,
    and a start that reaches it after the test closed its end (a slow start on a loaded
    machine) waited for ever, an orphan once its worker was killed."""
    fd = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)  # now a read waits for a byte, or the last writer's close
        os.read(fd, 1)
    finally:
        os.close(fd)


def main() -> None:
    (STATE / "pid").write_text(str(os.getpid()))
    starts = bump("starts")
    if starts <= int(os.environ.get("TB_FAIL_STARTS", "0")):
        print(f"failing start {starts} on purpose", file=sys.stderr)
        sys.exit(2)
    time.sleep(float(os.environ.get("TB_SLOW_START_S", "0")))
    gate = os.environ.get("TB_START_GATE")
    if gate:  # the test holds the FIFO open and writes when this start may go on
        wait_at_the_gate(gate)
    if os.environ.get("TB_GARBAGE"):
        garbage("Welcome to the misbehaving server v0.0 (a banner on stdout)")
    port = os.environ.get("TB_HTTP_PORT")
    if port:
        server.run("streamable-http", host="127.0.0.1", port=int(port))
    else:
        server.run("stdio")
    if linger.is_set():
        threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main()
