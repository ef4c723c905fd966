"""MQTT transport: the only package that imports aiomqtt (and paho beneath it).

`MqttConnection` is one MQTT v5 connection; `socket_reader` bounds what it reads;
`inbound_limits` the packets and user properties it takes; `tls` builds its SSL context;
`errors` tells a lost connection from a refusal; `reasons` reads what the broker said
refusing or dropping one (e.g. `SESSION_TAKEN_OVER`), or a publish (`publish_refused`).

May import: the wire (toolbus.wire) only.
"""

from toolbus.transport.connection import MqttConnection
from toolbus.transport.errors import (
    BrokerRefused,
    SessionTakenOver,
    SubscriptionRefused,
    TransportError,
    Unacknowledged,
)
from toolbus.transport.inbound_limits import max_packet_bytes
from toolbus.transport.reasons import SESSION_TAKEN_OVER, publish_refused, reason_name

__all__ = [
    "SESSION_TAKEN_OVER",
    "BrokerRefused",
    "MqttConnection",
    "SessionTakenOver",
    "SubscriptionRefused",
    "TransportError",
    "Unacknowledged",
    "max_packet_bytes",
    "publish_refused",
    "reason_name",
]
