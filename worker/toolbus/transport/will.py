"""Will: the message the broker publishes for a connection that dies uncleanly.

The worker's is its `offline` status (`status.StatusReporter.will`); it goes to the
broker in the CONNECT packet, with its MQTT v5 properties (its expiry above all).
"""

from __future__ import annotations

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from toolbus.wire.messages import Outbound


def last_will(out: Outbound) -> aiomqtt.Will:
    """`out` as aiomqtt's will, with its properties."""
    return aiomqtt.Will(
        topic=out.topic,
        payload=out.payload,
        qos=out.qos,
        retain=out.retain,
        properties=_will_properties(out),
    )


def _will_properties(out: Outbound) -> Properties:
    props = Properties(PacketTypes.WILLMESSAGE)
    if out.expiry_s is not None:
        props.MessageExpiryInterval = out.expiry_s
    if out.content_type:
        props.ContentType = out.content_type
    if out.correlation_data is not None:
        props.CorrelationData = out.correlation_data
    if out.response_topic:
        props.ResponseTopic = out.response_topic
    for key, value in out.user_properties:
        props.UserProperty = (key, value)  # paho appends on each assignment
    return props
