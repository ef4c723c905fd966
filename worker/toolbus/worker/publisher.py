"""The production publisher: through whichever broker connection is live.

A reply must survive a broker blip: `publish` waits for the connection the worker
re-establishes and retries a failed publish, all within `publish_timeout_s`; only
then is the message given up, with an error in the log, and returned as `Unconfirmed`
(with the PUBACK that may still come): the worker then leaves its request
unacknowledged (see `redeliveries`). It never raises.

Once the worker is stopping no connection follows the current one (`last_connection`):
a publish that finds it gone gives the message up at once, with a warning, instead of
waiting out its bound for a reconnect that will not come.
"""

from __future__ import annotations

import asyncio
import logging

from toolbus.transport import MqttConnection, TransportError, Unacknowledged
from toolbus.wire.messages import Outbound, TooLarge, Unconfirmed
from toolbus.wire.untrusted import shown, topic_problem

log = logging.getLogger("toolbus.publisher")

RETRY_PUBLISH_DELAY_S = 0.2


class ConnectionPublisher:
    """Publishes through the connection the worker attaches; waits out reconnects.

    Args:
        timeout_s: how long one message may wait for a connection and its retries.
    """

    def __init__(self, *, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._conn: MqttConnection | None = None
        self._connected = asyncio.Event()
        self._last = False  # stopping: no connection follows the current one
        self._changed = asyncio.Event()  # set on attach and on `last_connection`

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def attach(self, conn: MqttConnection) -> None:
        """The worker connected: publish through `conn` from now on."""
        self._conn = conn
        self._connected.set()
        self._changed.set()

    def detach(self) -> None:
        """The connection is gone: publishes wait for the next one."""
        self._connected.clear()
        self._changed.clear()
        self._conn = None

    def last_connection(self) -> None:
        """The worker is stopping: the current connection (if any) is the last one."""
        self._last = True
        self._changed.set()  # wakes the publishes waiting for a reconnect

    def _gone_for_good(self, conn: MqttConnection | None) -> bool:
        return self._last and (conn is None or not conn.connected)

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        """None once the broker acknowledged `out` (or it can never be sent: an invalid
        topic, a message the transport cannot encode); `Unconfirmed` when given up.
        Raises `TooLarge` for a message over the broker's Maximum Packet Size: sent, it
        would cost the connection and, redelivered, cost it again at every reconnect."""
        if (problem := topic_problem(out.topic)) is not None:
            # The last line of defence: the broker would drop the connection, and with
            # it every request this worker holds (decode refuses such topics first).
            log.error("refused to publish to an invalid topic %s (%s)", shown(out.topic), problem)
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        # One bound over every attempt: each waits only for what remains of it, so a
        # PUBACK that did not come in time leaves no time to send again (a retry would
        # only double the message on a broker that is slow, not gone). No timer of its
        # own on the usual path: the transport bounds its wait for the PUBACK.
        late: asyncio.Future[None] | None = None  # the last attempt's PUBACK, if it still comes
        try:
            while True:
                conn = self._conn
                if self._gone_for_good(conn):
                    log.warning(
                        "could not publish to %s: the broker connection is gone and the "
                        "worker is stopping: message lost",
                        out.topic,
                    )
                    return Unconfirmed(out, late)
                if conn is None or not self._connected.is_set():
                    async with asyncio.timeout_at(deadline):
                        await self._changed.wait()
                    continue
                remaining_s = deadline - loop.time()
                if remaining_s <= 0:
                    break
                try:
                    await conn.publish(out, timeout_s=remaining_s)
                except Unacknowledged as exc:
                    late = exc.late  # sent, and no time left to send again
                    break
                except TransportError as exc:
                    if self._gone_for_good(conn):
                        continue  # said once, above
                    log.debug("publish to %s failed (%s); retrying", out.topic, exc)
                    await asyncio.sleep(min(RETRY_PUBLISH_DELAY_S, remaining_s))
                else:
                    return None
        except TimeoutError:
            pass  # no connection came back in time
        except TooLarge:
            raise  # its sender answers with something smaller (the pipeline: `internal`)
        except Exception:  # a message the transport cannot encode: lost, never raised
            log.exception("could not publish to %s: message lost", out.topic)
            return None
        log.error(
            "could not publish to %s within %.1f s: %s",
            out.topic,
            self._timeout_s,
            "not acknowledged yet" if late is not None else "message lost",
        )
        return Unconfirmed(out, late)
