"""MQTT transport: the only package that imports aiomqtt (and paho beneath it).

`MqttConnection` is one MQTT v5 connection; `socket_reader` bounds what it reads.
"""

from toolbus.transport.connection import MqttConnection, TransportError

__all__ = ["MqttConnection", "TransportError"]
