"""The transport's one reach past aiomqtt: manual acknowledgements through its paho client.

aiomqtt 2.x has no public API for acking a message once it is answered (aiomqtt issue
#345), so the transport uses `aiomqtt.Client._client`. These tests fail loudly when an
aiomqtt upgrade moves or changes what that relies on; the delivery tests then say why
it matters (tests/test_delivery.py).
"""

from __future__ import annotations

import inspect

import aiomqtt
import paho.mqtt.client as paho

from toolbus.config import BrokerUrl
from toolbus.messages import Inbound
from toolbus.transport import MqttConnection, _Delivery, _paho


async def test_aiomqtt_still_wraps_a_paho_client_we_can_ack_through() -> None:
    client = aiomqtt.Client("127.0.0.1", 1, protocol=aiomqtt.ProtocolVersion.V5)
    inner = _paho(client)
    assert isinstance(inner, paho.Client)
    assert list(inspect.signature(inner.ack).parameters) == ["mid", "qos"]
    assert "mid" in inspect.signature(aiomqtt.Message.__init__).parameters


async def test_a_connection_acks_only_what_it_received() -> None:
    broker = BrokerUrl.from_url("mqtt://127.0.0.1:1")
    connection = MqttConnection(broker, receive_maximum=8, manual_ack=True)
    other = MqttConnection(broker)
    assert _paho(connection._client)._manual_ack is True  # set before connecting
    stray = Inbound(topic="t", payload=b"")
    assert connection.ack(stray) is False  # no delivery token: not ours to ack
    message = Inbound(topic="t", payload=b"", delivery=_delivery(other, mid=7))
    assert connection.ack(message) is False  # another connection's message id


def _delivery(connection: MqttConnection, mid: int) -> object:
    return _Delivery(connection, mid, 1)
