"""A toolbus cancel reaches an MCP server as MCP's own cancellation, from the outside:
a real mosquitto, a worker, a real stdio MCP server process that records its calls
(tests/support/servers/cancel_recorder.py) and a caller cancelling on `{prefix}/cancel`.

The worker cancels the task awaiting the MCP call; the mcp SDK then sends
`notifications/cancelled`, and the server's handler is interrupted. The caller's one
reply is `cancelled`, `in_doubt`: the server had the call and may have acted.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller

RECORDER = Path(__file__).parents[1] / "support" / "servers" / "cancel_recorder.py"


async def _logged(path: Path, line: str, timeout_s: float = 15.0) -> None:
    """Until the server's log holds `line` (polled, bounded: another process writes it)."""
    async with asyncio.timeout(timeout_s):
        while not (path.exists() and line in path.read_text().splitlines()):
            await asyncio.sleep(0.01)


async def test_a_cancelled_mcp_call_gets_notifications_cancelled(
    broker: Broker, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    server = {
        "command": sys.executable,
        "args": [str(RECORDER)],
        "env": {"TB_CANCEL_LOG": str(log)},
    }
    settings = make_settings(broker, mcpServers={"recorder": server})
    prefix = settings.topic_prefix
    reply_topic = f"{prefix}/reply/kitchen"
    async with running_worker(settings), Caller(broker.url) as caller:
        await caller.subscribe(reply_topic)
        body = {"id": "m1", "caller": "kitchen", "arguments": {"marker": "m1"}}
        await caller.publish(f"{prefix}/call/hold", json.dumps(body), response_topic=reply_topic)
        await _logged(log, "started m1")
        await caller.publish(f"{prefix}/cancel", json.dumps({"id": "m1", "caller": "kitchen"}))
        async with asyncio.timeout(10):
            reply = json.loads((await caller.next_message()).payload)
        await _logged(log, "cancelled m1")  # the server's handler was interrupted
    assert reply["error"]["code"] == "cancelled", reply
    assert reply["error"]["details"] == {"started": True, "in_doubt": True, "cause": "caller"}
