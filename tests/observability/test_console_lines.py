"""The terminal's log line as a real `toolbus serve` writes it (issue 30.7): fields are
`key=value` as logfmt writes them, never Python's reprs.

`log_format = "text"` is the line a terminal gets (off one, `auto` is JSON, unchanged).
A call's line carries a dict field (`argument_bytes`); the start-up lines carry strings,
numbers and booleans. Each field must read back as logfmt: a bare value without
spaces or quotes, or a double-quoted JSON string.
"""

from __future__ import annotations

import json
import re

from tests.support.harness import Broker, unique_prefix
from tests.support.processes import Serve, serve_env
from toolbus.client.client import Client
from toolbus.wire.broker import BrokerUrl

# key=value after the event words: a bare value, or a quoted one with JSON's escapes.
FIELD = re.compile(r' ([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|[^\s"]\S*|(?=\s|$))')
# Python's reprs of a field's value: a dict or list with quoted items, a constant.
REPR = re.compile(r"[{\[]'|'|None|True|False")


async def test_serve_writes_logfmt_fields_on_a_terminal_line(broker: Broker) -> None:
    prefix = unique_prefix()
    env = serve_env(
        broker_url=broker.url, topic_prefix=prefix, log_format="text", log_level="DEBUG"
    )
    async with Serve(env) as serve:
        await serve.wait_for("subscribed to")
        async with Client(BrokerUrl.from_url(broker.url), prefix=prefix) as client:
            reply = await client.call("echo", {"text": "two words"}, timeout_s=10)
        assert reply.ok
        await serve.wait_for(" call echo ok ")
        assert await serve.exit_code(stop=True) == 0
    lines = [line.rstrip("\n") for line in serve.stderr]
    [call] = [line for line in lines if " call echo ok " in line]
    assert ' argument_bytes={"text":11}' in call, call
    fields = [field for line in lines for field in FIELD.findall(line)]
    assert ("mcp_servers", '["devices"]') in fields  # a list as JSON
    for key, value in fields:
        if value.startswith('"'):
            assert isinstance(json.loads(value), str)  # a quoted value is a JSON string
        else:
            assert not REPR.match(value), (key, value)
