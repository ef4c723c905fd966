"""ejabberd nodes of our own: an MQTT 5 broker (`mod_mqtt`) that has no shared
subscriptions (its CONNACK says Shared Subscription Available 0), started with `erl`
directly (Debian's `ejabberdctl` runs it as the `ejabberd` user, from its own
directories), on a free loopback port, Erlang distribution bound to 127.0.0.1 too.

Clients log in anonymously (`anonymous_protocol: login_anon`: any user name and password
is let in), so the tests need no accounts. Installed by scripts/ensure-ejabberd; where it
could not be, the tests that need it skip and say why.

Two nodes of one cookie form a cluster (`cluster`): the second joins the first through
`ejabberd_admin:join_cluster`, called from a short-lived Erlang node of the same cookie
(`ejabberdctl` would run as the `ejabberd` user). A node SIGKILLed and started again keeps
its name, port and spool, so mnesia brings it back into the cluster by itself.
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
from collections.abc import Iterator
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


def erl(node: str, cookie: str) -> list[str]:
    """An Erlang node's command line: its name and cookie, no shell, distribution on
    127.0.0.1 only (the ejabberd nodes and the short-lived ones that call into them)."""
    return [
        *("erl", "-name", node, "-setcookie", cookie, "-noshell", "-noinput"),
        *("-kernel", "inet_dist_use_interface", "{127,0,0,1}"),
    ]


class Ejabberd:
    """One ejabberd node on a free port; `url` is its MQTT listener."""

    def __init__(self, root: Path, cookie: str | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.node = f"tb{uuid.uuid4().hex[:8]}@127.0.0.1"
        # Nodes of one cluster share it; a node alone gets its own.
        self.cookie = cookie or uuid.uuid4().hex
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Started (again, after `stop`: the same node name, port and spool, so a node of a
        cluster rejoins it) and its MQTT listener answering."""
        self.launch()
        self.wait_listening()

    def launch(self) -> None:
        """Its process started; `wait_listening` for the listener (nodes start together)."""
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
                *erl(self.node, self.cookie),
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

    def wait_listening(self) -> None:
        """Until the MQTT listener takes a connection (bounded)."""
        assert self.process is not None
        end = time.monotonic() + START_TIMEOUT_S * 2
        while True:  # polled, bounded: the listener is up
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            if self.process.poll() is not None or time.monotonic() > end:
                pytest.fail(f"ejabberd did not listen on {self.port}: {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self) -> str:
        log = self.root / "logs" / "ejabberd.log"
        return log.read_text()[-2000:] if log.exists() else ""

    def rpc(self, module: str, function: str, args: str) -> str:
        """`module:function(args)` on this node (`args`: an Erlang list, as text), from a
        short-lived node of the same cookie; the result as Erlang prints it (`~p`)."""
        code = (
            f"R = rpc:call('{self.node}', {module}, {function}, {args}, 60000), "
            'io:format("~p~n", [R]), halt(0).'
        )
        done = subprocess.run(
            [
                *erl(f"ctl{uuid.uuid4().hex[:8]}@127.0.0.1", self.cookie),
                "-eval",
                code,
            ],
            env={**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_CRASH_DUMP_BYTES": "0"},
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S * 4,
            check=True,
        )
        return done.stdout.strip()

    def join(self, first: Ejabberd) -> None:
        """Join `first`'s cluster. ejabberd stops its app here, copies mnesia from
        `first` and starts it again: the listener goes away and comes back (waited for)."""
        said = self.rpc("ejabberd_admin", "join_cluster", f'[<<"{first.node}">>]')
        if said != "ok":
            pytest.fail(f"{self.node} did not join {first.node}: {said} {self.log_tail()}")
        self.wait_listening()

    def in_cluster_with(self, other: Ejabberd) -> bool:
        """mnesia on this node runs together with `other`'s."""
        return f"'{other.node}'" in self.rpc("mnesia", "system_info", "[running_db_nodes]")

    def stop(self) -> None:
        """SIGKILL the node's process group (the BEAM and what it started)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@contextlib.contextmanager
def cluster(root: Path, size: int = 2) -> Iterator[list[Ejabberd]]:
    """`size` ejabberd nodes of one cookie, the others joined to the first; all killed at
    the end. A message published on one reaches a subscriber on another with its MQTT 5
    properties (Response Topic, Correlation Data) intact."""
    cookie = uuid.uuid4().hex
    nodes = [Ejabberd(root / f"node{n + 1}", cookie) for n in range(size)]
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_listening()
        for node in nodes[1:]:
            node.join(nodes[0])
        yield nodes
    finally:
        for node in nodes:
            node.stop()
