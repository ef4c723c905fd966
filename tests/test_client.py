"""The requester's half: `toolbus.client.Client` re-sends unanswered calls under the same
id, takes the first reply, and gives up within its deadline.

Against a real mosquitto. The "worker" here is a test client that reads the requests
itself, so it can ignore the first send (a worker that died with it) and answer later
ones: each re-send is observed, not inferred from timing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import aiomqtt
import pytest
import pytest_asyncio

from tests.harness import Broker
from tests.mqtt import Caller, correlation_of
from tests.test_cli import cli_env, run_cli
from toolbus.client import Client, NoReply, Retry, request
from toolbus.config import BrokerUrl
from toolbus.contracts import Reply


@pytest_asyncio.fixture
async def fake_worker(broker: Broker) -> AsyncIterator[tuple[Caller, str]]:
    """A subscriber on a fresh call topic, answering by hand."""
    prefix = f"cl{uuid.uuid4().hex[:8]}"
    async with Caller(broker.url) as worker:
        await worker.subscribe(f"{prefix}/call/#")
        yield worker, prefix


def client_of(broker: Broker, prefix: str, attempts: int) -> Client:
    """A client re-sending every 0.2 s: each re-send is seen by the fake worker."""
    return Client(
        BrokerUrl.from_url(broker.url),
        reply_prefix=f"{prefix}/reply/",
        retry=Retry(attempts=attempts, interval_s=0.2),
    )


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
            client.call(f"{prefix}/call/echo", {"arguments": {"text": "x"}}, timeout_s=10),
            name="retried-call",
        )
        first = await worker.next_message()  # dropped: the worker that had it died
        second = await worker.next_message()
        await answer(worker, second, "second")
        reply = await asyncio.wait_for(calling, 5)
    sent = [json.loads(first.payload), json.loads(second.payload)]
    assert sent[0]["id"] == sent[1]["id"] and sent[0]["id"]  # generated once, kept
    assert correlation_of(first) == correlation_of(second)
    assert reply.result is not None and reply.result.text == "second"
    assert (client.sent, client.resent) == (2, 1)
    # The request expires when the requester stops waiting.
    assert 9 <= getattr(first.properties, "MessageExpiryInterval", 0) <= 10


async def test_the_first_reply_wins_and_late_ones_are_dropped(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    async with client_of(broker, prefix, attempts=2) as client:
        calling = asyncio.create_task(
            client.call(f"{prefix}/call/echo", {"id": "mine"}, timeout_s=10), name="twice"
        )
        first = await worker.next_message()
        second = await worker.next_message()
        await answer(worker, second, "replayed")
        await answer(worker, first, "late original")
        reply = await asyncio.wait_for(calling, 5)
        # The late reply found no caller: the next call still gets its own answer.
        again = asyncio.create_task(
            client.call(f"{prefix}/call/echo", {"id": "next"}, timeout_s=10), name="next"
        )
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
    with pytest.raises(NoReply):
        await request(
            BrokerUrl.from_url(broker.url),
            f"{prefix}/call/echo",
            {"id": "lost"},
            reply_prefix=f"{prefix}/reply/",
            timeout_s=1.0,
            retry=Retry(attempts=2, interval_s=0.2),
        )
    seen = [await worker.next_message(), await worker.next_message()]
    assert [json.loads(m.payload)["id"] for m in seen] == ["lost", "lost"]
    assert worker.unclaimed() == []  # two attempts: two sends, no third


@pytest.mark.parametrize(("attempts", "interval_s"), [(0, 1.0), (3, 0.0), (2, -1.0)])
def test_a_retry_needs_an_attempt_and_an_interval(attempts: int, interval_s: float) -> None:
    with pytest.raises(ValueError, match="attempt"):
        Retry(attempts, interval_s)


async def test_toolbus_call_sends_again_when_no_reply_comes(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    worker, prefix = fake_worker
    flags = ("--broker", broker.url, "--timeout", "5", "--retry-interval", "0.3")
    calling = asyncio.create_task(
        run_cli("call", "echo", "text=x", *flags, env=cli_env(prefix)), name="cli-call"
    )
    await worker.next_message()  # dropped
    await answer(worker, await worker.next_message(), "answered")
    code, out, err = await asyncio.wait_for(calling, 30)
    assert code == 0, err
    assert json.loads(out)["result"]["text"] == "answered"
    once = await run_cli("call", "echo", *flags, "--attempts", "0", env=cli_env(prefix))
    assert once[0] == 2  # a usage error, before anything is sent
