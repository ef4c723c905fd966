"""Socket reader: when a connection's socket opens and closes, and reading it with a bound.

Receive Maximum is a promise the broker may break: mosquitto before 2.0.13 refills its
window by up to Receive Maximum on every PUBACK (eclipse-mosquitto issue #2306, seen
with Debian 12's 2.0.11 under a flood), and it never covers QoS 0. So a connection with
`hold` reads its socket itself, in place of aiomqtt's reader, and stops reading while
`hold` received messages wait to be taken; TCP flow control then leaves the backlog
with the broker, as asyncio's own streams do with `pause_reading`.

Acknowledgements (SUBACK, UNSUBACK, PUBACK) queue behind the messages, so a connection
with `hold` reads them only as messages are taken: the worker keeps taking while it
subscribes and unsubscribes, and publishes on a second connection. While paused no
PINGRESP is read either; so that paho's keepalive does not drop a connection that is
merely paused, one packet is read every quarter keepalive (at most that many messages
over `hold`).

aiomqtt 2.x has no public API for manual acks or for its reader, so this module holds
the reach past it: `paho_of` (aiomqtt's paho client); everything else goes through
paho's public API (`on_socket_open`, `on_socket_close`, `loop_read`, `socket`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

if TYPE_CHECKING:
    from paho.mqtt.client import SocketLike

log = logging.getLogger("toolbus.transport")


class BoundedReader:
    """One connection's socket, read with a bound when `hold` is given.

    Args:
        client: the aiomqtt client whose paho socket this watches.
        hold: stop reading while this many received messages wait to be taken, read
            again once half of them are (None: aiomqtt reads, unbounded, and this does nothing).
    """

    def __init__(self, client: aiomqtt.Client, hold: int | None) -> None:
        self._client, self._paho = client, paho_of(client)
        self._hold = max(hold, 1) if hold is not None else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._probe: asyncio.TimerHandle | None = None
        self.paused = asyncio.Event()  # set while the socket is not read
        self.pauses = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Before connecting: wrap the socket callbacks aiomqtt set on its paho client."""
        if self._hold is None:
            return  # aiomqtt's own reader, untouched
        self._loop = loop
        aiomqtt_opened, aiomqtt_closed = self._paho.on_socket_open, self._paho.on_socket_close
        if aiomqtt_opened is None or aiomqtt_closed is None:  # aiomqtt changed: never guess
            raise TypeError("aiomqtt no longer sets paho's socket callbacks")

        def opened(client: paho.Client, userdata: object, sock: SocketLike) -> None:
            aiomqtt_opened(client, userdata, sock)
            # Called in paho's connect thread after aiomqtt queued its `add_reader`:
            # queued after it, ours replaces it.
            loop.call_soon_threadsafe(self._take_over, sock.fileno())

        def closed(client: paho.Client, userdata: object, sock: SocketLike) -> None:
            aiomqtt_closed(client, userdata, sock)  # removes whichever reader is registered
            if _on_loop(loop):
                self._closed()  # at once: a resume must not register the closed fd
            else:
                loop.call_soon_threadsafe(self._closed)

        self._paho.on_socket_open = opened
        self._paho.on_socket_close = closed

    def _take_over(self, fd: int) -> None:
        assert self._loop is not None
        sock = self._paho.socket()
        if sock is None or sock.fileno() != fd:  # closed again before this ran
            return
        self._fd = fd
        self.paused.clear()
        self._loop.add_reader(fd, self._read)

    def _closed(self) -> None:
        self._fd = None
        self.paused.clear()
        self._stop_probing()

    def _live(self) -> bool:
        """Our socket is still paho's: registering its fd cannot hit a closed or reused one."""
        sock = self._paho.socket()
        return self._fd is not None and sock is not None and sock.fileno() == self._fd

    def _read(self) -> None:
        try:
            while True:
                self._paho.loop_read()
                # An SSL socket may hold decoded bytes the selector cannot see (paho #131).
                sock = self._paho.socket()
                if self._held() or not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                    break
        except Exception:  # paho reports a lost connection as a code; this is a broken one
            self._failed()
            return
        if self._held() and self._live() and not self.paused.is_set():
            assert self._loop is not None
            assert self._fd is not None
            self._loop.remove_reader(self._fd)
            self.paused.set()
            self.pauses += 1
            self._schedule_probe()
            # Once per connection: it says something about the broker, not about a moment.
            level = logging.WARNING if self.pauses == 1 else logging.DEBUG
            log.log(
                level,
                "%d messages wait to be taken: reading from the broker paused until half "
                "are (a broker overrunning Receive Maximum, such as mosquitto before "
                "2.0.13, or a QoS 0 flood)",
                len(self._client.messages),
            )

    def _held(self) -> bool:
        return self._hold is not None and len(self._client.messages) >= self._hold

    def _schedule_probe(self) -> None:
        assert self._loop is not None
        interval_s = max(self._paho.keepalive / 4, 0.25)
        self._probe = self._loop.call_later(interval_s, self._keep_alive)

    def _keep_alive(self) -> None:
        """Paused: read one packet, so paho sees bytes arrive and keeps the connection."""
        if self.paused.is_set() and self._live():
            try:
                self._paho.loop_read()
            except Exception:  # as in `_read`
                self._failed()
                return
            self._schedule_probe()

    def ended(self) -> asyncio.Future[None]:
        """Once connected: the future aiomqtt ends its message stream with (`ended_of`).
        Ended by a failure of aiomqtt's own reader (without `hold`), the connection is
        dropped as after one of ours: aiomqtt leaves it open."""
        ended = ended_of(self._client)
        ended.add_done_callback(self._aiomqtt_failed)
        return ended

    def _aiomqtt_failed(self, ended: asyncio.Future[None]) -> None:
        if not ended.cancelled() and ended.exception() is not None:
            drop_after_failure(self._paho)  # after a plain loss paho closed it: a no-op

    def _failed(self) -> None:
        """A read raised: never read this socket again (a resume or a probe would handle
        the same packet again), and drop the connection."""
        log.exception("reading from the broker failed; dropping the connection")
        self._closed()  # forgets the fd: `_live` is False from now on
        drop_after_failure(self._paho)

    def _stop_probing(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None

    def taken(self) -> None:
        """One message was taken: read again once half of what was held is gone."""
        if self._hold is not None and len(self._client.messages) <= self._hold // 2:
            self._resume()

    def _resume(self) -> None:
        if not self.paused.is_set():
            return
        assert self._loop is not None
        self.paused.clear()
        self._stop_probing()
        if self._live():
            assert self._fd is not None
            self._loop.add_reader(self._fd, self._read)
            self._loop.call_soon(self._read)  # bytes an SSL socket already decoded


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # paho's connect thread
        return False


def ended_of(client: aiomqtt.Client) -> asyncio.Future[None]:
    """The future aiomqtt ends its message stream with (`Client._disconnected`): also
    set when its socket callbacks fail, which paho's on_disconnect never hears. aiomqtt
    replaces it while connecting: read it once connected."""
    ended = client._disconnected
    if not isinstance(ended, asyncio.Future):  # aiomqtt changed underneath: never guess
        raise TypeError(f"aiomqtt.Client._disconnected is {type(ended).__name__}, not a Future")
    return ended


def drop_after_failure(inner: paho.Client) -> None:
    """After `loop_read` raised (a packet paho could not deliver: a PUBLISH whose topic is
    not UTF-8): paho handles that same packet again on each later `loop_read`, before it
    reads anything more, so a reader left registered spins on the socket's next bytes
    (or its end) for the process's life, an ERROR line a turn. Stop reading the socket
    now; paho's DISCONNECT, once written, closes it and ends the connection."""
    sock = inner.socket()
    if sock is None:
        return
    with contextlib.suppress(RuntimeError, ValueError):  # no running loop; a closed socket
        asyncio.get_running_loop().remove_reader(sock.fileno())
    # 0x04, not a clean 0x00: the broker publishes the connection's Will (the worker's
    # `offline` status), as it would for a connection lost.
    inner.disconnect(ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"))


def paho_of(client: aiomqtt.Client) -> paho.Client:
    """aiomqtt's paho client: the one reach past aiomqtt's API (manual acks, issue #345)."""
    inner = client._client  # no public way to ack manually in aiomqtt 2.x
    if not isinstance(inner, paho.Client):  # aiomqtt changed underneath: fail, never guess
        raise TypeError(f"aiomqtt.Client._client is {type(inner).__name__}, not paho's Client")
    return inner
