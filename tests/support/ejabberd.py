"""ejabberd nodes of our own: an MQTT 5 broker (`mod_mqtt`) that has no shared
subscriptions (its CONNACK says Shared Subscription Available 0), started with `erl`
directly (Debian's `ejabberdctl` runs it as the `ejabberd` user, from its own
directories), on a free loopback port, Erlang distribution bound to 127.0.0.1 too.

Clients log in anonymously (`anonymous_protocol: login_anon`: any user name and password
is let in), so the tests need no accounts. Installed by scripts/ensure-ejabberd; where it
could not be, the tests that need it skip and say why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.support.harness import START_TIMEOUT_S, free_port

CONFIG = """\
hosts:
  - localhost
loglevel: warning
auth_method: anonymous
anonymous_protocol: login_anon
listen:
  -
    port: {port}
    ip: "127.0.0.1"
    module: mod_mqtt
    backlog: 1000
modules:
  mod_mqtt:
    access_subscribe:
      "#": all
    access_publish:
      "#": all
"""
USER, PASSWORD = "toolbus", "anonymous"  # any pair logs in


def ejabberd_libs() -> Path | None:
    """Where Debian puts ejabberd's Erlang applications (None: not installed)."""
    found = sorted(Path("/usr/lib").glob("*/ejabberd-*/ebin/ejabberd.app"))
    if not found or shutil.which("erl") is None:
        return None
    return found[-1].parents[2]


def need_ejabberd() -> Path:
    libs = ejabberd_libs()
    if libs is None:
        pytest.skip("ejabberd is not installed (scripts/ensure-ejabberd could not install it)")
    return libs


class Ejabberd:
    """One ejabberd node on a free port; `url` is its MQTT listener."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.node = f"tb{uuid.uuid4().hex[:8]}@127.0.0.1"
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        libs = need_ejabberd()
        for sub in ("spool", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        config = self.root / "ejabberd.yml"
        config.write_text(CONFIG.format(port=self.port))
        env = {
            **os.environ,
            "ERL_LIBS": str(libs),
            "EJABBERD_CONFIG_PATH": str(config),
            "EJABBERD_LOG_PATH": str(self.root / "logs" / "ejabberd.log"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_CRASH_DUMP_BYTES": "0",
        }
        self.process = subprocess.Popen(
            [
                "erl",
                "-name",
                self.node,
                "-noshell",
                "-noinput",
                "-kernel",
                "inet_dist_use_interface",
                "{127,0,0,1}",
                "-mnesia",
                "dir",
                f'"{self.root / "spool"}"',
                "-s",
                "ejabberd",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        end = time.monotonic() + START_TIMEOUT_S * 2
        while True:  # polled, bounded: the listener is up
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            if self.process.poll() is not None or time.monotonic() > end:
                log = self.root / "logs" / "ejabberd.log"
                said = log.read_text()[-2000:] if log.exists() else ""
                pytest.fail(f"ejabberd did not start on {self.port}: {said}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGKILL the node's process group (the BEAM and what it started)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
