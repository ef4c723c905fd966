"""Redis as production replicates it, of our own on free loopback ports: a primary, a
replica and three Sentinels (`redis-server --sentinel`), or a three-node Redis Cluster
(`redis-server --cluster-enabled yes`, slots assigned with `redis-cli --cluster create`).

Each process is a real redis-server; readiness is its own log line or a bounded poll.
Nothing is saved to disk beyond the config files Sentinel and Cluster must write.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.harness import START_TIMEOUT_S, free_port

SERVICE = "tbprimary"
BINARY = shutil.which("redis-server") or "/usr/bin/redis-server"
CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


class Node:
    """One redis-server process (server or Sentinel) on its own port."""

    def __init__(self, directory: Path, *arguments: str, sentinel: bool = False) -> None:
        self.port = free_port()
        self.directory = directory / str(self.port)
        self.arguments, self.sentinel = arguments, sentinel
        self.process: subprocess.Popen[bytes] | None = None
        self._lines: list[bytes] = []
        self._seen = threading.Condition()

    def start(self, ready: bytes = b"Ready to accept connections") -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "redis.conf"
        if not config.exists():  # a restart keeps what Sentinel or Cluster wrote there
            config.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n")
        command = [BINARY, str(config), "--save", "", "--appendonly", "no", *self.arguments]
        if self.sentinel:
            command = [BINARY, str(config), "--sentinel", *self.arguments]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"redis-{self.port}")
        self._reader.start()
        self.wait_for(ready)

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.process.stdout:  # closed at the process's end (no unclosed pipe left)
            for line in self.process.stdout:
                with self._seen:
                    self._lines.append(line)
                    self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, text: bytes, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the process has logged `text` (bounded; fails the test otherwise)."""
        with self._seen:
            if not self._seen.wait_for(
                lambda: (
                    any(text in line for line in self._lines)
                    or (self.process is not None and self.process.poll() is not None)
                ),
                timeout_s,
            ) or not any(text in line for line in self._lines):
                said = b"".join(self._lines[-20:]).decode(errors="replace")
                pytest.fail(f"redis {self.port} never said {text!r}: {said}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)
            self._reader.join(timeout=10)

    def cli(self, *command: str) -> str:
        done = subprocess.run(
            [CLI, "-p", str(self.port), *command],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.stdout


class Sentinels:
    """A primary, one replica and three Sentinels watching them (quorum 2, a primary
    unreachable for 1 s is failed over); `url` is the `redis+sentinel://` store URL."""

    def __init__(self, directory: Path) -> None:
        self.primary = Node(directory)
        self.replica = Node(directory, "--replicaof", "127.0.0.1", str(self.primary.port))
        self.sentinels = [Node(directory, sentinel=True) for _ in range(3)]
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        self.url = f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self) -> None:
        self.primary.start()
        self.replica.start(b"MASTER <-> REPLICA sync: Finished with success")
        for sentinel in self.sentinels:
            sentinel.directory.mkdir(parents=True, exist_ok=True)
            (sentinel.directory / "redis.conf").write_text(
                f"port {sentinel.port}\nbind 127.0.0.1\ndir {sentinel.directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
            )
            sentinel.start(b"+monitor master")
        for sentinel in self.sentinels:  # each knows the replica, and the others
            sentinel.wait_for(b"+slave slave")
            sentinel.wait_for(b"+sentinel sentinel")

    def fail_over(self) -> None:
        """SIGKILL the primary; returns once a Sentinel has switched to the replica."""
        self.primary.kill()
        self.sentinels[0].wait_for(b"+switch-master", timeout_s=30.0)

    def stop(self) -> None:
        for node in (*self.sentinels, self.replica, self.primary):
            node.kill()


class Cluster:
    """Three primaries sharing the 16384 slots; `url` is the `redis+cluster://` URL."""

    def __init__(self, directory: Path) -> None:
        # The bus port named (by default the port + 10000, past 65535 for a high port).
        self.nodes = [
            Node(
                directory,
                *("--cluster-enabled", "yes", "--cluster-node-timeout", "2000"),
                *("--cluster-port", str(free_port())),
            )
            for _ in range(3)
        ]
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [CLI, "--cluster", "create", *addresses, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        end = time.monotonic() + START_TIMEOUT_S
        while "cluster_state:ok" not in self.nodes[0].cli("cluster", "info"):
            if time.monotonic() > end:  # polled, bounded: every node agrees on the slots
                pytest.fail(f"the cluster did not settle: {self.nodes[0].cli('cluster', 'info')}")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()
