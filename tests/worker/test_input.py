"""Input relayed from the outside: a real mosquitto, a worker, real MCP servers that ask.

A caller that says `input: true` gets the server's question as its request's reply
(`input_required`) and answers it with a continuation; the call goes on and the
continuation's reply is the tool's. Servers: the MCP project's server-everything (its
`trigger-elicitation-request`, `trigger-url-elicitation` and `trigger-sampling-request`,
which it lists only to a client that declares elicitation and sampling; TypeScript SDK,
protocol 2025-11-25, asking on the session), and the tests' own asking_server
(Python SDK) twice: negotiating 2026-07-28 (questions in an `input_required` result,
retried with `inputResponses` and `requestState`) and pinned to the handshake era.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.acceptance import conftest as acceptance
from tests.support.asking import ELICITED, SAMPLED, asking_worker, continuation
from tests.support.harness import Broker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from toolbus.worker.service import Worker

WAIT_S = 20.0

everything_server = acceptance.everything_server  # the fixture, here too


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("asking") / "runs"


@pytest_asyncio.fixture(scope="module")
async def worker(
    broker: Broker, request: pytest.FixtureRequest, runs: Path
) -> AsyncIterator[Worker]:
    everything = request.getfixturevalue("everything_server")
    async with asking_worker(broker, everything, runs) as running:
        yield running


async def call(
    caller: Caller, worker: Worker, tool: str | None, body: dict[str, Any]
) -> dict[str, Any]:
    reply, _ = await caller.call(
        call_topic(worker.topics, tool),
        body,
        reply_topic=reply_topic_for(worker.topics, "asker"),
        timeout_s=WAIT_S,
    )
    return reply


async def continue_at(
    caller: Caller, worker: Worker, token: str, answers: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    """The continuation answering `token`'s questions, on the worker's call topic: its
    reply (the tool's, another `input_required`, or an error), awaited at most WAIT_S."""
    return await call(caller, worker, None, continuation(token, answers, **fields))


async def ask(
    caller: Caller,
    worker: Worker,
    tool: str,
    method: str,
    arguments: dict[str, Any] | None = None,
    **fields: Any,
) -> tuple[str, str, dict[str, Any]]:
    """`tool` called by a caller that can answer (`input: true`; other envelope `fields`
    beside it): its one question, as `question` reads it."""
    body: dict[str, Any] = {**fields, "input": True}
    if arguments is not None:
        body["arguments"] = arguments
    return question(await call(caller, worker, tool, body), method)


def question(reply: dict[str, Any], method: str) -> tuple[str, str, dict[str, Any]]:
    """The one question of an `input_required` reply: its key, the token, its params."""
    assert reply["ok"] is False and reply["error"]["code"] == "input_required", reply
    details = reply["error"]["details"]
    [(key, asked)] = details["input_requests"].items()
    assert asked["method"] == method
    return key, details["continuation"], asked["params"]


def text_of(reply: dict[str, Any]) -> str:
    assert reply["ok"] is True, reply
    return str(reply["result"]["text"])


@pytest.mark.parametrize("v5", [True, False], ids=["v5", "3.1.1"])
async def test_server_everything_elicitation_completes_through_a_caller(
    broker: Broker, worker: Worker, v5: bool
) -> None:
    async with Caller(broker.url, v5=v5) as caller:
        key, token, params = await ask(
            caller, worker, "trigger-elicitation-request", "elicitation/create"
        )
        assert "name" in params["requestedSchema"]["properties"]
        answer = {"action": "accept", "content": ELICITED}
        final = await continue_at(caller, worker, token, {key: answer})
    assert "Ada" in text_of(final) and "ada@example.com" in text_of(final)


async def test_server_everything_url_elicitation_completes(broker: Broker, worker: Worker) -> None:
    url = "https://example.com/authorize"
    async with Caller(broker.url) as caller:
        key, token, params = await ask(
            caller, worker, "trigger-url-elicitation", "elicitation/create", {"url": url}
        )
        assert params["mode"] == "url" and params["url"] == url
        final = await continue_at(caller, worker, token, {key: {"action": "accept"}})
    assert "accept" in text_of(final)


async def test_server_everything_sampling_is_answered_by_the_callers_model(
    broker: Broker, worker: Worker
) -> None:
    async with Caller(broker.url) as caller:
        key, token, params = await ask(
            caller,
            worker,
            "trigger-sampling-request",
            "sampling/createMessage",
            {"prompt": "the weather"},
        )
        assert "the weather" in params["messages"][0]["content"]["text"]
        final = await continue_at(caller, worker, token, {key: SAMPLED})
    assert "a short summary" in text_of(final) and "caller-model" in text_of(final)


async def test_a_caller_that_cannot_answer_gets_the_tools_own_answer(
    broker: Broker, worker: Worker
) -> None:
    async with Caller(broker.url) as caller:
        declined = await call(caller, worker, "trigger-elicitation-request", {})
        sampled = await call(
            caller, worker, "trigger-sampling-request", {"arguments": {"prompt": "x"}}
        )
    assert "decline" in text_of(declined).lower()
    assert sampled["ok"] is False and sampled["error"]["code"] == "tool_error", sampled


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_elicitation_from_servers_of_both_generations(
    broker: Broker, worker: Worker, server: str, runs: Path
) -> None:
    before = runs.read_text().count("pick_device") if runs.exists() else 0
    async with Caller(broker.url) as caller:
        key, token, params = await ask(
            caller, worker, f"{server}.pick_device", "elicitation/create", {"room": "hall"}
        )
        assert "hall" in params["message"]
        answer = {"action": "accept", "content": {"device": "lamp"}}
        final = await continue_at(caller, worker, token, {key: answer})
    assert final["ok"] is True, final
    assert final["result"]["structured"] == {"action": "accept", "device": "lamp"}
    assert runs.read_text().count("pick_device") == before + 1  # its body ran once
    assert worker._status.waiting() == 0  # `toolbus status`: nothing waits any more


async def test_a_held_call_is_counted_in_the_workers_status(broker: Broker, worker: Worker) -> None:
    async with Caller(broker.url) as caller:
        key, token, _ = await ask(
            caller, worker, "legacy.pick_device", "elicitation/create", {"room": "x"}
        )
        assert worker._status.waiting() == 1
        final = await continue_at(caller, worker, token, {key: {"action": "decline"}})
    assert final["result"]["structured"]["action"] == "decline"
    assert worker._status.waiting() == 0


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_sampling_from_servers_of_both_generations(
    broker: Broker, worker: Worker, server: str
) -> None:
    async with Caller(broker.url) as caller:
        key, token, _ = await ask(
            caller, worker, f"{server}.summarize", "sampling/createMessage", {"text": "long"}
        )
        final = await continue_at(caller, worker, token, {key: SAMPLED})
    assert final["result"]["structured"] == {"summary": "a short summary", "model": "caller-model"}


def device_for(asked: dict[str, Any]) -> str:
    return "fan" if "other" in asked["params"]["message"] else "lamp"


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_two_questions_of_both_generations_are_answered_in_rounds(
    broker: Broker, worker: Worker, server: str
) -> None:
    async with Caller(broker.url) as caller:
        reply = await call(
            caller, worker, f"{server}.pick_twice", {"input": True, "arguments": {"room": "hall"}}
        )
        rounds = 0
        while not reply["ok"] and rounds < 3:  # a 2026-07-28 server asks both at once
            rounds += 1
            assert reply["error"]["code"] == "input_required", reply
            details = reply["error"]["details"]
            answers = {
                key: {"action": "accept", "content": {"device": device_for(asked)}}
                for key, asked in details["input_requests"].items()
            }
            reply = await continue_at(caller, worker, details["continuation"], answers, input=True)
    assert reply["ok"] is True, reply
    assert rounds == (1 if server == "modern" else 2)
    assert reply["result"]["structured"] == {"devices": ["lamp", "fan"]}


def ended_event(monkeypatch: pytest.MonkeyPatch, worker: Worker, token: str) -> asyncio.Event:
    """Set when the worker's token store ends `token` (its call ended while nobody
    waited: the state a continuation then finds), the event itself rather than a poll."""
    tokens = worker.pipeline.rounds.tokens
    end = tokens.end
    ended = asyncio.Event()

    async def ending(told: str, reply: str) -> bool:
        changed = await end(told, reply)
        if changed and told == token:
            ended.set()
        return changed

    monkeypatch.setattr(tokens, "end", ending)
    return ended


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_a_call_waiting_for_its_caller_can_be_cancelled(
    broker: Broker, worker: Worker, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's cancel names the request that got the question: the call ends
    (held: its run is cancelled; stateless: its token ends), and the continuation that
    comes later gets that end, `cancelled`."""
    reply_topic = reply_topic_for(worker.topics, "asker")
    ident = f"cancel-{server}-{uuid.uuid4().hex[:6]}"
    async with Caller(broker.url) as caller:
        key, token, _ = await ask(
            caller,
            worker,
            f"{server}.pick_device",
            "elicitation/create",
            {"room": "hall"},
            id=ident,
        )
        ended = ended_event(monkeypatch, worker, token)
        await caller.publish(
            worker.topics.cancel, json.dumps({"id": ident}).encode(), response_topic=reply_topic
        )
        # A cancel is never answered: the worker heard it when the call's token ends.
        await asyncio.wait_for(ended.wait(), WAIT_S)
        answer = {"action": "accept", "content": {"device": "lamp"}}
        late = await continue_at(caller, worker, token, {key: answer})
    assert late["error"]["code"] == "cancelled", late
    assert late["error"]["details"]["cause"] == "caller"


async def test_the_asking_servers_speak_the_era_each_test_names(worker: Worker) -> None:
    """`legacy` is pinned to the handshake era (it asks on the session); `modern`
    negotiates 2026-07-28 (its questions come in `input_required` results)."""
    servers = worker.mcp.servers
    assert servers["legacy"].protocol_version == "2025-11-25"
    assert servers["modern"].protocol_version == "2026-07-28"
