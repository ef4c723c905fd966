"""What `make run` runs, for the examples written against it: a broker of our own (so
the default prefix `toolbus` is no other test's) and `toolbus serve` with the bundled
config, ready once its worker is online and the demo device server is ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, Serve, serve_env

PREFIX = "toolbus"  # the bundled default every documented topic is written with
BIN = Path(sys.executable).parent  # the bundled config runs `toolbus demo-server`


@asynccontextmanager
async def bundled_worker(directory: Path) -> AsyncIterator[Broker]:
    """A broker and, subscribed to it, `toolbus serve --config config/toolbus.toml`."""
    broker = Broker(directory)
    broker.start()
    env = serve_env()
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    try:
        async with Serve(env, "--broker", broker.url), Caller(broker.url) as watcher:
            await _until_ready(watcher)
            yield broker
    finally:
        broker.stop()


async def _until_ready(watcher: Caller) -> None:
    """Until the retained statuses say: a worker online, the demo server ready (`#`
    matches the server's status whether or not its topic names the worker)."""
    await watcher.subscribe(f"{PREFIX}/status/workers/+")
    await watcher.subscribe(f"{PREFIX}/status/servers/devices/#")
    online = devices_ready = False
    async with asyncio.timeout(RUN_BOUND_S):
        while not (online and devices_ready):
            message = await watcher.next_message(timeout_s=RUN_BOUND_S)
            state = json.loads(message.payload).get("state")
            if message.topic.value.startswith(f"{PREFIX}/status/workers/"):
                online = state == "online"
            else:
                devices_ready = state == "ready"
