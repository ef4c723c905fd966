"""What `toolbus call` tells its user (issue 30.6), against a real broker and a real
`toolbus serve`, the command line run as a subprocess:

- no worker online, as the retained statuses say: exit 5 within about a second, nothing
  sent (it waited 32 s before);
- an error reply on a terminal: one line on stderr (`code: message`); `--json-reply`,
  or stdout not a terminal, the whole reply as JSON (as scripts have it);
- stdout closed before the reply is printed (`| head`): exit 141, nothing on stderr
  (it printed "Broken pipe" and exited 2, a usage error);
- `client.call("echo", "hi")`: a `TypeError` saying what to pass (an internal
  `ValueError` before).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pty
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.cli.test_cli import cli_env, run_cli
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, Serve
from toolbus.cli.ask import one_line
from toolbus.client.client import Client
from toolbus.wire.contracts import ErrorBody, ErrorCode, Reply
from toolbus.wire.errors import NoReply, NoWorker
from toolbus.worker.exit_codes import (
    EXIT_ERROR,
    EXIT_NO_REPLY,
    EXIT_NO_WORKER,
    EXIT_OK,
    EXIT_PIPE,
)

# The CLI's own start (Python, imports) is most of it; the statuses take well under 1 s.
# Before, 32 s (the 30 s deadline and its grace): bounded here so that it fails fast.
NO_WORKER_BOUND_S = 4.0


@pytest_asyncio.fixture(scope="module")
async def served(broker: Broker) -> AsyncIterator[str]:
    """A `toolbus serve` on a prefix of its own, online; the prefix."""
    prefix = f"oc{uuid.uuid4().hex[:8]}"
    async with Serve(cli_env(prefix), "--broker", broker.url):
        async with Caller(broker.url) as watcher:
            await watcher.subscribe(f"{prefix}/status/workers/+")
            async with asyncio.timeout(RUN_BOUND_S):
                while json.loads((await watcher.next_message()).payload)["state"] != "online":
                    pass
        yield prefix


async def timed_cli(*args: str, env: dict[str, str]) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolbus", *args, env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(NO_WORKER_BOUND_S * 2):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode(), time.monotonic() - started


async def test_no_worker_online_fails_fast_and_sends_nothing(broker: Broker) -> None:
    prefix = f"nw{uuid.uuid4().hex[:8]}"
    env = cli_env(prefix)
    async with Caller(broker.url) as watcher:
        await watcher.subscribe(f"{prefix}/call/#")
        await watcher.subscribe(f"{prefix}/tools/#")
        # No status at all (no worker ran here lately): none online.
        code, err, took_s = await timed_cli(
            "call", "echo", "text=hi", "--broker", broker.url, env=env
        )
        assert code == EXIT_NO_WORKER, err
        assert took_s < NO_WORKER_BOUND_S, took_s
        assert len(err.splitlines()) == 1, err
        code, err, took_s = await timed_cli("tools", "--broker", broker.url, env=env)
        assert (code, took_s < NO_WORKER_BOUND_S) == (EXIT_NO_WORKER, True), err

        # A worker's retained `offline` (its last will): named in the line.
        will = Properties(PacketTypes.PUBLISH)
        will.MessageExpiryInterval = 60
        offline = {"state": "offline", "worker_id": "w-gone", "since": None}
        status = f"{prefix}/status/workers/w-gone"
        await watcher.client.publish(
            status, json.dumps(offline), qos=1, retain=True, properties=will
        )
        try:
            code, err, took_s = await timed_cli(
                "call", "echo", "text=hi", "--broker", broker.url, env=env
            )
        finally:
            await watcher.client.publish(status, b"", qos=1, retain=True)
        assert code == EXIT_NO_WORKER, err
        assert took_s < NO_WORKER_BOUND_S, took_s
        assert "w-gone offline" in err
        # Nothing was published: the requests a broker holds for a worker's session
        # would run when it returns, after the user was told that nothing ran.
        assert watcher.messages.empty()


async def test_a_worker_coming_back_is_waited_for(broker: Broker) -> None:
    """A rolling restart: the old worker's retained status says `stopping` (or a clean
    stop's `offline`, seconds old), the new one is not online yet. The request is sent,
    for its re-sends to ride the restart out (on 043d827: exit 5 at once, nothing sent)."""
    now = datetime.now(UTC).isoformat()
    states = {f"cb{uuid.uuid4().hex[:8]}": state for state in ("stopping", "offline")}
    will = Properties(PacketTypes.PUBLISH)
    will.MessageExpiryInterval = 60
    async with Caller(broker.url) as watcher:
        for prefix, state in states.items():
            await watcher.subscribe(f"{prefix}/call/#")
            status = {"state": state, "worker_id": "w-old", "since": now}
            topic = f"{prefix}/status/workers/w-old"
            await watcher.client.publish(
                topic, json.dumps(status), qos=1, retain=True, properties=will
            )
        try:
            flags = ("--timeout", "1", "--attempts", "1")
            outcomes = await asyncio.gather(
                *(
                    timed_cli("call", "echo", "--broker", broker.url, *flags, env=cli_env(p))
                    for p in states
                )
            )
        finally:
            for prefix in states:
                await watcher.client.publish(
                    f"{prefix}/status/workers/w-old", b"", qos=1, retain=True
                )
        for code, err, _ in outcomes:
            assert code == EXIT_NO_REPLY, err  # sent and waited for; nobody answered here
        sent = {(await watcher.next_message()).topic.value for _ in states}
        assert sent == {f"{prefix}/call" for prefix in states}


async def test_an_error_reply_is_one_line_on_a_terminal(broker: Broker, served: str) -> None:
    env = cli_env(served)
    flags = ("call", "ecko", "text=hi", "--broker", broker.url)
    code, shown, err = await on_a_terminal(*flags, env=env)
    assert code == EXIT_ERROR, err
    assert shown == ""  # nothing on the terminal's stdout
    [line] = err.splitlines()
    assert line.startswith("toolbus: unknown_tool: ")

    # --json-reply: the whole reply, on the terminal too.
    code, shown, err = await on_a_terminal(*flags, "--json-reply", env=env)
    assert code == EXIT_ERROR, err
    assert json.loads(shown)["error"]["code"] == "unknown_tool"

    # Not a terminal: the whole reply, as scripts have always read it.
    code, out, err = await run_cli(*flags, env=env)
    assert code == EXIT_ERROR, err
    assert json.loads(out)["error"]["code"] == "unknown_tool"
    # A success is the reply as JSON on a terminal as well.
    code, shown, err = await on_a_terminal(
        "call", "echo", "text=hi", "--broker", broker.url, env=env
    )
    assert code == EXIT_OK, err
    assert json.loads(shown)["ok"] is True


async def on_a_terminal(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run the CLI with a pseudo-terminal as stdout: exit code, what the terminal
    showed, stderr (a pipe)."""
    main, tty = pty.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolbus",
            *args,
            env=env,
            stdout=tty,
            stderr=asyncio.subprocess.PIPE,
        )
        os.close(tty)
        tty = -1
        async with asyncio.timeout(RUN_BOUND_S):
            _, err = await proc.communicate()
        shown = b""
        while True:  # the child has exited: what it wrote is buffered in the terminal
            try:
                chunk = os.read(main, 65536)
            except OSError as exc:  # EIO: no more, the other end is closed
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(main)
        if tty >= 0:
            os.close(tty)
    assert proc.returncode is not None
    return proc.returncode, shown.decode().replace("\r\n", "\n"), err.decode()


