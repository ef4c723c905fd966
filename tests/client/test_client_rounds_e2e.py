"""`toolbus.Client`'s callbacks against a real worker relaying real MCP servers' questions:
server-everything (TypeScript SDK, 2025-11-25: `trigger-elicitation-request`,
`trigger-url-elicitation`, `trigger-sampling-request`, asked on the session) and the
tests' own asking_server of both generations (2026-07-28: `input_required` results;
`--legacy`: on the session), a model's message whose call asks, and an approval gate.
The rounds are the client's: a test hands it callbacks and gets the tool's answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.acceptance import conftest as acceptance
from tests.support.asking import ELICITED, SAMPLED, asking_worker
from tests.support.harness import Broker
from toolbus import Client
from toolbus.wire.errors import ApprovalRequired, ToolFailed
from toolbus.worker.service import Worker

everything_server = acceptance.everything_server  # the fixture, here too


@pytest_asyncio.fixture(scope="module")
async def worker(
    broker: Broker, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Worker]:
    everything = request.getfixturevalue("everything_server")
    runs = tmp_path_factory.mktemp("asking") / "runs"
    approving = {"kitchen": {"approve": ["echo"]}}
    async with asking_worker(broker, everything, runs, callers=approving) as running:
        yield running


def client_of(broker: Broker, worker: Worker, caller: str | None = None) -> Client:
    return Client(broker.url, prefix=worker.topics.prefix, caller=caller, timeout_s=20)


async def test_server_everythings_questions_are_answered_by_the_callbacks(
    broker: Broker, worker: Worker
) -> None:
    asked: list[dict[str, Any]] = []

    async def on_input(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        if params.get("mode") == "url":
            return {"action": "accept"}
        return {"action": "accept", "content": ELICITED}

    def on_sampling(params: dict[str, Any]) -> dict[str, Any]:  # a plain one: in a thread
        asked.append(params)
        return SAMPLED

    url = "https://example.com/authorize"
    async with client_of(broker, worker) as client:
        form = await client.call("trigger-elicitation-request", on_input=on_input)
        opened = await client.call("trigger-url-elicitation", {"url": url}, on_input=on_input)
        sampled = await client.call(
            "trigger-sampling-request", {"prompt": "the weather"}, on_sampling=on_sampling
        )
    assert form.result is not None and "ada@example.com" in form.result.text
    assert opened.result is not None and "accept" in opened.result.text
    assert sampled.result is not None
    assert "a short summary" in sampled.result.text and "caller-model" in sampled.result.text
    form_params, url_params, sampling_params = asked
    assert "name" in form_params["requestedSchema"]["properties"]
    assert url_params["mode"] == "url" and url_params["url"] == url
    assert "the weather" in sampling_params["messages"][0]["content"]["text"]


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_rounds_of_both_server_generations(
    broker: Broker, worker: Worker, server: str
) -> None:
    """A 2026-07-28 server asks both questions in one round, an older one in two: the
    client drives either to the tool's answer."""
    asked: list[str] = []

    def on_input(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params["message"])
        device = "fan" if "other" in params["message"] else "lamp"
        return {"action": "accept", "content": {"device": device}}

    async with client_of(broker, worker) as client:
        twice = await client.call(f"{server}.pick_twice", {"room": "hall"}, on_input=on_input)
        summary = await client.call(
            f"{server}.summarize", {"text": "long"}, on_sampling=lambda _: SAMPLED
        )
        # Sampling left unanswered (no `on_sampling`): what a caller that cannot sample gets.
        with pytest.raises(ToolFailed) as unanswered:
            await client.call(f"{server}.summarize", {"text": "long"}, on_input=on_input)
        with pytest.raises(ToolFailed) as unable:
            await client.call(f"{server}.summarize", {"text": "long"})
    assert twice.result is not None and twice.result.structured == {"devices": ["lamp", "fan"]}
    assert len(asked) == 2
    assert summary.result is not None
    assert summary.result.structured == {"summary": "a short summary", "model": "caller-model"}
    assert unanswered.value.details == unable.value.details


@pytest.mark.parametrize("name", ["pick_device", "legacy__pick_device"])
async def test_a_models_call_that_asks_ends_in_the_conversation(
    broker: Broker, worker: Worker, name: str
) -> None:
    """As the model is given them (`tools(format="anthropic")`): `pick_device` is the
    2026-07-28 server's, `legacy__pick_device` the older one's."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": {"room": "hall"}}],
    }
    answer = {"action": "accept", "content": {"device": "lamp"}}
    async with client_of(broker, worker) as client:
        assert name in {tool["name"] for tool in await client.tools(format="anthropic")}
        reply = await client.run_tool_calls_reply(message, on_input=lambda _: answer)
    assert reply.ok
    (user,) = reply.append
    blocks = user["content"]
    assert isinstance(blocks, list) and len(blocks) == 1 and isinstance(blocks[0], dict)
    assert blocks[0]["tool_use_id"] == "toolu_1" and "is_error" not in blocks[0]
    assert "lamp" in str(blocks[0]["content"])


async def test_a_gated_call_runs_once_approved_and_never_refused(
    broker: Broker, worker: Worker
) -> None:
    shown: list[dict[str, Any]] = []

    def approve(call: dict[str, Any]) -> bool:
        shown.append(call)
        return bool(call["arguments"].get("text") == "go")

    async with client_of(broker, worker, caller="kitchen") as client:
        approved = await client.call("echo", {"text": "go"}, on_approval=approve)
        with pytest.raises(ApprovalRequired) as refused:
            await client.call("echo", {"text": "stop"}, on_approval=approve)
        with pytest.raises(ApprovalRequired):
            await client.call("echo", {"text": "go"})  # no callback: as ever
    assert approved.result is not None and isinstance(approved.result.structured, dict)
    assert approved.result.structured["text"] == "go"
    assert [call["tool"] for call in shown] == ["echo", "echo"]
    assert refused.value.details["call"]["arguments"]["text"] == "stop"
