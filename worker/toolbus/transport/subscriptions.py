"""Subscriptions: the options a SUBSCRIBE asks for, and what its SUBACK refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paho.mqtt.subscribeoptions import SubscribeOptions


def subscribe_options(qos: int, *, retained: bool) -> SubscribeOptions:
    """`qos`, and whether the broker sends the filter's retained messages on subscribing
    (Retain Handling 0) or none (2: a retained request must not run at every subscribe)."""
    handling = (
        SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE
        if retained
        else SubscribeOptions.RETAIN_DO_NOT_SEND
    )
    return SubscribeOptions(qos=qos, retainHandling=handling)


def refused_filters(filters: Sequence[str], granted: Sequence[Any]) -> list[tuple[str, int]]:
    """The filters a SUBACK refused, with their reason codes: 0x80 and above (MQTT 5
    §3.9.3; a v3.1.1 broker's 0x80 too). `granted` holds paho's `ReasonCode`s or ints."""
    codes = [int(getattr(code, "value", code)) for code in granted]
    return [(f, code) for f, code in zip(filters, codes, strict=False) if code >= 0x80]