async def test_a_reader_gone_early_ends_quietly(broker: Broker, served: str) -> None:
    """`toolbus call ... | head` with head gone before the reply: what a shell reports for
    a command SIGPIPE ended (141), and not a word (it was exit 2, a usage error)."""
    read_end, write_end = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "toolbus", "call", "echo", "text=hi", "--broker", broker.url),
            env=cli_env(served),
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
    finally:
        os.close(write_end)
        os.close(read_end)  # the reader is gone before anything is written
    async with asyncio.timeout(RUN_BOUND_S):
        _, err = await proc.communicate()
    assert proc.returncode == EXIT_PIPE, err
    assert err == b""


async def test_call_with_a_string_for_the_arguments_says_what_to_pass(
    broker: Broker, served: str
) -> None:
    async with Client(broker.url, prefix=served, timeout_s=10) as client:
        with pytest.raises(TypeError, match="mapping"):
            await client.call("echo", "hi")  # type: ignore[arg-type]  # the mistake tested
        reply = await client.call("echo", {"text": "hi"})
    assert reply.ok


async def test_the_library_fails_fast_only_when_asked(broker: Broker, served: str) -> None:
    """`Client(require_worker=True)`: `NoWorker` (a `NoReply`) on a prefix no worker has,
    within the bound; on the served one, the call goes. Off by default."""
    nobody = f"nw{uuid.uuid4().hex[:8]}"
    async with Client(broker.url, prefix=nobody, require_worker=True) as client:
        started = time.monotonic()
        with pytest.raises(NoWorker) as raised:
            await client.call("echo", {"text": "hi"})
        assert time.monotonic() - started < NO_WORKER_BOUND_S
    assert isinstance(raised.value, NoReply)
    assert raised.value.details == {"workers": 0}
    async with Client(broker.url, prefix=served, require_worker=True) as client:
        assert (await client.call("echo", {"text": "hi"})).ok


def test_one_line_says_when_to_send_again() -> None:
    limited = Reply(
        id="r1",
        ok=False,
        duration_ms=1.0,
        error=ErrorBody(
            code=ErrorCode.RATE_LIMITED, message="over quota", details={"retry_after_ms": 1500}
        ),
    )
    line = one_line(limited, "--json-reply")
    assert line == "rate_limited: over quota (retry after 1.5 s; --json-reply for the whole reply)"
