"""The benchmarks' private broker: one mosquitto on a free loopback port, per run.

`set_tcp_nodelay true` and `max_packet_size` as shipped; persistence off; in-flight and
queue limits raised far above any run's in-flight count, so the broker never throttles a
closed loop (its default of 20 QoS 1 messages in flight per client would cap 64). The
binary is the one on PATH, else /usr/sbin/mosquitto (where Debian puts it).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_BOUND_S = 10.0
STOP_BOUND_S = 10.0
MAX_INFLIGHT = 1000
MAX_QUEUED = 100_000
MAX_PACKET_BYTES = 8 * 1024 * 1024  # compose/mosquitto/mosquitto.conf's `max_packet_size`


@dataclass(frozen=True, slots=True)
class Broker:
    url: str
    pid: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary() -> str:
    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


@contextmanager
def private_broker(*, nodelay: bool = True) -> Iterator[Broker]:
    """A running mosquitto until the block ends; stopped within a bound. `nodelay`
    False leaves Nagle's algorithm on, as a broker without `set_tcp_nodelay` does."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="toolbus-broker-") as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"set_tcp_nodelay {'true' if nodelay else 'false'}\n"
            f"max_inflight_messages {MAX_INFLIGHT}\n"
            f"max_queued_messages {MAX_QUEUED}\n"
            f"max_packet_size {MAX_PACKET_BYTES}\n"
        )
        proc = subprocess.Popen(  # noqa: S603 -- our own binary and config
            [binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_listening(port, proc)
            yield Broker(f"mqtt://127.0.0.1:{port}", proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_BOUND_S)


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_BOUND_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("mosquitto did not start") from None
            time.sleep(0.02)  # polling a port that is not yet open: nothing to wait on
        else:
            return
