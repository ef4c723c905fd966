"""Transport errors: a connection lost or refused, and a refusal no retry can fix.

TransportError        the broker connection failed or was lost: connect again
├── BrokerRefused     the broker (or its certificate) refuses us for who we are
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


class Unacknowledged(TransportError):
    """A publish's PUBACK did not come within its bound, on a connection still up.

    The message was sent: a stalled broker reads it when it resumes. `late` resolves if
    its PUBACK comes after all, and fails once the connection is lost without it.
    """

    def __init__(self, late: asyncio.Future[None]) -> None:
        super().__init__("the broker did not acknowledge in time")
        self.late = late
