"""MQTT transport: the only package that imports aiomqtt (and paho beneath it).

`MqttConnection` is one MQTT v5 connection; `socket_reader` bounds what it reads; `tls`
builds its SSL context; `errors` tells a lost connection from a refusal.
"""

from toolbus.transport.connection import MqttConnection
from toolbus.transport.errors import BrokerRefused, TransportError, Unacknowledged

__all__ = ["BrokerRefused", "MqttConnection", "TransportError", "Unacknowledged"]
