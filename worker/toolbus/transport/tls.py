"""TLS: the SSL context a `mqtts://` connection checks the broker with and proves itself by.

Built from the broker's CA, client certificate and key files at each connect, so a
renewed certificate is used from the next reconnect on. Verification is never relaxed:
the broker's certificate must chain to `ca_file` (the system's CAs without one) and
name the host of the URL. A file that cannot be used is a `BrokerRefused` that names
the setting and the file, never what the file holds.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from toolbus.transport.errors import BrokerRefused
from toolbus.wire.broker import BrokerUrl


def tls_context(broker: BrokerUrl) -> ssl.SSLContext | None:
    """The context for `broker` (None for `mqtt://`)."""
    if not broker.tls:
        return None
    try:
        context = ssl.create_default_context(cafile=broker.ca_file)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise BrokerRefused(f"tls_ca_file {broker.ca_file}: {_reason(exc)}") from None
    context.sslsocket_class = _ClosedOnFailedHandshake
    if broker.cert_file is not None:
        try:
            context.load_cert_chain(broker.cert_file, broker.key_file, password=_no_passphrase)
        except (OSError, ValueError) as exc:
            files = _named(("tls_cert_file", broker.cert_file), ("tls_key_file", broker.key_file))
            raise BrokerRefused(f"{files}: {_reason(exc)}") from None
    return context


class _ClosedOnFailedHandshake(ssl.SSLSocket):
    """paho (2.2) drops the socket of a failed handshake without closing it: the file
    descriptor would stay open until the garbage collector finds it, once per attempt."""

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


def _no_passphrase() -> bytes:
    # Without this callback OpenSSL would prompt for an encrypted key's passphrase on
    # the terminal, and a service would hang there.
    raise ValueError("the key is encrypted: give an unencrypted key file")


def _named(*files: tuple[str, Path | None]) -> str:
    return ", ".join(f"{setting} {path}" for setting, path in files if path is not None)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"not usable ({exc.reason or exc})"  # e.g. KEY_VALUES_MISMATCH, PEM_LIB
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read it ({exc.strerror})"
    return str(exc)
