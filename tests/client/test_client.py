"""`toolbus.Client`: one connection for every call, typed errors, retries under the same
id, tool listings, caller identity.

Against a real mosquitto. Where the worker's side must misbehave (ignore the first send,
answer twice) the "worker" is a test client reading the requests itself, so each re-send
is observed, not inferred from timing; elsewhere a real worker answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
import pytest_asyncio

from tests.cli.test_cli import cli_env, run_cli
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller, correlation_of
from tests.support.tools import Probe, probe_tools
from toolbus import Client, ErrorCode, NoReply, Reply, Retry, ToolsFormat
from toolbus.client.client import provider_body
from toolbus.config import BrokerUrl
from toolbus.wire.contracts import ErrorBody
from toolbus.wire.errors import (
    ERROR_CLASSES,
    Forbidden,
    InvalidArguments,
    ToolbusError,
    UnknownTool,
)

MQTT_CONNECT = 0x10  # the fixed header's first byte of a CONNECT packet


@pytest_asyncio.fixture
async def fake_worker(broker: Broker) -> AsyncIterator[tuple[Caller, str]]:
    """A subscriber on a fresh call topic, answering by hand."""
    prefix = f"cl{uuid.uuid4().hex[:8]}"
    async with Caller(broker.url) as worker:
        await worker.subscribe(f"{prefix}/call/#")
        yield worker, prefix


def client_of(broker: Broker, prefix: str, attempts: int) -> Client:
    """A client re-sending every 0.2 s: each re-send is seen by the fake worker."""
    return Client(broker.url, prefix=prefix, retry=Retry(attempts=attempts, interval_s=0.2))


async def answer(worker: Caller, request_message: aiomqtt.Message, text: str) -> None:
    body = json.loads(request_message.payload)
    reply = Reply(id=body["id"], ok=True, result={"text": text}, duration_ms=1.0)
    response_topic = getattr(request_message.properties, "ResponseTopic", None)
    assert response_topic is not None
    await worker.publish(
        response_topic,
        reply.model_dump_json(),
        correlation=correlation_of(request_message),
    )


async def test_an_unanswered_call_is_sent_again_under_the_same_id(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    async with client_of(broker, prefix, attempts=3) as client:
        calling = asyncio.create_task(
            client.call("echo", {"text": "x"}, timeout_s=10), name="retried-call"
        )
        first = await worker.next_message()  # dropped: the worker that had it died
        second = await worker.next_message()
        await answer(worker, second, "second")
        reply = await asyncio.wait_for(calling, 5)
    sent = [json.loads(first.payload), json.loads(second.payload)]
    assert sent[0] == sent[1]  # byte for byte the same request
    assert sent[0]["id"] and sent[0]["tool"] == "echo" and sent[0]["arguments"] == {"text": "x"}
    assert correlation_of(first) == correlation_of(second)
    assert reply.result is not None and reply.result.text == "second"
    assert (client.sent, client.resent) == (2, 1)
    # The request expires when the requester's deadline passes.
    assert 9 <= getattr(first.properties, "MessageExpiryInterval", 0) <= 10


async def test_the_first_reply_wins_and_late_ones_are_dropped(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    async with client_of(broker, prefix, attempts=2) as client:
        calling = asyncio.create_task(client.call("echo", id="mine", timeout_s=10), name="twice")
        first = await worker.next_message()
        second = await worker.next_message()
        await answer(worker, second, "replayed")
        await answer(worker, first, "late original")
        reply = await asyncio.wait_for(calling, 5)
        # The late reply found no caller: the next call still gets its own answer.
        again = asyncio.create_task(client.call("echo", id="next", timeout_s=10), name="next")
        third = await worker.next_message()
        assert json.loads(third.payload)["id"] == "next"
        await answer(worker, third, "next")
        assert (await asyncio.wait_for(again, 5)).id == "next"
    assert reply.id == "mine" and reply.result is not None
    assert reply.result.text == "replayed"


async def test_no_reply_after_every_attempt(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    async with client_of(broker, prefix, attempts=2) as client:
        with pytest.raises(NoReply) as raised:
            await client.call("echo", id="lost", timeout_s=0.5)
    assert raised.value.id == "lost"  # to send again later, answered from the first run
    assert isinstance(raised.value, TimeoutError)
    assert not isinstance(raised.value, ToolbusError)  # no worker said anything
    seen = [await worker.next_message(), await worker.next_message()]
    assert [json.loads(m.payload)["id"] for m in seen] == ["lost", "lost"]
    assert worker.unclaimed() == []  # two attempts: two sends, no third


async def test_a_closed_client_answers_no_reply_at_once(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    client = client_of(broker, prefix, attempts=1)
    async with client:
        waiting = asyncio.create_task(client.call("echo", timeout_s=30), name="waiting-call")
        await worker.next_message()  # sent, and now unanswered
    with pytest.raises(NoReply):  # closed under it: told, not cancelled
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(NoReply):  # and a call after the close neither hangs nor spins
        await asyncio.wait_for(client.call("echo", timeout_s=30), 5)


async def test_a_call_waiting_for_a_lost_broker_is_told_at_the_close(tmp_path: Path) -> None:
    """The close wakes a request waiting to send, rather than leaving it to its deadline."""
    own = Broker(tmp_path)
    own.start()
    try:
        client = client_of(own, "lost", attempts=1)
        async with client:
            with watching("toolbus.client", "connection lost", logging.WARNING) as lost:
                own.stop()
                await asyncio.wait_for(lost.seen.wait(), 10)  # and it is re-connecting
            waiting = asyncio.create_task(client.call("echo", timeout_s=60), name="wait-send")
            await asyncio.sleep(0)  # one turn: nothing before its wait for the connection yields
            assert client._requester._pending and not waiting.done()  # so it waits there now
        with pytest.raises(NoReply):
            await asyncio.wait_for(waiting, 5)  # not the 60 s deadline
    finally:
        own.kill()


@pytest.mark.parametrize(("attempts", "interval_s"), [(0, 1.0), (3, 0.0), (2, -1.0)])
def test_a_retry_needs_an_attempt_and_an_interval(attempts: int, interval_s: float) -> None:
    with pytest.raises(ValueError, match="attempt"):
        Retry(attempts, interval_s)


async def test_toolbus_call_sends_again_when_no_reply_comes(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    # The stand-in publishes no status: sent regardless of the statuses.
    flags = (
        "--broker",
        broker.url,
        "--timeout",
        "5",
        "--retry-interval",
        "0.3",
        "--no-worker-check",
    )
    calling = asyncio.create_task(
        run_cli("call", "echo", "text=x", *flags, env=cli_env(prefix)), name="cli-call"
    )
    await worker.next_message()  # dropped
    await answer(worker, await worker.next_message(), "answered")
    code, out, err = await asyncio.wait_for(calling, 30)
    assert code == 0, err
    assert json.loads(out)["result"]["text"] == "answered"
    # The user, waiting, is told of the one re-send (the words are the issue's).
    told = [line for line in err.splitlines() if "sending again" in line]
    assert told == ["toolbus: no reply yet, sending again (2/3)"]
    once = await run_cli("call", "echo", *flags, "--attempts", "0", env=cli_env(prefix))
    assert once[0] == 2  # a usage error, before anything is sent


# --- against a real worker -----------------------------------------------------------


class ConnectCounter:
    """A TCP relay in front of the broker that counts the MQTT CONNECT packets opening
    the connections through it: what the broker is asked for, counted as it happens."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.connects = 0
        self._relays: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"mqtt://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> ConnectCounter:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for relay in self._relays:
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.broker_port
        )
        first = await reader.read(65536)
        if first[:1] == bytes([MQTT_CONNECT]):
            self.connects += 1
        upstream_writer.write(first)
        relays = (
            asyncio.create_task(_pipe(reader, upstream_writer), name="relay-up"),
            asyncio.create_task(_pipe(upstream_reader, writer), name="relay-down"),
        )
        self._relays.update(relays)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass  # the other side went: so does this one
    finally:
        writer.close()


