"""Transport errors: a connection lost or refused, and a refusal no retry can fix.

TransportError        the broker connection failed or was lost: connect again
├── BrokerRefused     the broker (or its certificate) refuses us for who we are
├── SessionTakenOver  another connection came with our client id (MQTT v5 0x8E)
├── SubscriptionRefused  the broker refused a filter (SUBACK 0x80 and above: an ACL)
└── Unacknowledged    a publish's PUBACK did not come in time (it may still come)
"""

from __future__ import annotations

import asyncio


class TransportError(Exception):
    """The broker connection failed or was lost."""


class BrokerRefused(TransportError):
    """Refused for the configuration, not the moment: the broker's certificate fails
    verification, the broker rejects the credentials, or the TLS files cannot be used.

    Trying again cannot help until the configuration changes: a worker refused at its
    first connect stops with this error (see `service.Worker`). `reason_code`: the
    CONNACK's, when the broker refused the login (135 or 5: not authorized, which may
    mean a login bound to another client id); None for a certificate or TLS file.
    """

    def __init__(self, message: str, *, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class SessionTakenOver(TransportError):
    """The broker dropped us because another connection came with our client id (MQTT
    v5 DISCONNECT 0x8E; `certain` False: no reason given, but dropped at once again and
    again, as mosquitto before 2.0.15 drops a taken-over connection). Connecting again
    at once would take the session back, and the other would do the same: for a
    one-off command, two at once with one client id."""

    def __init__(self, client_id: str, *, certain: bool = True, times: int = 1) -> None:
        super().__init__(
            f"another connection with client id {client_id} took this one's session over"
            if certain
            else f"the broker dropped the connection with client id {client_id} right after "
            f"it was made, {times} times in a row: another connection with that client id "
            "is likely taking it over (mosquitto before 2.0.15 does not say so)"
        )
        self.client_id = client_id
        self.certain = certain  # the broker said so (MQTT v5 0x8E)


class SubscriptionRefused(TransportError):
    """The broker refused one or more filters of a subscription (SUBACK reason codes
    0x80 and above; 0x87 "not authorized" from an ACL). `refused`: each filter with its
    code. The connection stays up."""

    def __init__(self, message: str, refused: list[tuple[str, int]]) -> None:
        super().__init__(message)
        self.refused = refused


class Unacknowledged(TransportError):
    """A publish's PUBACK did not come within its bound, on a connection still up.

    The message was sent: a stalled broker reads it when it resumes. `late` resolves if
    its PUBACK comes after all, and fails once the connection is lost without it.
    """

    def __init__(self, late: asyncio.Future[None]) -> None:
        super().__init__("the broker did not acknowledge in time")
        self.late = late
