"""Handover: what a stopping worker counts as another worker online (read from the
retained statuses on a real mosquitto), and that whenever that is unknown it keeps its
subscription; the whole stop, with real processes, is tests/worker/test_clean_restart.py.
"""

from __future__ import annotations

import uuid
from typing import Literal

from tests.support.harness import Broker, ListPublisher
from tests.support.mqtt import Caller
from toolbus.config import BrokerUrl
from toolbus.transport import MqttConnection
from toolbus.transport.nodes import Nodes
from toolbus.wire.contracts import WorkerStatus
from toolbus.wire.messages import Outbound, Unconfirmed
from toolbus.wire.topics import Topics
from toolbus.worker.client_ids import ClientIds
from toolbus.worker.handover import Handover, online_workers
from toolbus.worker.links import Links
from toolbus.worker.status import StatusReporter


async def test_only_another_worker_saying_online_counts(broker: Broker) -> None:
    """What the stopping worker reads: its own status, `stopping`, `offline`, a cleared
    status and one it cannot read (another version's) are not a worker to take over."""
    prefix = f"handover{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix, "toolbus", (f"{prefix}/reply/",))

    def status(worker_id: str, state: Literal["online", "stopping", "offline"]) -> bytes:
        return WorkerStatus(state=state, worker_id=worker_id).model_dump_json().encode()

    retained = {
        "me": status("me", "online"),
        "up": status("up", "online"),
        "going": status("going", "stopping"),
        "gone": status("gone", "offline"),
        "newer": b'{"state": "paused", "worker_id": "newer"}',
        "garbled": b"\x00not json",
    }
    async with Caller(broker.url) as publisher:
        for worker_id, payload in retained.items():
            await publisher.client.publish(topics.status(worker_id), payload, qos=1, retain=True)
        async with MqttConnection(BrokerUrl.from_url(broker.url)) as conn:
            assert await online_workers(conn, topics, "me") == ["up"]
        await publisher.client.publish(topics.status("up"), b"", qos=1, retain=True)  # cleared
        async with MqttConnection(BrokerUrl.from_url(broker.url)) as conn:
            assert await online_workers(conn, topics, "me") == []


class GivenUp(ListPublisher):
    """A broker that never acknowledges: every publish is given up."""

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        await super().publish(out)
        return Unconfirmed(out)


def handover(publisher: ListPublisher, broker: Broker, session_expiry_s: int) -> Handover:
    topics = Topics("inproc", "toolbus", ("inproc/reply/",))
    status = StatusReporter(topics, "me", publisher, [], interval_s=15.0)
    ids = ClientIds(requests="me-r", replies="me-p", persistent=session_expiry_s > 0)
    links = Links(Nodes(BrokerUrl.from_url(broker.url)), ids, 4, session_expiry_s, 1.0, 60)
    return Handover(status, topics, "me", links, timeout_s=1.0)


class NoCounts:
    count = handled = 0


async def test_in_doubt_the_subscription_is_kept(broker: Broker) -> None:
    """`stopping` not acknowledged, or the statuses unreadable (the connection gone):
    nothing says another worker takes the requests, so they wait in the session."""
    never_connected = MqttConnection(BrokerUrl.from_url(broker.url))
    publisher = GivenUp()
    assert await handover(publisher, broker, 3600).keep(never_connected, NoCounts(), 60)
    [said] = publisher.sent
    assert WorkerStatus.model_validate_json(said.payload).state == "stopping"
    assert (said.retain, said.expiry_s) == (True, 60)

    async with MqttConnection(BrokerUrl.from_url(broker.url)) as closed:
        pass
    assert await handover(ListPublisher(), broker, 3600).keep(closed, NoCounts(), 60)


async def test_a_clean_session_says_stopping_and_keeps_nothing(broker: Broker) -> None:
    publisher = ListPublisher()
    unused = MqttConnection(BrokerUrl.from_url(broker.url))
    assert not await handover(publisher, broker, 0).keep(unused, NoCounts(), 60)
    [said] = publisher.sent
    assert WorkerStatus.model_validate_json(said.payload).state == "stopping"
