"""The command line behind the shipped ACL (compose/mosquitto/acl: a password file and
`caller_identity = "topic"`), against a real mosquitto and a real `toolbus serve`, the
command line run as a subprocess:

- a request the ACL refuses (a caller whose command line was not told the workers take
  the caller from the topic, or a `--caller` that is not the login) fails at once, exit
  4, one line naming the topic and what to check: mosquitto answers the v5 PUBLISH
  with PUBACK 0x87, which the client ignored (it waited 32 s, then asked "is a worker
  running?");
- two `toolbus call` at once as one login (one client id, the login) take the session
  from each other: a bounded few lines and a clear outcome for each, not ~1,400 lines
  of "connection lost ... connecting again" in 3 s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.cli.test_cli_dynsec import env_of, login
from tests.project.test_broker_logins import CALLERS, PASSWORDS, SHIPPED
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, Serve
from toolbus.client.client import Client
from toolbus.wire.contracts import ErrorCode
from toolbus.wire.errors import Forbidden, RequestRefused
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_NO_REPLY, EXIT_OK

# The CLI's own start is most of it (Python, imports). Before: the call's whole deadline.
REFUSED_BOUND_S = 4.0
BOUND_S = 20.0  # any command here


def acl_broker(directory: Path) -> Broker:
    """mosquitto with the shipped ACL and a password file of its logins."""
    broker = Broker(directory, passwords=PASSWORDS | CALLERS, acl_file=SHIPPED / "acl")
    broker.start()
    return broker


@pytest.fixture(scope="module")
def acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = acl_broker(tmp_path_factory.mktemp("cli-acl"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest_asyncio.fixture(scope="module")
async def worker(acl: Broker) -> AsyncIterator[Serve]:
    """`toolbus serve` as the login `toolbus`, the caller taken from the topic."""
    async with Serve(env_of(PASSWORDS["toolbus"]), "--broker", login(acl, "toolbus")) as serve:
        watcher = Caller(acl.url, username="operator", password=PASSWORDS["operator"])
        async with watcher:
            await watcher.subscribe("toolbus/status/workers/+")
            async with asyncio.timeout(RUN_BOUND_S):
                while json.loads((await watcher.next_message()).payload)["state"] != "online":
                    pass
        yield serve


async def as_kitchen(broker: Broker, *args: str, **env: str) -> tuple[int, str, str, float]:
    """`toolbus ARGS` logged in as kitchen: exit code, stdout, stderr, seconds taken."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus",
        *args,
        "--broker",
        login(broker, "kitchen"),
        env=env_of(CALLERS["kitchen"], **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(BOUND_S):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


async def test_a_call_the_acl_refuses_fails_at_once(acl: Broker, worker: Serve) -> None:
    """Not told the caller is the topic's: `toolbus/call` with the caller in the body,
    which the ACL does not let kitchen publish. Refused on the broker's word, at once."""
    claim = {"TOOLBUS_CALLER_IDENTITY": "claim", "TOOLBUS_CLIENT_ID": "kitchen"}
    for args in (
        ("call", "echo", "text=hello", "--caller", "kitchen", "--timeout", "5"),
        ("tools", "--caller", "kitchen", "--timeout", "5"),
    ):
        code, out, err, took_s = await as_kitchen(acl, *args, **claim)
        assert code == EXIT_BROKER, err
        assert took_s < REFUSED_BOUND_S, (took_s, err)
        [line] = err.splitlines()
        assert "toolbus/call" in line or "toolbus/tools" in line  # the topic refused
        assert "TOOLBUS_CALLER_IDENTITY=topic" in line  # what to set
        assert out == ""

    # Told: the same caller, the same login, answered.
    code, out, err, _ = await as_kitchen(acl, "call", "echo", "text=hello", "--caller", "kitchen")
    assert code == EXIT_OK, err
    assert json.loads(out)["result"]["structured"]["text"] == "hello"


async def test_a_caller_that_is_not_the_login_is_refused_at_once(
    acl: Broker, worker: Serve
) -> None:
    """`--caller garage` as the login kitchen: the ACL lets kitchen neither publish as
    garage nor read garage's replies. Said at once, naming both."""
    code, _, err, took_s = await as_kitchen(
        acl, "call", "echo", "text=hi", "--caller", "garage", "--timeout", "5"
    )
    assert code == EXIT_BROKER, err
    assert took_s < REFUSED_BOUND_S, (took_s, err)
    [line] = err.splitlines()
    assert "garage" in line and "kitchen" in line


async def test_the_library_raises_request_refused(acl: Broker, worker: Serve) -> None:
    """`RequestRefused`, a `Forbidden` (wire code `forbidden`) the client raises itself:
    no reply, the topic and the broker's reason code in its details."""
    kitchen = acl.url.replace("mqtt://", f"mqtt://kitchen:{CALLERS['kitchen']}@")
    async with Client(kitchen, caller="kitchen", timeout_s=5) as client:
        with pytest.raises(RequestRefused) as refused:
            await client.call("echo", {"text": "hi"})
    error = refused.value
    assert isinstance(error, Forbidden) and error.code is ErrorCode.FORBIDDEN
    assert error.reply is None
    assert error.details == {"topic": "toolbus/call", "reason_code": 0x87}


async def test_two_calls_at_once_as_one_login(tmp_path: Path) -> None:
    """Both connect with the client id `kitchen` (the login, in topic mode) and take the
    session from each other; no worker answers, so both stay connected until one gives
    up. One is told, in one line, that another connection has its client id; the other
    keeps the session and waits out its deadline. mosquitto 2.0.11 closes a taken-over
    connection without a reason code; later ones send 0x8E."""
    broker = acl_broker(tmp_path)
    try:
        args = ["call", "echo", "text=hi", "--caller", "kitchen", "--no-worker-check"]
        args += ["--timeout", "2", "--attempts", "1"]
        first, second = await asyncio.gather(as_kitchen(broker, *args), as_kitchen(broker, *args))
    finally:
        broker.stop()
    outcomes = sorted([first, second])
    (survivor_code, _, survivor_err, _), (told_code, _, told_err, _) = outcomes
    assert (survivor_code, told_code) == (EXIT_NO_REPLY, EXIT_BROKER), outcomes
    # Before: ~1,400 lines of "broker connection lost ... connecting again" in 3 s.
    assert len(survivor_err.splitlines()) <= 3, survivor_err
    assert len(told_err.splitlines()) <= 3, told_err
    assert "--client-id" in told_err.splitlines()[-1]  # what to do
    assert "kitchen" in told_err.splitlines()[-1]  # the client id
