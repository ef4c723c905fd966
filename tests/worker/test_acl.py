"""Caller identity from the broker: the shipped ACL and `caller_identity = "topic"`, end to end.

A mosquitto of our own with `allow_anonymous false`, a password file made by
`mosquitto_passwd`, and the ACL the project ships (compose/mosquitto/acl). Logged in as
`kitchen`, a client cannot act as `garage`, cannot read `garage`'s replies, and cannot
make the worker publish on them. Every "nothing arrived" is bounded by a later message
the same client does receive (the broker keeps each session's order).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller
from toolbus.worker.service import Worker

ROOT = Path(__file__).parents[2]
ACL = ROOT / "compose" / "mosquitto" / "acl"
LOGINS = {"toolbus": "pw-worker", "operator": "pw-op", "kitchen": "pw-k", "garage": "pw-g"}
# Logins an operator could make with mosquitto_passwd, that must not act as a caller.
LOGINS |= {"kitchen/echo": "pw-ke", "anonymous": "pw-a"}


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    directory = tmp_path_factory.mktemp("mosquitto-acl")
    shutil.copy(ACL, directory / "acl")
    broker = Broker(directory, passwords=LOGINS, acl_file=directory / "acl")
    broker.start()
    yield broker
    broker.stop()


@pytest_asyncio.fixture(scope="module")
async def acl_worker(secured_broker: Broker) -> AsyncIterator[Worker]:
    host = secured_broker.url.removeprefix("mqtt://")
    settings = make_settings(
        secured_broker,
        broker_url=f"mqtt://toolbus:{LOGINS['toolbus']}@{host}",
        topic_prefix="toolbus",
        caller_identity="topic",
    )
    async with running_worker(settings) as worker:
        yield worker


def login(broker: Broker, name: str) -> Caller:
    return Caller(broker.url, username=name, password=LOGINS[name])


async def echo(caller: Caller, name: str, reply: str) -> dict[str, object]:
    body = {"arguments": {"text": name}}
    answer, _ = await caller.call(f"toolbus/call/{name}/echo", body, reply_topic=reply)
    return answer


async def test_a_caller_can_call_as_itself(acl_worker: Worker, secured_broker: Broker) -> None:
    async with login(secured_broker, "kitchen") as kitchen:
        reply = await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r1")
    assert reply["ok"] is True


async def test_a_caller_cannot_publish_as_another(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    async with (
        login(secured_broker, "kitchen") as kitchen,
        login(secured_broker, "operator") as operator,
    ):
        assert await operator.subscribe("toolbus/call/#") < 0x80
        await kitchen.publish(
            "toolbus/call/garage/echo",
            b'{"arguments": {"text": "spoof"}}',
            response_topic="toolbus/reply/kitchen/spoof",
            correlation=b"spoof",
        )
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r2"))["ok"] is True
        seen = [m.topic.value for m in operator.unclaimed()]
        # Only kitchen's own request ever reached a subscriber; the spoof never got past.
        assert seen == ["toolbus/call/kitchen/echo"]
        assert kitchen.unclaimed() == []


async def test_a_caller_cannot_read_another_callers_replies(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    async with (
        login(secured_broker, "kitchen") as kitchen,
        login(secured_broker, "garage") as garage,
    ):
        # mosquitto 2.0 grants the subscription and checks `read` on each delivery.
        await kitchen.subscribe("toolbus/reply/garage/#")
        assert (await echo(garage, "garage", "toolbus/reply/garage/r1"))["ok"] is True
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r3"))["ok"] is True
        assert kitchen.unclaimed() == []


async def test_a_caller_cannot_make_the_worker_publish_on_another_callers_replies(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    async with (
        login(secured_broker, "kitchen") as kitchen,
        login(secured_broker, "garage") as garage,
        login(secured_broker, "operator") as operator,
    ):
        assert await garage.subscribe("toolbus/reply/garage/#") < 0x80
        assert await operator.subscribe("toolbus/dead") < 0x80
        await kitchen.publish(
            "toolbus/call/kitchen/echo",
            b'{"id": "forged-ok", "arguments": {"text": "x"}}',
            response_topic="toolbus/reply/garage/inbox",
            correlation=b"garage-correlation",
        )
        letter = json.loads((await operator.next_message()).payload)
        assert letter["error"]["code"] == "forbidden"
        assert letter["error"]["details"]["reason"] == "outside_prefixes"
        assert (await echo(garage, "garage", "toolbus/reply/garage/r2"))["ok"] is True
        assert garage.unclaimed() == []


async def test_a_body_claim_of_another_caller_is_forbidden(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    async with login(secured_broker, "kitchen") as kitchen:
        body = {"caller": "garage", "arguments": {"text": "x"}}
        reply, _ = await kitchen.call(
            "toolbus/call/kitchen/echo", body, reply_topic="toolbus/reply/kitchen/r4"
        )
    assert reply["error"]["code"] == "forbidden"
    assert reply["error"]["details"]["reason"] == "caller_mismatch"


async def test_a_bad_tool_level_under_the_callers_own_topic_is_answered(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    """`call/kitchen/{tool}` is kitchen's whatever the tool level holds (kitchen's ACL
    block: `call/kitchen/#`): a tool level the worker cannot use gets kitchen a reply, not a dead letter."""
    async with (
        login(secured_broker, "kitchen") as kitchen,
        login(secured_broker, "operator") as operator,
    ):
        assert await operator.subscribe("toolbus/dead") < 0x80
        assert await operator.subscribe("toolbus/reply/kitchen/r6") < 0x80
        reply, _ = await kitchen.call(
            "toolbus/call/kitchen/" + "e" * 300,
            {"id": "long-tool", "arguments": {"text": "x"}},
            reply_topic="toolbus/reply/kitchen/r5",
        )
        assert (reply["id"], reply["error"]["code"]) == ("long-tool", "bad_request")
        assert reply["error"]["details"]["reason"] == "name_too_long"
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r6"))["ok"] is True
        # The worker's messages reach a subscriber in order: no dead letter before that.
        assert (await operator.next_message()).topic.value == "toolbus/reply/kitchen/r6"


async def test_a_login_with_a_slash_cannot_act_as_the_caller_before_it(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    """Under `pattern write toolbus/call/%u/#` the login `kitchen/echo` could publish on
    toolbus/call/kitchen/echo (caller `kitchen`, tool `echo`) and read kitchen's replies
    under toolbus/reply/kitchen/echo/ (issue 24.3). The shipped ACL has no patterns: a
    login without a block of its own can do nothing."""
    async with (
        login(secured_broker, "kitchen") as kitchen,
        login(secured_broker, "kitchen/echo") as impostor,
        login(secured_broker, "operator") as operator,
    ):
        assert await operator.subscribe("toolbus/call/#") < 0x80
        await impostor.subscribe("toolbus/reply/kitchen/#")
        await impostor.subscribe("toolbus/reply/kitchen/echo/#")
        await impostor.publish(
            "toolbus/call/kitchen/echo",
            b'{"arguments": {"text": "as kitchen"}}',
            response_topic="toolbus/reply/kitchen/echo/stolen",
            correlation=b"stolen",
        )
        # kitchen's own call, its reply where the impostor's read pattern reached, then
        # a second one: the impostor would have had the first reply before this returns.
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/echo/r1"))["ok"] is True
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/echo/r2"))["ok"] is True
        seen = [m.topic.value for m in operator.unclaimed()]
        assert seen == ["toolbus/call/kitchen/echo"] * 2  # kitchen's two, not the impostor's
        assert impostor.unclaimed() == []


async def test_a_login_named_anonymous_is_not_the_anonymous_caller(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    """The login `anonymous` could publish on toolbus/call/anonymous/... and read
    toolbus/reply/anonymous/#, the anonymous caller's replies (issue 24.3). It has no
    block in the shipped ACL, and the worker refuses that level besides (test_hostile)."""
    async with (
        login(secured_broker, "anonymous") as anonymous,
        login(secured_broker, "operator") as operator,
        login(secured_broker, "kitchen") as kitchen,
    ):
        assert await operator.subscribe("toolbus/call/#") < 0x80
        await anonymous.subscribe("toolbus/reply/anonymous/#")
        await anonymous.publish(
            "toolbus/call/anonymous/echo",
            b'{"arguments": {"text": "as anonymous"}}',
            response_topic="toolbus/reply/anonymous/mine",
            correlation=b"mine",
        )
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r5"))["ok"] is True
        assert [m.topic.value for m in operator.unclaimed()] == ["toolbus/call/kitchen/echo"]
        assert anonymous.unclaimed() == []


async def test_a_caller_cancels_only_its_own_calls(
    acl_worker: Worker, secured_broker: Broker
) -> None:
    """The shipped ACL lets the worker hear `cancel/#` and each caller publish only on
    `cancel/{itself}`: kitchen's early cancel (heard before its call is sent) is
    remembered and its call answered `cancelled` unrun; garage's cancel of the same id
    on kitchen's topic never reaches the worker, and on its own topic names garage's
    call, not kitchen's."""
    async with (
        login(secured_broker, "kitchen") as kitchen,
        login(secured_broker, "garage") as garage,
    ):
        handled = acl_worker.cancels.handled
        await garage.publish("toolbus/cancel/kitchen", b'{"id": "theirs"}')  # dropped
        await garage.publish("toolbus/cancel/garage", b'{"id": "theirs"}')
        await kitchen.publish("toolbus/cancel/kitchen", b'{"id": "mine"}')
        async with asyncio.timeout(10):
            await acl_worker.cancels.until_handled(handled + 2)
        mine, _ = await kitchen.call(
            "toolbus/call/kitchen/echo",
            {"id": "mine", "arguments": {"text": "x"}},
            reply_topic="toolbus/reply/kitchen/c1",
        )
        theirs, _ = await kitchen.call(
            "toolbus/call/kitchen/echo",
            {"id": "theirs", "arguments": {"text": "x"}},
            reply_topic="toolbus/reply/kitchen/c2",
        )
    assert mine["error"]["code"] == "cancelled"
    assert mine["error"]["details"] == {"started": False, "in_doubt": False, "cause": "caller"}
    assert theirs["ok"] is True
    assert acl_worker.cancels.handled == handled + 2  # garage's on kitchen's topic: dropped
