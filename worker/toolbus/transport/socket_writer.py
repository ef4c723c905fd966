"""Socket writer: paho's queued packets written from the event loop, once per loop turn.

aiomqtt answers paho's "I have something to write" with a thread-safe `add_writer`: a
wake-up byte through the loop's self-pipe, an epoll change to watch the socket, one more
loop turn for the writable event, and an epoll change to stop watching. That is per
burst of publishes, and a worker publishes a reply and acknowledges a request for every
call. Here the write happens at the end of the current loop turn instead, for every
packet queued in it (`call_soon`, no self-pipe); only a socket whose send buffer is full
is watched for writability, as before. Writing stays paho's (`loop_write`); this only
decides when.

paho tells through its public socket callbacks (`on_socket_register_write`,
`on_socket_unregister_write`), which this installs in place of aiomqtt's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING

import paho.mqtt.client as paho

if TYPE_CHECKING:
    from paho.mqtt.client import SocketLike

log = logging.getLogger("toolbus.transport")


class SocketWriter:
    """Writes one paho client's packets at the end of the loop turn that queued them."""

    def __init__(self, client: paho.Client) -> None:
        self._paho = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False  # a flush is queued for this loop turn
        self._watched: int | None = None  # the fd watched for writability (buffer full)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Before connecting: paho's write callbacks are ours from now on."""
        self._loop = loop
        self._paho.on_socket_register_write = self._wants_write
        self._paho.on_socket_unregister_write = self._written

    def _wants_write(self, client: paho.Client, userdata: object, sock: SocketLike) -> None:
        if self._scheduled:
            return
        self._scheduled = True
        assert self._loop is not None
        if _on_loop(self._loop):
            self._loop.call_soon(self._flush)
        else:  # paho's connect runs in a thread: the CONNECT packet is queued there
            self._loop.call_soon_threadsafe(self._flush)

    def _written(self, client: paho.Client, userdata: object, sock: SocketLike) -> None:
        """paho has nothing more to write, or closes the socket: stop watching it."""
        assert self._loop is not None
        if _on_loop(self._loop):
            self._unwatch()
        else:
            self._loop.call_soon_threadsafe(self._unwatch)

    def _flush(self) -> None:
        self._scheduled = False
        self._write()

    def _write(self) -> None:
        try:
            self._paho.loop_write()  # unregisters (`_written`) once everything is out
        except Exception:  # a broken socket: paho's next read sees the end, and it is lost
            log.exception("writing to the broker failed; dropping the connection")
            sock = self._paho.socket()
            if isinstance(sock, socket.socket):
                sock.shutdown(socket.SHUT_RDWR)
            return
        if self._paho.want_write():  # the send buffer is full: write when it drains
            self._watch()

    def _watch(self) -> None:
        sock = self._paho.socket()
        if self._watched is not None or sock is None:
            return
        assert self._loop is not None
        self._watched = sock.fileno()
        self._loop.add_writer(self._watched, self._write)

    def _unwatch(self) -> None:
        if self._watched is None:
            return
        assert self._loop is not None
        self._loop.remove_writer(self._watched)
        self._watched = None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # paho's connect thread
        return False
