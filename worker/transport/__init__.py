"""MQTT transport: the only package that imports aiomqtt (and paho beneath it).

`MqttConnection` is one MQTT v5 connection; `socket_reader` bounds what it reads;
`inbound_limits` the packets and user properties it takes; `tls` builds its SSL context;
`errors` tells a lost connection from a refusal.
"""

from toolbus.transport.connection import MqttConnection
from toolbus.transport.errors import BrokerRefused, TransportError
from toolbus.transport.inbound_limits import max_packet_bytes

__all__ = ["BrokerRefused", "MqttConnection", "TransportError", "max_packet_bytes"]
