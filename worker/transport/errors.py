"""Transport errors: a connection lost or refused, and a refusal no retry can fix.

TransportError        the broker connection failed or was lost: connect again
└── BrokerRefused     the broker (or its certificate) refuses us for who we are
"""

from __future__ import annotations


class TransportError(Exception):
    """The broker connection failed or was lost."""


class BrokerRefused(TransportError):
    """Refused for the configuration, not the moment: the broker's certificate fails
    verification, the broker rejects the credentials, or the TLS files cannot be used.

    Trying again cannot help until the configuration changes: a worker refused at its
    first connect stops with this error (see `service.Worker`).
    """
