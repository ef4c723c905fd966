"""Two `toolbus.Client`s with one client id, against a real mosquitto: each connection
takes the session from the other. The library connects again only after a doubling
delay (1 s, 2 s, ...), so the pair trade the session a few times a second at most, not
thousands (on 043d827 each reconnected at once, in a tight loop); mosquitto 2.0.11 drops
a taken-over connection without a reason code, 2.0.15 and later with 0x8E.
"""

from __future__ import annotations

import asyncio
import uuid

from tests.support.harness import Broker
from toolbus.client.client import Client

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