@pytest_asyncio.fixture
async def worker_prefix(broker: Broker) -> AsyncIterator[str]:
    """A worker with the built-in tools (no MCP servers) on a fresh prefix."""
    settings = make_settings(broker)
    async with running_worker(settings):
        yield settings.topic_prefix


async def test_one_connection_for_a_hundred_calls(broker: Broker, worker_prefix: str) -> None:
    port = int(broker.url.rsplit(":", 1)[1])
    async with ConnectCounter(port) as counter:
        async with Client(counter.url, prefix=worker_prefix) as client:
            for n in range(100):
                reply = await client.call("echo", {"text": str(n)})
                assert reply.result is not None and reply.result.structured == {
                    "text": str(n),
                    "data": None,
                }
            assert client.connects == 1
        assert counter.connects == 1
        # The relay counts what it should: a client per call is a connection per call.
        for n in range(3):
            async with Client(counter.url, prefix=worker_prefix) as once:
                await once.call("echo", {"text": str(n)})
        assert counter.connects == 4


async def test_errors_are_the_classes_of_their_codes(broker: Broker, worker_prefix: str) -> None:
    async with Client(broker.url, prefix=worker_prefix) as client:
        with pytest.raises(UnknownTool) as unknown:
            await client.call("ecko", {"text": "x"}, id="u1")
        with pytest.raises(InvalidArguments) as invalid:
            await client.call("echo", {})  # `text` is required
        reply = await client.call("echo", {"text": "fine"}, id="ok1")
    assert unknown.value.code == ErrorCode.UNKNOWN_TOOL
    assert "echo" in unknown.value.details["candidates"]
    assert unknown.value.id == "u1" and unknown.value.reply is not None
    assert unknown.value.reply.ok is False and unknown.value.reply.id == "u1"
    assert invalid.value.code == ErrorCode.INVALID_ARGUMENTS
    assert invalid.value.details["errors"]
    assert (reply.ok, reply.id, reply.tool) == (True, "ok1", "echo")


