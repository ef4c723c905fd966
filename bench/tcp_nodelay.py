"""What the broker's `set_tcp_nodelay` costs a caller: sequential calls with it on and off.

Run: `make bench-nodelay` or `.venv/bin/python bench/tcp_nodelay.py [--calls N]`. For each
setting, a private mosquitto on a free loopback port (`set_tcp_nodelay true`, then
`false`) and an in-process worker with the built-in tools; `echo` called one call after
another, first on one kept `toolbus.Client` (TCP_NODELAY on the client's side, as every
toolbus client sets it), then with `mosquitto_rr` (one process, connection and reply
subscription per call, as docs/integrations.md shows), which leaves Nagle's algorithm on
unless given `--nodelay`. What the broker's setting changes is how soon the broker's own
small packets (the PUBACK, the reply) leave it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus import Client
from toolbus.config import Settings
from toolbus.tools import BUILTIN_TOOLS
from toolbus.wiring import build_worker

PREFIX = "toolbus"
RR_ARGUMENTS = '{"arguments": {"text": "hello"}}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def broker(port: int, nodelay: bool) -> Iterator[str]:
    """A mosquitto of our own on `port`, Nagle's algorithm as `nodelay` says."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "mosquitto.conf"
        config.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\n"
            f"set_tcp_nodelay {'true' if nodelay else 'false'}\npersistence false\n"
        )
        process = subprocess.Popen(
            [binary, "-c", str(config)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
        )
        try:
            assert process.stderr is not None
            while b" running" not in (line := process.stderr.readline()):
                if not line:
                    raise SystemExit(f"mosquitto did not start on {port}")
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=10)


async def kept(url: str, calls: int) -> list[float]:
    took: list[float] = []
    async with Client(url, prefix=PREFIX) as client:
        await client.call("echo", {"text": "warm"})
        for n in range(calls):
            started = time.perf_counter()
            await client.call("echo", {"text": str(n)})
            took.append((time.perf_counter() - started) * 1000)
    return took


async def rr(port: int, calls: int, *flags: str) -> list[float]:
    took: list[float] = []
    command = ["mosquitto_rr", "-p", str(port), "-q", "1", "-W", "10", *flags]
    command += ["-t", f"{PREFIX}/call/echo", "-e", f"{PREFIX}/reply/bench", "-m", RR_ARGUMENTS]
    for _ in range(calls):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.DEVNULL)
        if await process.wait() != 0:
            raise SystemExit(f"mosquitto_rr exited with {process.returncode}")
        took.append((time.perf_counter() - started) * 1000)
    return took


def line(label: str, took: list[float]) -> str:
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, round(len(ordered) * 0.99))]
    return f"{label:<45} p50 {statistics.median(took):6.2f} ms   p99 {p99:6.2f} ms"


async def measure(calls: int) -> list[str]:
    out = [f"{calls} sequential echo calls each, in-process worker, private mosquitto"]
    for nodelay in (True, False):
        port = free_port()
        with broker(port, nodelay) as url:
            settings = Settings.model_validate(
                {
                    "broker_url": url,
                    "topic_prefix": PREFIX,
                    "worker_id": "bench-nodelay",
                    "log_level": "WARNING",
                }
            )
            async with build_worker(settings, BUILTIN_TOOLS):
                setting = f"set_tcp_nodelay {'true' if nodelay else 'false'}"
                out.append(line(f"{setting}: one toolbus.Client", await kept(url, calls)))
                out.append(line(f"{setting}: mosquitto_rr", await rr(port, calls)))
                out.append(
                    line(f"{setting}: mosquitto_rr --nodelay", await rr(port, calls, "--nodelay"))
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    if shutil.which("mosquitto_rr") is None:
        raise SystemExit("mosquitto_rr not found: scripts/ensure-mosquitto --clients")
    print("\n".join(asyncio.run(measure(args.calls))))


if __name__ == "__main__":
    main()
