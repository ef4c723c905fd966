"""Two `toolbus.Client`s with one client id, against a real mosquitto: each connection
takes the session from the other. The library connects again only after a doubling
delay (1 s, 2 s, ...), so the pair trade the session a few times a second at most, not
thousands (on 043d827 each reconnected at once, in a tight loop); mosquitto 2.0.11 drops
a taken-over connection without a reason code, 2.0.15 and later with 0x8E. The session
can also be taken while a connection is being made, between its CONNACK and its SUBACK:
a short-lived connection like any other, never "cannot reach the broker" (`Thief` makes
that race certain; it failed `tests/cli/test_cli_acl.py` once in CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from tests.support.harness import Broker
from toolbus.client.client import Client
from toolbus.client.presence import Presence
from toolbus.client.requester import FIRST_CONNECT_DROPS, NO_RETRY, Requester
from toolbus.client.takeover import TAKEN_OVER_DELAYS_S
from toolbus.transport import MqttConnection, SessionTakenOver, SubscriptionRefused, TransportError
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.errors import NoWorker
from toolbus.wire.messages import Outbound
from toolbus.wire.topics import Topics

WATCHED_S = 2.5
# 1 s, then 2 s, apart at most: 2 or 3 connects each in 2.5 s; before, hundreds.
MAX_CONNECTS = 4


async def test_two_clients_with_one_client_id_back_off(broker: Broker) -> None:
    shared = f"same-{uuid.uuid4().hex[:8]}"
    first = Client(broker.url, client_id=shared)
    second = Client(broker.url, client_id=shared)
    async with first, second:
        await asyncio.sleep(WATCHED_S)  # the measure: how often they reconnect meanwhile
        connects = (first.connects, second.connects)
    assert max(connects) <= MAX_CONNECTS, connects
    assert sum(connects) >= 3, connects  # they did take it from each other


class Thief:
    """A requester's `watch` that takes its session as it is being made: it connects
    with the same client id between the requester's CONNACK and its last SUBACK (the
    race of two commands started together with one client id), then subscribes on the
    requester's connection, which mosquitto has dropped (with 0x8E from 2.0.15). On the
    first `times` connections; the connections it made are in `made`."""

    def __init__(self, broker: Broker, client_id: str, times: int = 1) -> None:
        self.broker, self.client_id, self.times = broker, client_id, times
        self.made: list[MqttConnection] = []

    async def __call__(self, connection: MqttConnection) -> None:
        if len(self.made) < self.times:
            await self.take()
            await connection.subscribe([f"takeover/{self.client_id}/watched"])

    async def take(self) -> None:
        """Connect with the client id: mosquitto drops the connection that had it."""
        thief = MqttConnection(
            BrokerUrl.from_url(self.broker.url), client_id=self.client_id, timeout_s=5
        )
        await thief.__aenter__()
        self.made.append(thief)

    async def close(self) -> None:
        for thief in self.made:
            with contextlib.suppress(TransportError):
                await thief.__aexit__(None, None, None)


async def _answer_once(broker: Broker, topic: str, subscribed: asyncio.Event) -> None:
    """Echo the first request on `topic` to its response topic, with its correlation."""
    async with MqttConnection(BrokerUrl.from_url(broker.url), timeout_s=5) as responder:
        await responder.subscribe([topic])
        subscribed.set()
        async for message in responder.messages():
            assert message.response_topic is not None
            back = Outbound(
                topic=message.response_topic,
                payload=message.payload,
                correlation_data=message.correlation_data,
            )
            await responder.publish(back)
            return


def _requester(broker: Broker, client_id: str, thief: Thief, *, fail: bool) -> Requester:
    return Requester(
        BrokerUrl.from_url(broker.url),
        reply_topic=f"takeover/{client_id}/reply",
        client_id=client_id,
        retry=NO_RETRY,
        connect_timeout_s=5,
        watch=thief,
        fail_when_taken_over=fail,
    )


async def test_a_connection_taken_over_as_it_is_made_is_made_again(broker: Broker) -> None:
    """Lost between its CONNACK and its SUBACK: before, `TransportError` out of the
    first connect (`toolbus call` said "cannot reach the broker"). Now it counts as a
    short-lived connection: made again after the first takeover delay, then it works."""
    shared = f"race-{uuid.uuid4().hex[:8]}"
    thief = Thief(broker, shared)
    requester = _requester(broker, shared, thief, fail=False)
    asked, subscribed = f"takeover/{shared}/ask", asyncio.Event()
    responder = asyncio.create_task(_answer_once(broker, asked, subscribed))
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(10):
            await subscribed.wait()
            began = loop.time()
            async with requester:
                took_s = loop.time() - began
                answer = await requester.request(
                    asked, b"hello", bytes, timeout_s=5, grace_s=0, correlation=b"c1", ident=None
                )
            await responder
    finally:
        responder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await responder
        await thief.close()
    assert answer == b"hello"
    assert len(thief.made) == 1 and requester.connects == 1
    assert took_s >= TAKEN_OVER_DELAYS_S[0], took_s  # backed off: never a tight loop


async def test_a_command_taken_over_as_it_connects_is_told_so(broker: Broker) -> None:
    """`fail_when_taken_over` (`toolbus call`): the session taken as it is made, then
    once more once it is up, fails with `SessionTakenOver` (whose words name the client
    id), never a bare `TransportError`."""
    shared = f"race-{uuid.uuid4().hex[:8]}"
    thief = Thief(broker, shared)
    requester = _requester(broker, shared, thief, fail=True)

    async def command() -> None:
        async with requester:  # 2.0.15 and later: raised here, on the 0x8E
            await thief.take()  # taken once more, now that it is up
            await requester.request(
                "takeover/nobody",
                b"hi",
                bytes,
                timeout_s=5,
                grace_s=0,
                correlation=b"c1",
                ident=None,
            )

    try:
        async with asyncio.timeout(10):
            with pytest.raises(SessionTakenOver) as told:
                await command()
    finally:
        await thief.close()
    assert told.value.client_id == shared
    assert len(thief.made) == (1 if told.value.certain else 2)  # 0x8E: told at once


async def test_a_first_connect_taken_over_every_time_gives_up(broker: Broker) -> None:
    """Without `fail_when_taken_over`, a first connect whose session is taken every time
    it is made gives up after `FIRST_CONNECT_DROPS`, after the delays between: bounded."""
    shared = f"race-{uuid.uuid4().hex[:8]}"
    thief = Thief(broker, shared, times=FIRST_CONNECT_DROPS)
    requester = _requester(broker, shared, thief, fail=False)
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        async with asyncio.timeout(15):
            with pytest.raises(SessionTakenOver) as told:
                async with requester:
                    pass
    finally:
        await thief.close()
    took_s = loop.time() - began
    assert len(thief.made) == FIRST_CONNECT_DROPS
    assert took_s >= sum(TAKEN_OVER_DELAYS_S[: FIRST_CONNECT_DROPS - 1]), took_s
    assert told.value.client_id == shared


class _Subscribing:
    """A connection as far as `Presence.subscribe` sees it; `error`: what its subscribe
    raises. After a DISCONNECT 0x8E paho still reads as `connected` (only a silent close
    marks it lost)."""

    connected = True

    def __init__(self, error: TransportError | None = None) -> None:
        self.error = error

    async def subscribe(self, filters: list[str], qos: int = 1) -> None:
        if self.error is not None:
            raise self.error


async def test_presence_raises_a_lost_subscription_and_keeps_only_a_refusal() -> None:
    """The worker-status watch: a subscription lost to a takeover (or a SUBACK that never
    came) is raised, so the requester connects again, and the next connection's statuses
    are read; before, it was taken for an ACL's refusal and `require_worker` was off for
    the client's life. An ACL's refusal still means the statuses cannot tell."""
    presence = Presence(Topics("toolbus", "", ("toolbus/reply/",)))
    lost = _Subscribing(TransportError("connection lost while subscribing"))
    with pytest.raises(TransportError):
        await presence.subscribe(lost)  # type: ignore[arg-type]
    await presence.subscribe(_Subscribing())  # type: ignore[arg-type]  # the next connection
    async with asyncio.timeout(5):
        with pytest.raises(NoWorker):
            await presence.check()  # read, not given up on: no status says a worker is up

    refused = Presence(Topics("toolbus", "", ("toolbus/reply/",)))
    acl = SubscriptionRefused("refused", [("toolbus/status/workers/+", 0x87)])
    await refused.subscribe(_Subscribing(acl))  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        await refused.check()  # cannot tell: the request goes out
