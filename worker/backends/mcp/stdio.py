"""A stdio MCP server's process: its transport, and its stderr pumped to our log.

The server's stderr goes through a pipe of ours, never mixed with the protocol: each
line to the worker's log (logger `toolbus.mcp.{server}`) and a bounded tail kept for
error reports. EOF on that pipe means the process has exited, which ends the session
at once instead of at the next call.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import TextIO

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import MessageHandlerFnT

from toolbus.config import McpServerConfig

STDERR_LINE_CHARS = 500
CLOSE_DEADLINE_S = 5.0  # the SDK's stdio shutdown waits 2 s, then terminates the tree


async def open_stdio(
    stack: AsyncExitStack,
    name: str,
    config: McpServerConfig,
    *,
    child_env: Mapping[str, str],
    tail: deque[str],
    on_exit: Callable[[], None],
    message_handler: MessageHandlerFnT,
) -> ClientSession:
    """Start the server and open a session to it; both close with `stack`.

    Its stderr pump runs until then; `on_exit` runs once stderr reaches EOF (the
    process has exited).
    """
    assert config.command is not None
    read_fd, write_fd = os.pipe()
    errlog = os.fdopen(write_fd, "w")
    pump = asyncio.create_task(_pump(name, read_fd, tail, on_exit), name=f"mcp-stderr:{name}")
    stack.push_async_callback(_finish, pump)
    stack.callback(_close_quietly, errlog)
    params = StdioServerParameters(
        command=config.command,
        args=config.args,
        env={**child_env, **config.env} or None,  # the server's own env wins
        cwd=config.cwd,
    )
    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
    # The child holds its own copy of the pipe now; closing ours lets the pump see EOF
    # the moment the server exits.
    errlog.close()
    return await stack.enter_async_context(
        ClientSession(read, write, message_handler=message_handler)
    )


async def _pump(name: str, read_fd: int, tail: deque[str], on_exit: Callable[[], None]) -> None:
    server_log = logging.getLogger(f"toolbus.mcp.{name}")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(read_fd, "rb")
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while line := await reader.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                tail.append(text[:STDERR_LINE_CHARS])
                server_log.info("%s", text)
    finally:
        transport.close()
        on_exit()  # EOF: the process has exited (or closed stderr, which servers do not)


def _close_quietly(stream: TextIO) -> None:
    if not stream.closed:
        stream.close()


async def _finish(task: asyncio.Task[None]) -> None:
    try:
        async with asyncio.timeout(CLOSE_DEADLINE_S):
            await task
    except TimeoutError:
        task.cancel()
