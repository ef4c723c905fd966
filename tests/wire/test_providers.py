"""The providers' tool calls end to end: their SDKs' objects through a real broker and
worker (local tools and real MCP servers), answered in kind.

Every part of every reply that an integrator appends to its conversation is checked
with the SDK's own parameter types (`tests/support/providers.py`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.backends.test_mcp_faults import misbehaving
from tests.support.harness import DEMO_SERVER, Broker, make_settings, running_worker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from tests.support.providers import (
    anthropic_message,
    chat_completion,
    check,
    ollama_response,
    response,
    tool_use,
)
from tests.support.tools import Probe, probe_tools
from toolbus.wire.contracts import ReplyFormat
from toolbus.worker.service import Worker


@pytest_asyncio.fixture(scope="module")
async def worker(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Worker]:
    settings = make_settings(
        broker,
        mcpServers={"devices": DEMO_SERVER, "media": misbehaving(tmp_path_factory.mktemp("m"))},
        tools={"sleepy": {"timeout_s": 0.2}},
    )
    async with running_worker(settings, probe_tools(Probe())) as running:
        assert running.mcp.states() == {"devices": "ready", "media": "ready"}
        yield running


async def publish(caller: Caller, worker: Worker, body: Any) -> dict[str, Any]:
    reply, _ = await caller.call(
        call_topic(worker.topics),
        json.dumps(body).encode(),
        reply_topic=reply_topic_for(worker.topics),
    )
    return reply


def codes(reply: dict[str, Any]) -> list[str | None]:
    return [(r.get("error") or {}).get("code") for r in reply["results"]]


async def test_an_anthropic_message_reaches_an_mcp_tool_through_normalization(
    caller: Caller, worker: Worker
) -> None:
    body = anthropic_message(
        tool_use("toolu_01", "ControlZwaveDevice", {"device_name": "Switch One", "action": "on"}),
        tool_use("toolu_02", "echo", {"text": "done"}),
    )
    reply = await publish(caller, worker, body)
    assert (reply["id"], reply["format"], reply["ok"]) == ("msg_01", "anthropic", True)
    mcp, local = reply["results"]
    assert mcp["tool"] == "control_zwave_device"
    received = json.loads(reply["append"][0]["content"][0]["content"][0]["text"])["received"]
    assert received == {"deviceName": "Switch One", "action": "on"}
    assert {n["rule"] for n in mcp["normalized"]} >= {"tool_spelling"}
    assert local["tool"] == "echo"
    [message] = reply["append"]
    check(ReplyFormat.ANTHROPIC, message)
    assert message["role"] == "user"
    blocks = message["content"]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_01", "toolu_02"]
    assert not any(b.get("is_error") for b in blocks)


@pytest.mark.parametrize("count", [1, 2, 5])
async def test_parallel_chat_completion_calls(caller: Caller, worker: Worker, count: int) -> None:
    calls = [(f"call_{n}", "busy", json.dumps({"n": n, "hold_ms": 20})) for n in range(count)]
    reply = await publish(caller, worker, chat_completion(*calls))
    assert reply["format"] == "openai" and reply["ok"] is True
    assert [json.loads(m["content"])["n"] for m in reply["append"]] == list(range(count))
    assert [m["tool_call_id"] for m in reply["append"]] == [c[0] for c in calls]
    for message in reply["append"]:
        check(ReplyFormat.OPENAI, message)
        assert message["role"] == "tool"


async def test_one_message_mixing_success_and_every_failure(caller: Caller, worker: Worker) -> None:
    body = response(
        ("call_ok", "echo", '{"text": "fine"}'),
        ("call_invalid", "control_zwave_device", '{"device_name": "Switch One"}'),
        ("call_unknown", "teleport_the_house", "{}"),
        ("call_timeout", "sleepy", "{}"),
    )
    reply = await publish(caller, worker, body)
    assert (reply["id"], reply["format"], reply["ok"]) == ("resp_1", "openai-responses", False)
    assert codes(reply) == [None, "invalid_arguments", "unknown_tool", "timeout"]
    assert [item["call_id"] for item in reply["append"]] == [
        "call_ok",
        "call_invalid",
        "call_unknown",
        "call_timeout",
    ]
    for item in reply["append"]:
        check(ReplyFormat.OPENAI_RESPONSES, item)
        assert item["type"] == "function_call_output"


async def test_an_image_result_becomes_an_image_block(caller: Caller, worker: Worker) -> None:
    reply = await publish(caller, worker, tool_use("toolu_pic", "picture", {}))
    [message] = reply["append"]
    check(ReplyFormat.ANTHROPIC, message)
    [block] = message["content"]
    kinds = [part["type"] for part in block["content"]]
    assert "image" in kinds and "text" in kinds
    [image] = [part for part in block["content"] if part["type"] == "image"]
    assert image["source"]["media_type"] == "image/png"
    assert image["source"]["data"].startswith("iVBORw0KGgo")


async def test_an_image_result_in_chat_completions_follows_as_a_user_message(
    caller: Caller, worker: Worker
) -> None:
    reply = await publish(caller, worker, chat_completion(("call_pic", "picture", "{}")))
    tool_message, user_message = reply["append"]
    for message in reply["append"]:
        check(ReplyFormat.OPENAI, message)
    assert (tool_message["role"], tool_message["tool_call_id"]) == ("tool", "call_pic")
    assert user_message["role"] == "user"
    urls = [p["image_url"]["url"] for p in user_message["content"] if p["type"] == "image_url"]
    assert [url.split(",")[0] for url in urls] == ["data:image/png;base64"]


async def test_an_ollama_response(caller: Caller, worker: Worker) -> None:
    body = ollama_response(("echo", {"text": "hi"}), ("ControlZwaveDevice", {"device": "x"}))
    reply = await publish(caller, worker, body)
    assert reply["format"] == "ollama"
    assert codes(reply) == [None, "invalid_arguments"]
    for message in reply["append"]:
        check(ReplyFormat.OLLAMA, message)
    assert [m["tool_name"] for m in reply["append"]] == ["echo", "ControlZwaveDevice"]


async def test_a_311_caller_names_its_reply_topic_under_toolbus(
    caller311: Caller, worker: Worker
) -> None:
    topic = reply_topic_for(worker.topics)
    body = anthropic_message(tool_use("toolu_1", "echo", {"text": "x"}))
    body["toolbus"] = {"reply_to": topic}
    await caller311.subscribe(topic)
    await caller311.publish(call_topic(worker.topics), json.dumps(body).encode())
    reply = json.loads((await caller311.next_message()).payload)
    assert (reply["id"], reply["format"], codes(reply)) == ("msg_01", "anthropic", [None])
