"""What the broker said when it refused or dropped a connection.

A refused connect is `BrokerRefused` when no retry can help (the credentials, the
broker's certificate), a `TransportError` otherwise. A DISCONNECT the broker sends
carries an MQTT v5 reason code: paho hands it to `on_disconnect` with a flag saying it
came in a packet (not a socket error), and aiomqtt only raises "Unexpected
disconnection" with it, so the connection keeps it (`MqttConnection.disconnect_reason`).
"""

from __future__ import annotations

import ssl
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from toolbus.transport.errors import BrokerRefused, TransportError

# MQTT v5 DISCONNECT 0x8E: another connection came with this client id.
SESSION_TAKEN_OVER = 0x8E
# CONNACK reason codes that refuse the credentials: MQTT v5, then 3.1.1.
_CREDENTIALS_REFUSED = frozenset({134, 135, 4, 5})  # bad user name or password, not authorized
# "Not authorized" (v5 0x87, 3.1.1 5): what mosquitto's dynamic security answers for a bad
# password and for a login bound to another client id alike, so both are named.
NOT_AUTHORIZED = frozenset({135, 5})


def disconnect_reason(*args: Any) -> int | None:
    """The reason code of a DISCONNECT packet the broker sent, from the arguments paho
    (callback API 2) gives `on_disconnect` after the client: userdata, flags, reason
    code, properties. None when the connection ended without one."""
    if len(args) < 3:
        return None
    flags, reason = args[1], args[2]
    if not isinstance(flags, paho.DisconnectFlags) or not flags.is_disconnect_packet_from_server:
        return None
    return reason.value if isinstance(reason, ReasonCode) else None


def connect_error(exc: aiomqtt.MqttError) -> TransportError:
    """What a failed connect means: `BrokerRefused` when retrying cannot help."""
    # aiomqtt raises `from None`: the handshake's own error is still the context.
    cause = exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return BrokerRefused(
            f"TLS certificate verification failed: {cause.verify_message} (check that "
            "tls_ca_file holds the CA that signed the broker's certificate, and that the "
            "certificate names the host of the broker URL)"
        )
    if isinstance(exc, aiomqtt.MqttCodeError):
        code = exc.rc.value if isinstance(exc.rc, ReasonCode) else exc.rc
        if code in NOT_AUTHORIZED:
            return BrokerRefused(
                f"it refused the login ({exc}): wrong login or password, or this login is "
                "bound to another client id",
                reason_code=code,
            )
        if code in _CREDENTIALS_REFUSED:
            return BrokerRefused(f"it refused the credentials ({exc})", reason_code=code)
    return TransportError(str(exc))


def publish_refused(reason_code: int) -> bool:
    """A PUBACK's reason code says the broker did not take the message (MQTT v5: 0x80
    and above; 0x10 "no matching subscribers" is taken)."""
    return reason_code >= 0x80


def reason_name(packet: str, reason_code: int) -> str:
    """The reason code's MQTT v5 name (`Not authorized`), for a message to a person."""
    kinds = {"PUBACK": PacketTypes.PUBACK, "SUBACK": PacketTypes.SUBACK}
    kind = kinds.get(packet, PacketTypes.DISCONNECT)
    try:
        return str(ReasonCode(kind, identifier=reason_code))
    except Exception:  # a code paho does not know for that packet
        return f"reason 0x{reason_code:02x}"
