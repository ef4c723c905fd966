"""Cancelling: a call whose awaiting task is cancelled is cancelled at the workers too.

`toolbus.Client` publishes `{"id"}` on `{prefix}/cancel` (`cancel/{caller}` in `topic`
mode; the body names the caller in `claim` mode, and an anonymous client's reply topic,
which is what makes the call its own) when the task awaiting a call is cancelled: a
`asyncio.timeout` around it, a `TaskGroup` failing, Ctrl-C in `toolbus call`. Once, on
the connection as it is, within `CANCEL_SEND_S`: the worker running the call cancels
its tool, one that has not received it yet answers it `cancelled` without running it.
Nothing waits for that answer: the caller stopped waiting.
"""

from __future__ import annotations

import json
import logging

from toolbus.transport import MqttConnection, TransportError
from toolbus.wire.messages import Outbound

log = logging.getLogger("toolbus.client")

CANCEL_SEND_S = 2.0  # a cancel the broker has not taken by then is given up


class Canceller:
    """Sends the cancel of a call this client made, the way its caller is known."""

    def __init__(self, prefix: str, caller: str | None, in_topic: bool) -> None:
        self._prefix, self._caller, self._in_topic = prefix, caller, in_topic

    async def send(self, connection: MqttConnection | None, ident: str | None, reply: str) -> None:
        """The call `ident` (None: a request without one, which no cancel can name),
        answered on `reply`, is not wanted any more."""
        if ident is not None:
            out = cancel_message(self._prefix, self._caller, self._in_topic, ident, reply)
            await send_cancel(connection, out)


def cancel_message(
    prefix: str, caller: str | None, in_topic: bool, ident: str, reply_topic: str
) -> Outbound:
    """The cancel of the call `ident`, as the workers read it for this client."""
    body: dict[str, str] = {"id": ident}
    topic = f"{prefix}/cancel"
    if in_topic and caller:
        topic = f"{topic}/{caller}"
    elif caller:
        body["caller"] = caller
    else:  # anonymous: the call is known by its reply topic
        body["reply_to"] = reply_topic
    return Outbound(topic, json.dumps(body, separators=(",", ":")).encode())


async def send_cancel(connection: MqttConnection | None, out: Outbound) -> None:
    """`out` once, best effort: no connection now, or a broker that does not take it in
    time, and the call runs to its end (its reply is dropped, as an unwanted one is)."""
    if connection is None or not connection.connected:
        log.info("call cancelled while disconnected: the workers were not told")
        return
    try:
        await connection.publish(out, timeout_s=CANCEL_SEND_S)
    except (TransportError, TimeoutError) as exc:
        log.info("could not send a cancel: %s", exc)