async def test_tools_in_the_toolbus_format(broker: Broker, worker_prefix: str) -> None:
    async with Client(broker.url, prefix=worker_prefix) as client:
        listed = await client.tools(format=ToolsFormat.TOOLBUS)
        again = await client.tools(format="toolbus")
        with pytest.raises(ValueError, match="anthropc"):
            await client.tools(format="anthropc")  # refused before anything is sent
        assert client.sent == 2
    assert listed == again
    by_name = {definition["name"]: definition for definition in listed}
    assert {"echo", "datetime"} <= set(by_name)
    assert by_name["echo"]["origin"] == "local"
    assert by_name["echo"]["inputSchema"]["required"] == ["text"]


@pytest.mark.parametrize("identity", ["claim", "topic"])
async def test_the_caller_is_known_in_either_identity_mode(broker: Broker, identity: str) -> None:
    settings = make_settings(
        broker, caller_identity=identity, callers={"kitchen": {"tools": ["echo"]}}
    )
    async with (
        running_worker(settings),
        Client(
            broker.url,
            prefix=settings.topic_prefix,
            caller="kitchen",
            caller_identity=identity,  # type: ignore[arg-type]
        ) as client,
    ):
        assert client.reply_topic.startswith(f"{settings.topic_prefix}/reply/kitchen/")
        assert [t["name"] for t in await client.tools()] == ["echo"]
        assert (await client.call("echo", {"text": "hi"})).ok
        with pytest.raises(Forbidden):
            await client.call("datetime")


async def test_an_anonymous_client_is_answered_in_topic_mode(broker: Broker) -> None:
    settings = make_settings(broker, caller_identity="topic")
    async with (
        running_worker(settings),
        Client(broker.url, prefix=settings.topic_prefix, caller_identity="topic") as client,
    ):
        assert client.reply_topic.startswith(f"{settings.topic_prefix}/reply/anonymous/")
        assert (await client.call("echo", {"text": "hi"})).ok


async def test_a_repeat_while_the_call_runs_is_answered_from_that_run(broker: Broker) -> None:
    """The retry sends the same id; the worker's dedup runs the tool once and answers
    the repeat with the first run's reply (`replayed`), which the client drops."""
    probe = Probe()
    settings = make_settings(broker)
    async with (
        running_worker(settings, probe_tools(probe)),
        Client(
            broker.url,
            prefix=settings.topic_prefix,
            retry=Retry(attempts=5, interval_s=0.2),
        ) as client,
        Caller(broker.url) as observer,
    ):
        await observer.subscribe(client.reply_topic)  # sees every answer the client gets
        with watching("toolbus.client", "sending it again") as resent:
            calling = asyncio.create_task(client.call("gate", id="g1", timeout_s=10), name="gate")
            await probe.wait_active(1)
            async with asyncio.timeout(10):
                await resent.seen.wait()
        probe.release.set()
        reply = await asyncio.wait_for(calling, 10)
        answers = [json.loads((await observer.next_message()).payload) for _ in range(2)]
    assert reply.ok and reply.result is not None and reply.result.text == "released"
    assert probe.calls == 1  # the repeat did not run the tool again
    assert {a["id"] for a in answers} == {"g1"}
    assert sorted(a["replayed"] for a in answers) == [False, True]


# --- what is published for a provider's message ---------------------------------------


def test_sdk_objects_are_sent_as_their_json_dump() -> None:
    from anthropic.types import Message

    message = Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "a"}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )
    body = provider_body(message)
    assert body == message.model_dump(mode="json")
    # An SDK object inside a dict (the assistant turn an integrator builds) is dumped too.
    turn = provider_body({"role": "assistant", "content": message.content})
    assert turn["content"][1] == {**body["content"][1]}
    json.dumps(turn)  # all JSON now
    # A bare content list travels in the message that holds it.
    assert provider_body(message.content) == {"role": "assistant", "content": body["content"]}
    with pytest.raises(TypeError):
        provider_body("echo")


def test_bare_lists_travel_in_their_holder() -> None:
    from openai.types.chat import ChatCompletionMessageFunctionToolCall
    from openai.types.responses import ResponseFunctionToolCall

    chat_call = ChatCompletionMessageFunctionToolCall.model_validate(
        {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    )
    item = ResponseFunctionToolCall.model_validate(
        {"type": "function_call", "call_id": "call_2", "name": "echo", "arguments": "{}"}
    )
    assert set(provider_body([chat_call])) == {"role", "tool_calls"}
    assert set(provider_body([item])) == {"output"}


def test_a_client_refuses_a_bad_identity_mode_or_timeout() -> None:
    broker = BrokerUrl.from_url("mqtt://127.0.0.1:1")
    with pytest.raises(ValueError, match="caller_identity"):
        Client(broker, caller_identity="login")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        Client(broker, timeout_s=0)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_wire_code_comes_back_as_its_own_class(code: ErrorCode) -> None:
    body = ErrorBody(code=code, message="m", details={"message": "a detail key", "n": [1]})
    reply = Reply(id="r1", ok=False, error=body, duration_ms=1.0)
    error = ToolbusError.from_body(body, reply=reply)
    assert type(error) is ERROR_CLASSES[code] and error.code == code
    assert (error.message, error.details, error.id) == ("m", body.details, "r1")
    assert error.body() == body  # the same wire body, had a worker raised it
