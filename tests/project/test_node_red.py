"""docs/integrations/node-red-flow.json: its nodes say MQTT v5 request/response with
the topics and properties toolbus reads, and, in Node-RED itself (installed by `make
test` into .node-red), the flow calls the bundled worker and sorts the replies.

The run changes only what a user would: the broker node's address (the test's broker),
plus two `mqtt out` nodes of the test's own on the reply matcher's outputs, through
which the test sees what the flow's debug nodes would show.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.bundled import PREFIX, bundled_worker
from tests.support.harness import Broker, free_port
from tests.support.mqtt import Caller
from toolbus.config import Settings
from toolbus.worker.wiring import topics_for

ROOT = Path(__file__).parents[2]
FLOW = ROOT / "docs" / "integrations" / "node-red-flow.json"
NODE_RED = ROOT / ".node-red" / "node_modules" / ".bin" / "node-red"
START_BOUND_S = 90.0  # Node-RED loads its palette in a few seconds; a busy machine takes longer
READY = (b"Server now running", b"Connected to broker")  # its log lines: editor, broker node


def flow() -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = json.loads(FLOW.read_text(encoding="utf-8"))
    return nodes


def node(nodes: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = (n for n in nodes if n["type"] == kind)
    return found


def function(nodes: list[dict[str, Any]], name: str) -> str:
    (found,) = (n for n in nodes if n["type"] == "function" and n["name"] == name)
    code: str = found["func"]
    return code


def assigned(code: str, prop: str) -> str:
    """The expression a function node assigns to `msg.<prop>`."""
    match = re.search(rf"^msg\.{prop} = (.+);$", code, re.MULTILINE)
    assert match, f"msg.{prop} is not set"
    return match[1]


def test_the_flow_calls_with_mqtt_v5_request_response() -> None:
    nodes = flow()
    broker = node(nodes, "mqtt-broker")
    assert broker["protocolVersion"] == "5"  # v3.1.1 would drop the properties below
    out, replies = node(nodes, "mqtt out"), node(nodes, "mqtt in")
    assert out["broker"] == replies["broker"] == broker["id"]
    # Empty node fields, so the msg properties the function sets are the ones published.
    assert (out["topic"], out["respTopic"], out["correl"], out["qos"]) == ("", "", "", "1")

    request = function(nodes, "toolbus request")
    assert assigned(request, "topic") == f'"{PREFIX}/call/" + msg.tool'
    assert assigned(request, "correlationData") == "Buffer.from(id)"
    assert assigned(request, "responseTopic") == "REPLY_TOPIC"
    assert assigned(request, "messageExpiryInterval").isdigit()
    reply_topic = re.search(r'^const REPLY_TOPIC = "([^"]+)";', request, re.MULTILINE)
    assert reply_topic
    # The reply topic is the one subscribed to, and a worker with default settings may
    # publish there.
    assert replies["topic"] == reply_topic[1]
    assert topics_for(Settings()).reply_problem(reply_topic[1], None) is None
    assert replies["datatype"] == "json" and replies["qos"] == "1"
    assert "msg.correlationData.toString()" in function(nodes, "match reply")

    # inject -> request -> mqtt out; mqtt in -> match reply.
    wired = {n["id"]: [target for out in n.get("wires", []) for target in out] for n in nodes}
    by_name = {n.get("name"): n["id"] for n in nodes}
    assert wired[node(nodes, "inject")["id"]] == [by_name["toolbus request"]]
    assert wired[by_name["toolbus request"]] == [out["id"]]
    assert wired[replies["id"]] == [by_name["match reply"]]


@pytest_asyncio.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Broker]:
    async with bundled_worker(tmp_path_factory.mktemp("node-red-broker")) as broker:
        yield broker


def runnable(broker: Broker, observe: str) -> list[dict[str, Any]]:
    """The flow on the test's broker, the matcher's outputs also published to `observe`."""
    nodes = flow()
    broker_node = node(nodes, "mqtt-broker")
    broker_node["broker"], broker_node["port"] = "127.0.0.1", str(broker.port)
    match = next(n for n in nodes if n.get("name") == "match reply")
    for index, outcome in enumerate(("result", "error")):
        nodes.append(
            {
                "id": f"test.{outcome}",
                "type": "mqtt out",
                "z": match["z"],
                "topic": f"{observe}/{outcome}",
                "qos": "1",
                "broker": broker_node["id"],
                "wires": [],
            }
        )
        match["wires"][index].append(f"test.{outcome}")
    return nodes


def inject(port: int, node_id: str, props: list[dict[str, str]] | None = None) -> int:
    """What the editor's inject button does (with the props it would ask for)."""
    body = json.dumps({"__user_inject_props__": props} if props else {}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/inject/{node_id}",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


@pytest.mark.integration
async def test_the_flow_round_trips_in_node_red(served: Broker, tmp_path: Path) -> None:
    if not NODE_RED.exists():
        pytest.fail("Node-RED is not installed: `make test` installs it into .node-red")
    observe = f"observe-{uuid.uuid4().hex[:8]}"
    flows = tmp_path / "flows.json"
    flows.write_text(json.dumps(runnable(served, observe)))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        str(NODE_RED),
        "--userDir",
        str(tmp_path),
        "--port",
        str(port),
        "-D",
        "uiHost=127.0.0.1",
        str(flows),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output: list[bytes] = []
    up = asyncio.Event()

    async def read(stream: asyncio.StreamReader) -> None:
        """Every line it writes (so a full pipe never stalls it); `up` once its editor
        listens and its broker node has connected."""
        while line := await stream.readline():
            output.append(line)
            if all(any(marker in seen for seen in output) for marker in READY):
                up.set()

    assert proc.stdout is not None
    reader = asyncio.create_task(read(proc.stdout), name="node-red-output")
    try:
        async with Caller(served.url) as watcher:
            await watcher.subscribe(f"{observe}/#")
            try:
                async with asyncio.timeout(START_BOUND_S):
                    await up.wait()
            except TimeoutError:
                pytest.fail(b"".join(output).decode(errors="replace"))
            inject_id = node(flow(), "inject")["id"]
            assert await asyncio.to_thread(inject, port, inject_id) == 200
            unknown = [
                {"p": "tool", "v": "ecko", "vt": "str"},
                {"p": "payload", "v": '{"text": "hi"}', "vt": "json"},
            ]
            assert await asyncio.to_thread(inject, port, inject_id, unknown) == 200
            got: dict[str, Any] = {}
            while len(got) < 2:
                message = await watcher.next_message()
                got[message.topic.value.removeprefix(f"{observe}/")] = json.loads(message.payload)
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()
            await reader
    assert got["result"]["received"] == {"deviceName": "Switch One", "action": "on"}
    assert got["error"]["code"] == "unknown_tool"
