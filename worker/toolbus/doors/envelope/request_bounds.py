"""Request bounds: what a request may hold beside its body, checked before it is read.

The payload is at most `max_payload_bytes`; the MQTT v5 user properties at most
`MAX_USER_PROPERTIES` of them in `MAX_USER_PROPERTY_BYTES` (`toolbus.wire.messages`). A
request over either is refused as `bad_request` (the user properties with `reason:
user_properties_too_large`, `count` and `size_bytes` as counted up to the first property
past a bound), which costs only its sender: the transport never reads user properties
beyond the bounds (`transport.inbound_limits`), and the broker never sends a packet over
the worker's Maximum Packet Size.
"""

from __future__ import annotations

from toolbus.wire.errors import BadRequest
from toolbus.wire.messages import (
    MAX_USER_PROPERTIES,
    MAX_USER_PROPERTY_BYTES,
    Inbound,
    UserPropertyTally,
)


def check_bounds(message: Inbound, max_payload_bytes: int) -> None:
    """Raises `BadRequest` for a payload or user properties over their bounds."""
    if len(message.payload) > max_payload_bytes:
        raise BadRequest(
            f"payload of {len(message.payload)} bytes exceeds the limit of {max_payload_bytes}",
            limit_bytes=max_payload_bytes,
            size_bytes=len(message.payload),
        )
    tally = message.dropped_user_properties
    if tally is None and message.user_properties:
        tally = UserPropertyTally.of(message.user_properties)
    if tally is not None and tally.over:
        # Counted up to the first past a bound (`UserPropertyTally`): at least that many.
        raise BadRequest(
            f"at least {tally.count} user properties of {tally.size_bytes} bytes exceed the "
            f"limit of {MAX_USER_PROPERTIES} in {MAX_USER_PROPERTY_BYTES} bytes",
            reason="user_properties_too_large",
            limit_count=MAX_USER_PROPERTIES,
            count=tally.count,
            limit_bytes=MAX_USER_PROPERTY_BYTES,
            size_bytes=tally.size_bytes,
        )
